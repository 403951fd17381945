"""MLflow tracking of training and evaluation, as MLflow users expect it.

Training: the run is opened before the first step (params, tags, the dataset as an input), the
trainer's logs are streamed into it step by step (`MlflowMetricsCallback`: live curves in the
UI while GRPO runs), and it is closed with the final metrics and the measurement ids. TRL's own
MLflow callback is not used (report_to="none"): it logs to whatever run is active in the
process, while here every call names its run and tracking URI.

Evaluation: one run per dataset version; each forecaster's scores are logged against its model
(`mlflow.log_metrics(..., model_id=..., dataset=...)`): a registered version's LoggedModel, or,
for the reference forecasters (uniform, bin prior, oracle), an external LoggedModel of that name.
Metric names stay plain (`brier`, `ece`, ...): the model and the eval dataset are links, not
parts of the name.

This module never imports dagster; the tracking URI is a plain string.
"""

from __future__ import annotations

import logging
import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

log = logging.getLogger(__name__)

EVAL_METRICS = ("brier", "crps", "nll", "accuracy", "ece", "aurc", "recovered_mean", "recovered_at_10",
                "within_20", "parse_rate")
_SKIP_KEYS = ("step", "epoch")


def _client(tracking_uri: str):
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(tracking_uri)
    return MlflowClient(tracking_uri)


def step_metrics(logs: Mapping[str, Any], step: int) -> list[Any]:
    """MLflow Metric entities of one trainer log line (finite numbers only).

    >>> [(m.key, m.value, m.step) for m in step_metrics({"loss": 0.5, "epoch": 1.0, "x": float("nan")}, 3)]
    [('loss', 0.5, 3)]
    """
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    return [Metric(k, float(v), now, int(step)) for k, v in logs.items()
            if k not in _SKIP_KEYS and isinstance(v, (int, float)) and math.isfinite(float(v))]


class MlflowMetricsCallback(TrainerCallback):
    """Streams every trainer log line (loss, rewards, frac_reward_zero_std, ...) into one run."""

    def __init__(self, tracking_uri: str, run_id: str) -> None:
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.logged = 0  # log lines sent, for tests and reports

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
        metrics = step_metrics(logs or {}, state.global_step)
        if metrics:
            _client(self.tracking_uri).log_batch(self.run_id, metrics=metrics)
            self.logged += 1
        return control


def mlflow_experiment(client: Any, tracking_uri: str, name: str) -> str:
    """The experiment id of `name`, created if missing. For a sqlite store its artifacts go
    beside the database file (not ./mlruns in whatever directory the process runs from)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None
    if tracking_uri.startswith("sqlite:///"):
        location = (Path(tracking_uri[len("sqlite:///"):]).parent / "mlartifacts").resolve().as_uri()
    return client.create_experiment(name, artifact_location=location)


def _dataset_source_class():
    from mlflow.data.dataset_source import DatasetSource

    class _DuckDBPairsSource(DatasetSource):
        """The pairs table of one dataset version in the kernelcast warehouse."""

        def __init__(self, dataset_version: str) -> None:
            self.dataset_version = dataset_version

        @staticmethod
        def _get_source_type() -> str:
            return "duckdb"

        def load(self, **kwargs: Any) -> str:
            return self.uri

        @property
        def uri(self) -> str:
            return f"duckdb:pairs@{self.dataset_version}"

        @staticmethod
        def _can_resolve(raw_source: Any) -> bool:
            return isinstance(raw_source, str) and raw_source.startswith("duckdb:pairs@")

        @classmethod
        def _resolve(cls, raw_source: Any) -> _DuckDBPairsSource:
            return cls(str(raw_source).split("@", 1)[1])

        def to_dict(self) -> dict[str, Any]:
            return {"uri": self.uri}

        @classmethod
        def from_dict(cls, source_dict: dict[Any, Any]) -> _DuckDBPairsSource:
            return cls._resolve(source_dict["uri"])

    return _DuckDBPairsSource


def DuckDBPairsSource(dataset_version: str) -> Any:  # noqa: N802 - reads as a class at call sites
    """An MLflow dataset source naming `duckdb:pairs@<dataset_version>`."""
    return _dataset_source_class()(dataset_version)


def pairs_dataset(pair_ids: Sequence[str], true_bins: Sequence[int], dataset_version: str, split: str):
    """An MLflow dataset of the pairs of one split of a dataset version (the pairs table in DuckDB)."""
    import mlflow
    import pandas as pd

    frame = pd.DataFrame({"pair_id": list(pair_ids), "true_bin": list(true_bins)})
    name = dataset_version if split == "train" else f"{dataset_version}-{split}"
    # MLflow stores at most 36 characters of a digest.
    return mlflow.data.from_pandas(frame, source=DuckDBPairsSource(dataset_version), name=name,
                                   digest=(f"duckdb:pairs@{dataset_version}" + ("" if split == "train" else f":{split}"))[:36])


def start_training_run(
    tracking_uri: str,
    experiment: str,
    params: Mapping[str, str],
    tags: Mapping[str, str],
    rows: Sequence[Mapping[str, Any]],
    dataset_version: str | None,
    run_name: str = "grpo",
) -> str:
    """Open the training run (status RUNNING) with params, tags and the training pairs as input.

    Args:
        tracking_uri: MLflow tracking URI.
        experiment: experiment name (created beside the store when missing).
        params: the resolved settings, flat strings.
        tags: run tags (dataset_version, base_model, git_commit, dagster_run_id, ...).
        rows: training rows (pair_id, true_bin), logged as the dataset input.
        dataset_version: the warehouse dataset version the rows come from.
        run_name: the run's name.
    Returns:
        The run id.
    """
    from mlflow.entities import DatasetInput, InputTag, Param, RunTag

    client = _client(tracking_uri)
    run = client.create_run(mlflow_experiment(client, tracking_uri, experiment), tags=dict(tags), run_name=run_name)
    run_id = run.info.run_id
    try:
        client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()],
                         tags=[RunTag("kernelcast.stage", "training")])
        dataset = pairs_dataset([r["pair_id"] for r in rows], [r["true_bin"] for r in rows],
                                dataset_version or "unversioned", "train")
        # Through the client: `mlflow.start_run(run_id=...)` would end the run on leaving it,
        # and the run must stay RUNNING while the trainer streams into it.
        client.log_inputs(run_id, datasets=[DatasetInput(dataset._to_mlflow_entity(),
                                                         tags=[InputTag("mlflow.data.context", "training")])])
    except Exception:
        client.set_terminated(run_id, "FAILED")
        raise
    return run_id


def log_sft_losses(tracking_uri: str, run_id: str, sft_losses: Sequence[float]) -> None:
    """The format warm-up's per-step losses as the curve `sft/loss`."""
    from mlflow.entities import Metric

    batch = [Metric("sft/loss", float(v), 0, i) for i, v in enumerate(sft_losses) if math.isfinite(v)]
    for start in range(0, len(batch), 900):  # MLflow accepts at most 1000 metrics per batch
        _client(tracking_uri).log_batch(run_id, metrics=batch[start : start + 900])


