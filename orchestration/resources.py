"""Dagster resources: one small typed class per outside system, no work at import time."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import dagster as dg

from orchestration.settings import Settings, load_settings


class SettingsResource(dg.ConfigurableResource):
    """The profile (smoke/default/gpu) and KERNELCAST_HOME, resolved once into Settings."""

    profile: str = "default"
    home: str = ""  # empty: $KERNELCAST_HOME or ./.kernelcast

    def get(self) -> Settings:
        return load_settings(self.profile, self.home or None)


class WarehouseResource(dg.ConfigurableResource):
    """The DuckDB warehouse file. Connections are short-lived; writers run serially (pool)."""

    path: str

    @contextlib.contextmanager
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:  # noqa: F821
        from warehouse.db import connect

        con = connect(self.path, read_only=read_only)
        try:
            yield con
        finally:
            con.close()


class MlflowResource(dg.ConfigurableResource):
    """A thin handle on MLflow's tracking store and model registry (sqlite under KERNELCAST_HOME).

    Opening it re-roots artifact locations left by a home this one was copied or moved from
    (models.registry.tracking.open_store); links to runs follow the MLflow UI's actual port."""

    tracking_uri: str
    artifact_root: str

    def client(self):
        import mlflow
        from mlflow import MlflowClient

        from models.registry.tracking import open_store

        open_store(self.tracking_uri)
        mlflow.set_tracking_uri(self.tracking_uri)
        mlflow.set_registry_uri(self.tracking_uri)
        return MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)

    def experiment_id(self, name: str) -> str:
        """Id of experiment `name`, created with artifacts under artifact_root if missing."""
        from models.registry.tracking import mlflow_experiment

        Path(self.artifact_root).mkdir(parents=True, exist_ok=True)
        return mlflow_experiment(self.client(), self.tracking_uri, name)

    def run_url(self, run_id: str) -> str:
        """The run in the MLflow UI, on the port `kernelcast ui` serves it (orchestration.ui.live_ports)."""
        return self.run_links(run_id)["mlflow_url"]

    def run_links(self, run_id: str) -> dict[str, str | None]:
        """{"run_id", "mlflow_url", "dagster_run_id", "dagster_url"} of an MLflow run: its link and
        the Dagster run that made it (its tag `dagster_run_id`; None when it has none), on the
        ports the UIs serve this home on."""
        from mlflow.exceptions import MlflowException

        from models.registry.tracking import run_url
        from orchestration.links import dagster_run_url, live_ports

        ports = live_ports(Path(self.artifact_root).parent)  # the home: artifact_root is <home>/mlartifacts
        try:
            run = self.client().get_run(run_id)
            experiment_id, dagster_run = run.info.experiment_id, run.data.tags.get("dagster_run_id")
        except MlflowException:  # a link without the experiment still opens the run
            experiment_id = dagster_run = None
        return {"run_id": run_id, "mlflow_url": run_url(run_id, experiment_id, port=ports["mlflow"]),
                "dagster_run_id": dagster_run,
                "dagster_url": dagster_run_url(dagster_run, ports["dagster"]) if dagster_run else None}


class ProfilerResource(dg.ConfigurableResource):
    """How measuring steps get their GPU: pinned per step on one host, or one pod per step.

    On a host of N GPUs the fan-out runs N steps side by side (multiprocess executor) and step i
    sees only GPU i (CUDA_VISIBLE_DEVICES=i). Under Kubernetes each step runs in its own pod
    holding one GPU, which the pod sees as device 0: nothing is pinned there.
    """

    pin_gpu_per_step: bool = True


def build_resources(settings: Settings, pin_gpu_per_step: bool = True) -> dict[str, dg.ConfigurableResource]:
    """All resources for one profile."""
    return {
        "profiler": ProfilerResource(pin_gpu_per_step=pin_gpu_per_step),
        "settings": SettingsResource(profile=settings.profile, home=str(settings.home)),
        "warehouse": WarehouseResource(path=str(settings.warehouse_path)),
        "mlflow": MlflowResource(
            tracking_uri=settings.mlflow_uri, artifact_root=str(settings.mlflow_artifacts)
        ),
    }
