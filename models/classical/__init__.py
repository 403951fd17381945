"""Classical forecasters: cost models that give the same eight-bin Forecast as the LLM surrogate.

- `cost_model` (models.classical.cost_model.CostModel): gradient-boosted regression over
  kernel features (task, family, knobs, sm_90 compile features, source counts);
- `text_model` (models.classical.text_model.TextModel): token n-grams of both sources and a
  multinomial logistic regression; reads any kernel, LLM-written ones included;
- `ensemble` (models.classical.ensemble.EnsembleModel): the equal-weight mean of the fitted
  cost and text models and the bin prior, composed after they are fitted (never fitted itself).

Both train in seconds on a CPU, are calibrated on the calibration split, are logged to MLflow
with the sklearn flavour (models.classical.registry) and are references the LLM must beat;
they may also be champions.
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use (PEP 562): models.classical.features, .spread and .portable must load on
# a GPU host that has numpy and pandas but no scikit-learn or scipy.
_LAZY = {"BinClassifier": "models.classical.base", "CostModel": "models.classical.cost_model",
         "TextModel": "models.classical.text_model", "EnsembleModel": "models.classical.ensemble"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "KINDS":
        return {"cost_model": __getattr__("CostModel"), "text_model": __getattr__("TextModel")}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_classical(kind: str, **params: Any) -> Any:
    """An untrained classical forecaster of `kind` ('cost_model' or 'text_model')."""
    kinds = __getattr__("KINDS")
    if kind not in kinds:
        raise ValueError(f"unknown classical forecaster {kind!r}; use one of {', '.join(kinds)}")
    return kinds[kind](**params)


# Kinds composed from fitted members rather than fitted (pipelines.surrogates.classical).
COMPOSED_KINDS = ("ensemble",)

__all__ = ["COMPOSED_KINDS", "KINDS", "BinClassifier", "CostModel", "EnsembleModel", "TextModel", "make_classical"]