def finish_training_run(
    tracking_uri: str,
    run_id: str,
    metrics: Mapping[str, float],
    measurement_ids: Sequence[str] | None,
    status: str = "FINISHED",
) -> None:
    """Close the run: final metrics (at step 0), the measurement ids artifact, the status."""
    from mlflow.entities import Metric

    client = _client(tracking_uri)
    final = [Metric(k, float(v), 0, 0) for k, v in metrics.items() if math.isfinite(float(v))]
    if final:
        client.log_batch(run_id, metrics=final)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "measurement_ids.txt"
        path.write_text("".join(f"{m}\n" for m in (measurement_ids or [])))
        client.log_artifact(run_id, str(path))
    client.set_terminated(run_id, status)


def log_evaluation(
    tracking_uri: str,
    experiment_id: str,
    results: Mapping[str, Mapping[str, Any]],
    dataset_version: str,
    eval_pairs: Sequence[str],
    eval_bins: Sequence[int],
    model_ids: Mapping[str, str],
    tags: Mapping[str, str],
    report_dir: str | Path | None = None,
) -> str:
    """One evaluation run; every forecaster's scores logged against its model and the eval pairs.

    Args:
        tracking_uri: MLflow tracking URI.
        experiment_id: the evaluation experiment.
        results: forecaster (model_ref) -> its metrics (`pipelines.evaluation.suite.evaluate_models`).
        dataset_version: the dataset version evaluated.
        eval_pairs, eval_bins: the eval pairs (ids, true bins), logged as the run's dataset.
        model_ids: model_ref -> LoggedModel id of registered versions; any other forecaster
            gets an external LoggedModel named after it (created once, then re-used).
        tags: run tags (dagster_run_id, dataset_version, ...).
        report_dir: a folder logged as the artifact `report`.
    Returns:
        The run id.
    """
    import mlflow

    _client(tracking_uri)
    dataset = pairs_dataset(eval_pairs, eval_bins, dataset_version, "eval")
    with mlflow.start_run(experiment_id=experiment_id, run_name=f"evaluation-{dataset_version}") as run:
        mlflow.set_tags(dict(tags))
        mlflow.log_input(dataset, context="evaluation")
        for ref, r in results.items():
            values = {k: float(r[k]) for k in EVAL_METRICS if isinstance(r.get(k), (int, float))
                      and math.isfinite(float(r[k]))}
            if not values:
                continue
            model_id = model_ids.get(ref) or _external_model(experiment_id, ref)
            mlflow.log_metrics(values, model_id=model_id, dataset=dataset)
        if report_dir is not None:
            mlflow.log_artifacts(str(report_dir), artifact_path="report")
    return run.info.run_id


def _external_model(experiment_id: str, model_ref: str) -> str:
    """The id of the external LoggedModel standing for a forecaster that is not an MLflow model."""
    import mlflow

    name = model_ref.replace(":", "-").replace("/", "-")
    found = mlflow.search_logged_models(experiment_ids=[experiment_id], filter_string=f"name = '{name}'",
                                        output_format="list", max_results=1)
    if found:
        return found[0].model_id
    # in the evaluation experiment: the default one keeps its artifacts in ./mlruns of whatever
    # directory the process runs from
    return mlflow.create_external_model(name=name, model_type="reference-forecaster", tags={"model_ref": model_ref},
                                        experiment_id=experiment_id).model_id
