"""Classical forecasters in the MLflow registry: log, register, load.

A classical model is logged in a run of the experiment `kernelcast-training` and registered as a
version of the surrogate's registered model with the tags `kind` (cost_model / text_model /
ensemble), `split`, `dataset_version` and `trained_dataset_version` (the same: it is fitted
here), and a `model_lineage` row, like the LLM. Its run holds what it learned from, as every
training run does (`models.registry.tracking.log_training_data`): its fit pairs as the input
dataset, `measurement_ids.txt` (the measurements behind its fit pairs) and
`calibration_measurement_ids.txt` (behind its calibration pairs), and what the fit measured
(fit and calibration sizes, calibration Brier and NLL before and after calibrating).

What is logged is chosen by the caller (`model_logger`): the product logs a pyfunc model that
answers kernel sources (pipelines.forecasting.pyfunc), whose artifacts hold the fitted model as
an MLflow sklearn model folder (`save_classical`); without a logger, the sklearn model itself is
logged (pair frame in, (n, 8) probabilities out). `load_classical` reads either back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from models.classical.base import BinClassifier

log = logging.getLogger(__name__)

EXPERIMENT = "kernelcast-training"
MODEL_ARTIFACT = "model"


def log_classical(
    model: BinClassifier,
    tracking_uri: str,
    example: pd.DataFrame,
    name: str,
    dataset_version: str,
    split: str,
    metrics: Mapping[str, float] | None = None,
    tags: Mapping[str, str] | None = None,
    params: Mapping[str, Any] | None = None,
    measurement_ids: list[str] | None = None,
    training_pairs: pd.DataFrame | None = None,
    model_logger: Callable[[BinClassifier, pd.DataFrame], Any] | None = None,
    calibration_measurement_ids: list[str] | None = None,
) -> tuple[str, int]:
    """Log `model` in a new MLflow run and register it as a new version of `name`.

    Args:
        model: a fitted, calibrated classical forecaster.
        tracking_uri: MLflow tracking (and registry) URI.
        example: a few rows of its input (pair frame), for the signature and input example.
        name: registered model name.
        dataset_version: the dataset version it learned from.
        split: "in_distribution" or "held_out_task".
        metrics: training/calibration figures to log (calibration Brier, fit seconds, ...).
        tags: extra run and version tags (e.g. dagster_run_id, git_commit).
        params: its hyper-parameters (default: `model.get_params()`).
        measurement_ids: the measurements behind its fit pairs (an artifact, and the logged
            dataset when `training_pairs` is not given).
        training_pairs: its fit pairs (pair_id, true_bin): the logged dataset when given.
        model_logger: (model, example) -> MLflow's ModelInfo, called inside the run: what is
            logged (default: the sklearn model, `_log_sklearn`).
        calibration_measurement_ids: the measurements behind its calibration pairs (an artifact).
    Returns:
        (run id, version number).
    """
    import mlflow

    from models.registry.tracking import (
        TRAINED_TAG,
        log_training_data,
        mlflow_experiment,
        open_store,
    )

    open_store(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    client = mlflow.MlflowClient(tracking_uri, registry_uri=tracking_uri)
    experiment_id = mlflow_experiment(client, tracking_uri, EXPERIMENT)
    version_tags = {"kind": model.kind, "split": split, "dataset_version": dataset_version, TRAINED_TAG: dataset_version,
                    "calibrator": str(model.calibrator_.to_dict()), **{k: str(v) for k, v in (tags or {}).items()}}
    with mlflow.start_run(experiment_id=experiment_id, run_name=f"{model.kind}-{split}") as run:
        mlflow.set_tags({**version_tags, "kernelcast.stage": "training"})
        mlflow.log_params({k: str(v) for k, v in (params or model.get_params()).items()})
        if metrics:
            mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
        log_training_data(tracking_uri, run.info.run_id, dataset_version, measurement_ids, training_pairs,
                          calibration_measurement_ids=calibration_measurement_ids)
        info = (model_logger or _log_sklearn)(model, example)
        run_id = run.info.run_id
    from models.registry.versions import register_logged_model

    t0 = time.perf_counter()
    version = register_logged_model(tracking_uri, info.model_uri, name, run_id=run_id, kind=model.kind,
                                    tags={k: v for k, v in version_tags.items() if k != "kind"},
                                    description=f"{model.kind} ({split}), dataset {dataset_version}")
    log.info("registered %s version %s (%s, %s) in %.1f s", name, version, model.kind, split,
             time.perf_counter() - t0)
    return run_id, version


def _sklearn_args(model: BinClassifier, example: pd.DataFrame) -> dict[str, Any]:
    """What MLflow's sklearn flavour needs to store `model`: its signature over the pair frame,
    the pinned requirements and the types skops may load back."""
    import sklearn
    import skops.io
    from mlflow.models import infer_signature

    # MLflow stores sklearn models with skops, which loads only types it is told to trust: ours
    # (the forecaster, its feature space and calibrator) and the scikit-learn pieces they hold.
    # They are listed from the model itself, since this process built it.
    trusted = skops.io.get_untrusted_types(data=skops.io.dumps(model))
    return {"signature": infer_signature(example, model.predict_proba(example)),
            # the environment is this project's; naming it skips a slow pip inference
            "pip_requirements": [f"scikit-learn=={sklearn.__version__}", f"pandas=={pd.__version__}"],
            "pyfunc_predict_fn": "predict_proba", "skops_trusted_types": trusted}


def _log_sklearn(model: BinClassifier, example: pd.DataFrame) -> Any:
    """Log `model` as an MLflow sklearn model of the active run (pair frame in)."""
    import mlflow

    return mlflow.sklearn.log_model(sk_model=model, name=MODEL_ARTIFACT, input_example=example.head(2),
                                    **_sklearn_args(model, example))


def save_classical(model: BinClassifier, path: str | Path, example: pd.DataFrame) -> Path:
    """`model` as an MLflow sklearn model folder at `path` (the artifact a pyfunc model of
    sources holds; `load_classical` and `mlflow.sklearn.load_model(path)` read it back)."""
    import mlflow

    mlflow.sklearn.save_model(model, str(path), **_sklearn_args(model, example))
    return Path(path)


def import_serializer() -> None:
    """Import skops.io, MLflow's serializer of these models, ahead of the language-model libraries.

    Why: on its first import skops looks up the module of each of scipy.special's ~230 ufuncs in
    every loaded module, and a lookup on one of transformers' lazy modules imports submodules of
    it. Imported after transformers, that scan takes seconds (docs/results/operations.md);
    before it, well under one. A process that will both load a language
    model and log or load classical models (`kernelcast run`) calls this first.
    """
    import skops.io  # noqa: F401


def load_classical(tracking_uri: str, name: str, version: int | str) -> BinClassifier:
    """The registered classical forecaster `name`/`version`: the sklearn model itself, or the one a
    pyfunc model of sources holds as its artifact `model`.

    Raises:
        ValueError: the version holds no classical model (one line).
    """
    import tempfile

    import mlflow
    from mlflow.models import Model

    from models.registry.tracking import open_store

    open_store(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    # Only the description and the classical model come down, not the code a pyfunc model carries.
    root = mlflow.MlflowClient(tracking_uri, registry_uri=tracking_uri).get_model_version_download_uri(name, str(version))
    with tempfile.TemporaryDirectory(prefix="kernelcast-classical-") as tmp:
        described = mlflow.artifacts.download_artifacts(artifact_uri=f"{root.rstrip('/')}/MLmodel", dst_path=tmp,
                                                        tracking_uri=tracking_uri)
        flavors = Model.load(described).flavors
        if "sklearn" in flavors:
            return mlflow.sklearn.load_model(root)
        held = ((flavors.get("python_function") or {}).get("artifacts") or {}).get(MODEL_ARTIFACT) or {}
        if not held.get("path"):
            raise ValueError(f"models:/{name}/{version} holds no classical model (flavours: {', '.join(flavors)})")
        return mlflow.sklearn.load_model(f"{root.rstrip('/')}/{held['path']}")
