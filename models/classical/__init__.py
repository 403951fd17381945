"""Classical forecasters: cost models that give the same eight-bin Forecast as the LLM surrogate.

- `cost_model` (models.classical.cost_model.CostModel): gradient-boosted regression over
  kernel features (task, family, knobs, sm_90 compile features, source counts);
- `text_model` (models.classical.text_model.TextModel): token n-grams of both sources and a
  multinomial logistic regression; reads any kernel, LLM-written ones included.

Both train in seconds on a CPU, are calibrated on the calibration split, are logged to MLflow
with the sklearn flavour (models.classical.registry) and are references the LLM must beat;
they may also be champions.
"""

from __future__ import annotations

from typing import Any

from models.classical.base import BinForecaster
from models.classical.cost_model import CostModel
from models.classical.text_model import TextModel

KINDS: dict[str, type[BinForecaster]] = {"cost_model": CostModel, "text_model": TextModel}


def make_classical(kind: str, **params: Any) -> BinForecaster:
    """An untrained classical forecaster of `kind` ('cost_model' or 'text_model')."""
    if kind not in KINDS:
        raise ValueError(f"unknown classical forecaster {kind!r}; use one of {', '.join(KINDS)}")
    return KINDS[kind](**params)


__all__ = ["KINDS", "BinForecaster", "CostModel", "TextModel", "make_classical"]
