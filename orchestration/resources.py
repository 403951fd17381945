"""Dagster resources: one small typed class per outside system, no work at import time."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import dagster as dg
from pydantic import PrivateAttr

from orchestration.settings import ProfilingSettings, Settings, load_settings


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

    Its experiments' artifact locations are relative to the home (models.registry.home_artifacts),
    so a copied or moved home opens as it was; links to runs follow the MLflow UI's actual port."""

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


PROFILER_KINDS = ("cuda", "recorded", "batch_file")


class Profiler(dg.ConfigurableResource):
    """One way of measuring a partition's batches: how many steps measure here, which GPU a
    step pins, and what a step does with its batch. One subclass per way (`make_profiler`)."""

    kind: ClassVar[str]

    def steps(self, profiling: ProfilingSettings, hardware: str) -> int:
        """Measuring steps of partition `hardware` on this host (0: nothing is measured here)."""
        return 1

    def pinned_gpu(self, gpu: int) -> int | None:
        """The GPU a measuring step pins (CUDA_VISIBLE_DEVICES), None where nothing runs on one."""
        return None

    def measure(self, batch: Path, out: Path, hardware: str, home: Path, profiling: ProfilingSettings,
                compile_workers: int) -> tuple[int, str]:
        """Measure the kernels of `batch` into the result file `out`.

        Returns:
            (exit code, a one-line note of what was done); `out` exists only where results came.
        """
        raise NotImplementedError


class CudaWorkerProfiler(Profiler):
    """The project's GPU worker (pipelines/profiling) on this host's GPUs, one step per GPU, where
    the host's GPU type is the partition's (settings.profiling; the interpreter on partition 'cpu'
    with measure_device="cpu"); elsewhere nothing is measured. With `pin_gpu_per_step` step i sees
    only GPU i (CUDA_VISIBLE_DEVICES=i); under Kubernetes each step's pod holds one GPU, its
    device 0, and nothing is pinned."""

    kind: ClassVar[str] = "cuda"
    pin_gpu_per_step: bool = True

    def steps(self, profiling: ProfilingSettings, hardware: str) -> int:
        from pipelines.profiling.hardware import gpu_count, host_hardware_id

        if not profiling.measure_on_cuda or host_hardware_id(profiling.measure_device) != hardware:
            return 0
        return gpu_count(profiling.gpus, profiling.measure_device)

    def pinned_gpu(self, gpu: int) -> int | None:
        return gpu if self.pin_gpu_per_step else None

    def measure(self, batch: Path, out: Path, hardware: str, home: Path, profiling: ProfilingSettings,
                compile_workers: int) -> tuple[int, str]:
        from pipelines.profiling import launch

        rc = launch.run_worker(batch, out, device=profiling.measure_device, timeout_s=profiling.timeout_s,
                               compile_workers=compile_workers)
        return rc, f"worker exit code {rc}"


class RecordedProfiler(Profiler):
    """Results already measured, served from the result files under `folder` (the committed
    data/measurements/<hw>/ files, a test's): the ingest stores them as if measured here;
    kernels without a recorded row stay unmeasured."""

    kind: ClassVar[str] = "recorded"
    folder: str

    def measure(self, batch: Path, out: Path, hardware: str, home: Path, profiling: ProfilingSettings,
                compile_workers: int) -> tuple[int, str]:
        from pipelines.profiling.recorded import recorded_results

        covered = recorded_results(batch, Path(self.folder), hardware, out)
        return 0, f"{covered} kernels recorded in {self.folder}"


class BatchFileProfiler(Profiler):
    """The batch of kernels to measure written to `folder` (empty: $KERNELCAST_HOME/outbox) for
    an outside job runner; nothing is measured here, its results come back through the inbox
    sensor."""

    kind: ClassVar[str] = "batch_file"
    folder: str = ""

    def measure(self, batch: Path, out: Path, hardware: str, home: Path, profiling: ProfilingSettings,
                compile_workers: int) -> tuple[int, str]:
        folder = Path(self.folder) if self.folder else home / "outbox"
        target = folder / hardware / f"{batch.parent.name}-{batch.name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(batch, target)
        return 0, f"batch written to {target} for a job runner"


