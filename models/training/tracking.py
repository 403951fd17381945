"""The MLflow run of a training call: where it is logged (`RunTracking`), its params and tags,
and its lifecycle (`TrainingRun`: opened before the warm-up, streamed into during GRPO, closed
at the end). The MLflow calls themselves are models.registry.tracking's.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from models.training.settings import TrainingSettings

DEFAULT_EXPERIMENT = "kernelcast-training"


@dataclass(frozen=True)
class RunTracking:
    """Where a training run is logged and what it is logged against.

    Attributes:
        tracking_uri: MLflow tracking URI (e.g. "sqlite:///.../mlflow.db").
        experiment: MLflow experiment name.
        dataset_version: the warehouse dataset version the rows come from.
        measurement_ids: the measurements behind its training pairs (logged as an artifact;
            warehouse.datasets.pair_measurement_ids).
        tags: extra run tags (e.g. {"dagster_run_id": ...}).
    """

    tracking_uri: str
    experiment: str = DEFAULT_EXPERIMENT
    dataset_version: str | None = None
    measurement_ids: Sequence[str] | None = None
    tags: Mapping[str, str] = field(default_factory=dict)


def git_commit() -> str | None:
    """`git rev-parse HEAD` of the working directory, or None outside a repository."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


class TrainingRun:
    """The MLflow run of one train_grpo call: opened before the warm-up, streamed into during
    GRPO (models.training.callbacks.MlflowMetricsCallback), closed at the end. Inert without tracking."""

    def __init__(self, tracking: RunTracking | None, settings: TrainingSettings) -> None:
        self.tracking, self.settings = tracking, settings
        self.run_id: str | None = None  # while the run is open
        self.closed_run_id: str | None = None

    def open(self, rows: Sequence[dict[str, Any]]) -> None:
        from models.training.data_parallel import is_main_process

        if self.tracking is None or not self.tracking.tracking_uri or not is_main_process():
            return  # under `accelerate launch` one process logs the run, not one per GPU
        from models.registry.tracking import start_training_run

        t = self.tracking
        self.run_id = start_training_run(t.tracking_uri, t.experiment, self.params(rows), self.tags(), rows,
                                         t.dataset_version)

    def params(self, rows: Sequence[dict[str, Any]]) -> dict[str, str]:
        """The resolved settings, the dataset version and the number of rows trained on."""
        version = self.tracking.dataset_version if self.tracking else None
        return {**self.settings.as_params(), "dataset_version": version or "", "train_rows": str(len(rows))}

    def tags(self) -> dict[str, str]:
        """dataset_version, base_model, git_commit, then the settings' and the caller's tags."""
        version, extra = (self.tracking.dataset_version, self.tracking.tags) if self.tracking else (None, {})
        return {"dataset_version": version or "", "base_model": self.settings.base_model,
                **({"git_commit": c} if (c := git_commit()) else {}), **dict(self.settings.tags), **dict(extra)}

    def callbacks(self) -> list[Any]:
        if self.run_id is None:
            return []
        from models.training.callbacks import MlflowMetricsCallback

        return [MlflowMetricsCallback(self.tracking.tracking_uri, self.run_id)]

    def log_sft(self, losses: Sequence[float]) -> None:
        if self.run_id is not None:
            from models.registry.tracking import log_sft_losses

            log_sft_losses(self.tracking.tracking_uri, self.run_id, losses)

    def close(self, status: str, metrics: Mapping[str, float] | None = None) -> None:
        if self.run_id is None:
            return
        from models.registry.tracking import finish_training_run

        run_id, self.run_id = self.run_id, None
        finish_training_run(self.tracking.tracking_uri, run_id, metrics or {}, self.tracking.measurement_ids, status)
        self.closed_run_id = run_id