def make_profiler(kind: str = "cuda", folder: str = "", pin_gpu_per_step: bool = True) -> Profiler:
    """The profiler of `kind` with the settings it reads (the others are ignored).

    >>> make_profiler("batch_file", "/shared/outbox").kind
    'batch_file'

    Raises:
        ValueError: an unknown kind, or the recorded kind without its folder (one line).
    """
    if kind == "cuda":
        return CudaWorkerProfiler(pin_gpu_per_step=pin_gpu_per_step)
    if kind == "recorded":
        if not folder:
            raise ValueError("the recorded profiler needs the folder of its result files")
        return RecordedProfiler(folder=folder)
    if kind == "batch_file":
        return BatchFileProfiler(folder=folder)
    raise ValueError(f"unknown profiler kind {kind!r}; one of {', '.join(PROFILER_KINDS)}")


class ProfilerResource(dg.ConfigurableResource):
    """Where the measuring steps' measurements come from, and how a step gets its GPU: the
    settings users give (in Python or a run's config), and the profiler they choose, made once
    by `make_profiler`.

    kind:
        cuda        CudaWorkerProfiler: the project's GPU worker on this host's GPUs.
        recorded    RecordedProfiler: results already measured, from the files under `folder`.
        batch_file  BatchFileProfiler: the batch written to `folder` for an outside job runner.
    """

    kind: str = "cuda"
    folder: str = ""
    pin_gpu_per_step: bool = True
    _profiler: Profiler | None = PrivateAttr(default=None)

    def profiler(self) -> Profiler:
        """The profiler of this kind (made on first use; a bad kind is a one-line ValueError)."""
        if self._profiler is None:
            self._profiler = make_profiler(self.kind, self.folder, self.pin_gpu_per_step)
        return self._profiler

    def steps(self, profiling: ProfilingSettings, hardware: str) -> int:
        """Measuring steps of partition `hardware` on this host (0: nothing is measured here)."""
        return self.profiler().steps(profiling, hardware)

    def pinned_gpu(self, gpu: int) -> int | None:
        """The GPU a measuring step pins (CUDA_VISIBLE_DEVICES), None where nothing runs on one."""
        return self.profiler().pinned_gpu(gpu)

    def measure(self, batch: Path, out: Path, hardware: str, home: Path, profiling: ProfilingSettings,
                compile_workers: int) -> tuple[int, str]:
        """Measure the kernels of `batch` into the result file `out` (Profiler.measure)."""
        return self.profiler().measure(batch, out, hardware, home, profiling, compile_workers)


class LlmBackendResource(dg.ConfigurableResource):
    """Which backend answers the LLM forecasts made here, and its settings (defaults: Settings.llm_backend).

    kind: "transformers" (the model in the step's process), "vllm" (vLLM's offline engine in a
    child process under `vllm_python`), "openai" (an OpenAI-compatible server at `base_url`;
    `model` names the served model, default the forecast's model ref; `api_key` its bearer
    token, best an EnvVar) or "committed" (the committed GPU forecasts alone: no forward pass
    here). Each is its own class in pipelines.forecasting.llm_backend, made by its one factory
    `llm_backend`; whatever the kind, a version with committed GPU forecasts answers from them.
    """

    kind: str = "transformers"
    base_url: str = ""
    model: str = ""
    api_key: str = ""
    vllm_python: str = ""

    def backend(self) -> LlmBackend:  # noqa: F821 - imported when called: no torch at import time
        """The backend the pipelines take (one-line ValueError on a bad kind or a missing base_url)."""
        from pipelines.forecasting.llm_backend import llm_backend

        return llm_backend(self.kind, self.base_url, self.model, self.api_key, self.vllm_python)


def build_resources(settings: Settings, pin_gpu_per_step: bool = True) -> dict[str, dg.ConfigurableResource]:
    """All resources for one profile (a test or a host swaps one through `build_defs(resources=)`
    or a run's config)."""
    return {
        "profiler": ProfilerResource(pin_gpu_per_step=pin_gpu_per_step),
        "llm_backend": LlmBackendResource(kind=settings.llm_backend.kind, base_url=settings.llm_backend.base_url,
                                          model=settings.llm_backend.model,
                                          vllm_python=settings.llm_backend.vllm_python),
        "settings": SettingsResource(profile=settings.profile, home=str(settings.home)),
        "warehouse": WarehouseResource(path=str(settings.warehouse_path)),
        "mlflow": MlflowResource(
            tracking_uri=settings.mlflow_uri, artifact_root=str(settings.mlflow_artifacts)
        ),
    }
