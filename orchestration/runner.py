"""`kernelcast run`: the jobs of the code location, in process, on the instance `dg dev` sees.

    candidates_job -> measurement_ingest_job (one run per hardware partition) -> downstream_job

Each is created as a run of the code location `orchestration.definitions` (the origin the UI
uses to re-execute it) on the instance under $KERNELCAST_HOME/dagster, whose dagster.yaml limits
the pool `duckdb_writer` to one step at a time (DuckDB allows one writer per file). Steps run
in this process, except the fan-outs on a host of several GPUs: there the measurement run and
the downstream run (the language models' forecasts) use the multiprocess executor, one process
per GPU. A run that fails stops the sequence,
as a failed step stops its downstream inside one run.

`listener` (the CLI's display) sees every event as it happens; Dagster's own console log goes
to stderr, which the CLI points at the run's log file.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from orchestration.settings import Settings

log = logging.getLogger(__name__)

LOCATION_NAME = "orchestration.definitions"  # what workspace.yaml's python_module names
REPOSITORY_NAME = "__repository__"  # Dagster's name for a Definitions object's repository
DAGSTER_YAML = """\
# Written by kernelcast (orchestration/runner.py): the instance that `kernelcast run`,
# `kernelcast ui` and `DAGSTER_HOME=<this folder> dg dev` (or `dg dev -w workspace.yaml`) share.
# Storage is named through $DAGSTER_HOME, never an absolute path, so the instance (and the
# processes a run starts, which get this configuration) follows $KERNELCAST_HOME when the
# folder is copied or moved.
storage:
  sqlite:
    base_dir:
      env: DAGSTER_HOME
local_artifact_storage:
  module: dagster._core.storage.root
  class: LocalArtifactStorage
  config:
    base_dir:
      env: DAGSTER_HOME
# DuckDB allows one writer per file: every step that opens the warehouse is in the pool
# duckdb_writer, and pools default to one step at a time, across runs too.
concurrency:
  pools:
    default_limit: 1
telemetry:
  enabled: false
# The UI's "Join the Dagster community" dialog covers the first page a new browser opens.
nux:
  enabled: false
"""
PROGRESS = re.compile(r"\[(\d+)/(\d+)\]")


def prepare_home(settings: Settings) -> None:
    """Create $KERNELCAST_HOME and point Dagster at it (idempotent)."""
    for d in (settings.home, settings.dagster_home, settings.inbox, settings.reports_dir, settings.mlflow_artifacts,
              settings.home / "logs"):
        d.mkdir(parents=True, exist_ok=True)
    cfg = settings.dagster_home / "dagster.yaml"
    if not cfg.exists() or cfg.read_text() != DAGSTER_YAML:
        cfg.write_text(DAGSTER_YAML)
    os.environ["DAGSTER_HOME"] = str(settings.dagster_home)
    os.environ["KERNELCAST_HOME"] = str(settings.home)
    os.environ["KERNELCAST_PROFILE"] = settings.profile


@dataclass
class RunSummary:
    """One run of a code-location job, as the CLI reports it."""

    job: str
    partition: str | None
    run_id: str
    success: bool
    materialized: list[str]
    checks_failed: list[str]  # ERROR severity: wrong data
    checks_warned: list[str]  # WARN severity: reported, the run goes on
    seconds: float
    error: str | None = None  # the first failure, one line
    promotion: dict[str, Any] = field(default_factory=dict)  # outcome, reason of model_promotion
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)  # asset -> its metadata (text)


def _origin(job_name: str):
    """The origin `dg dev` (pyproject's [tool.dg], or `-w workspace.yaml`) gives this job, under the
    same location name, so the UI can re-execute the run."""
    from dagster._core.remote_origin import (
        ManagedGrpcPythonEnvCodeLocationOrigin,
        RemoteJobOrigin,
        RemoteRepositoryOrigin,
    )
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    repo = Path(__file__).resolve().parent.parent
    target = LoadableTargetOrigin(executable_path=sys.executable, module_name=LOCATION_NAME,
                                  working_directory=str(repo))
    location = ManagedGrpcPythonEnvCodeLocationOrigin(loadable_target_origin=target, location_name=LOCATION_NAME)
    return RemoteJobOrigin(RemoteRepositoryOrigin(location, REPOSITORY_NAME), job_name)


def _text(value: Any) -> Any:
    return getattr(value, "value", value)


class _EventTail(threading.Thread):
    """Reads a run's events from the instance while it executes (any executor) and hands each
    to the listener."""

    def __init__(self, instance: dg.DagsterInstance, run_id: str, listener: Callable | None) -> None:
        super().__init__(daemon=True)
        self.instance, self.run_id, self.listener = instance, run_id, listener
        self.cursor: str | None = None
        self.stop = threading.Event()

    def poll(self) -> None:
        # Only the events after the last one read: reading the whole log twice a second made
        # the thread's work grow with the square of the run's events (~2 s of a smoke run).
        page = self.instance.get_records_for_run(self.run_id, cursor=self.cursor)
        for record in page.records:
            if self.listener is not None:
                self.listener(record.event_log_entry)
        self.cursor = page.cursor

    def run(self) -> None:
        while not self.stop.is_set():
            self.poll()
            self.stop.wait(0.5)


def _summarise(instance: dg.DagsterInstance, run, job: str, partition: str | None, seconds: float) -> RunSummary:
    mats, failed, warned, error, meta, promotion = [], [], [], None, {}, {}
    for entry in instance.all_logs(run.run_id):
        ev = entry.dagster_event
        if ev is None:
            continue
        if ev.event_type_value == "ASSET_MATERIALIZATION":
            m = ev.step_materialization_data.materialization
            key = m.asset_key.to_user_string()
            mats.append(key)
            meta[key] = {k: _text(v) for k, v in m.metadata.items()}
            if key == "model_promotion":
                promotion = {k: meta[key].get(k) for k in ("outcome", "reason", "champion", "promoted")}
        elif ev.event_type_value == "ASSET_CHECK_EVALUATION":
            c = ev.event_specific_data
            if not c.passed:
                (failed if c.severity == dg.AssetCheckSeverity.ERROR else warned).append(c.check_name)
        elif ev.event_type_value in ("STEP_FAILURE", "RUN_FAILURE") and error is None:
            err = getattr(ev.event_specific_data, "error", None)
            msg = (err.message if err else ev.message or "").strip().splitlines()
            cls = f"{err.cls_name}: " if err and err.cls_name else ""
            error = f"{ev.step_key or job}: {cls}{msg[0] if msg else 'failed'}"
    final = instance.get_run_by_id(run.run_id)
    success = final is not None and final.status == dg.DagsterRunStatus.SUCCESS
    if failed:  # a blocking check says more than the step error it raised
        error = f"blocking check(s) failed: {', '.join(failed)}"
    return RunSummary(job, partition, run.run_id, success, mats, failed, warned, seconds,
                      None if success else (error or "failed"), promotion, meta)


def execute_code_location_job(defs: dg.Definitions, instance: dg.DagsterInstance, job_name: str,
                              partition_key: str | None = None, processes: int = 1,
                              tags: dict[str, str] | None = None,
                              listener: Callable | None = None) -> RunSummary:
    """Run one job of the code location as a run the UI can re-execute.

    Args:
        defs: the code location's Definitions (`build_defs`), for the in-process executor.
        instance: the Dagster instance.
        job_name: a job of the code location.
        partition_key: the hardware partition of a partitioned job.
        processes: above 1, the multiprocess executor with that many processes (the steps
            reload the code location from the environment, `orchestration.definitions`).
        tags: extra run tags.
        listener: called with every event log entry while the run executes.
    Returns:
        Its RunSummary.
    """
    from dagster._core.definitions.job_base import InMemoryJob
    from dagster._core.definitions.reconstruct import ReconstructableRepository
    from dagster._core.execution.api import execute_run

    job_def = defs.resolve_job_def(job_name)
    multi = processes > 1
    executor = {"multiprocess": {"max_concurrent": processes}} if multi else {"in_process": {}}
    import socket

    run_tags = {"kernelcast/launched_by": "kernelcast run", "kernelcast/host": socket.gethostname(),
                "kernelcast/pid": str(os.getpid()), **(tags or {})}
    if partition_key is not None:
        run_tags["dagster/partition"] = partition_key
    if multi:
        repo = Path(__file__).resolve().parent.parent
        job = ReconstructableRepository.for_module(LOCATION_NAME, "defs", working_directory=str(repo)) \
            .get_reconstructable_job(job_name)
    else:
        job = InMemoryJob(job_def)
    run = instance.create_run_for_job(
        job_def, run_config={"execution": {"config": executor}}, tags=run_tags,
        remote_job_origin=_origin(job_name),
        job_code_origin=job.get_python_origin() if multi else None,
    )
    tail = _EventTail(instance, run.run_id, listener)
    tail.start()
    t0 = time.perf_counter()
    try:
        execute_run(job, run, instance, raise_on_error=False)
    finally:
        tail.stop.set()
        tail.join()
        tail.poll()
    return _summarise(instance, run, job_name, partition_key, time.perf_counter() - t0)


def release_abandoned_runs(instance: dg.DagsterInstance) -> list[str]:
    """Fail the runs a killed `kernelcast run` left "started" and free their pool slots.

    A run executed in process holds its `duckdb_writer` slot in the instance while a step runs;
    if the process dies (Ctrl-C twice, a killed terminal) nobody frees it, and every later
    DuckDB step would wait for it forever. Runs of this host whose recorded process is gone are
    marked failed and their slots freed (the daemon's run monitoring does this for its own runs).

    Returns:
        The run ids released.
    """
    import socket

    from dagster._core.storage.dagster_run import RunsFilter

    released = []
    active = [dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.NOT_STARTED]
    for run in instance.get_runs(RunsFilter(statuses=active, tags={"kernelcast/host": socket.gethostname()})):
        pid = run.tags.get("kernelcast/pid")
        if not (pid and pid.isdigit()) or _alive(int(pid)):
            continue
        if run.status != dg.DagsterRunStatus.NOT_STARTED:
            instance.report_run_failed(run, "its kernelcast process is gone")
        else:
            instance.report_run_canceled(run, "its kernelcast process is gone")
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        released.append(run.run_id)
    return released


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def planned_runs(settings: Settings, instance: dg.DagsterInstance) -> list[tuple[str, str | None]]:
    """(job, partition) in the order `kernelcast run` executes them; adds new hardware partitions."""
    from orchestration.partitions import HARDWARE_PARTITIONS, discover_hardware_partitions

    keys = discover_hardware_partitions(settings)
    existing = set(instance.get_dynamic_partitions(HARDWARE_PARTITIONS.name))
    new = [k for k in keys if k not in existing]
    if new:
        instance.add_dynamic_partitions(HARDWARE_PARTITIONS.name, new)
    return [("candidates_job", None), *[("measurement_ingest_job", k) for k in keys], ("downstream_job", None)]


# Jobs whose steps never open the MLflow store: they may run while a child process creates it.
_JOBS_WITHOUT_MLFLOW = ("candidates_job", "measurement_ingest_job")


def _create_tracking_store(settings: Settings):
    """A child process creating the MLflow store of a new home, or None when it exists.

    Why a process: MLflow's schema migrations of a new store take 2-4 s on 2 cores, and the
    first jobs (candidates, the measurement ingest) leave the second core mostly idle. The
    steps that use MLflow run only after it has ended (`run_graph` waits for it); should it
    fail, they create the store as they would anyway.
    """
    import subprocess

    db = settings.home / "mlflow.db"
    if db.exists() or not settings.mlflow_uri.startswith("sqlite:"):
        return None
    code = "import sys; from models.registry.tracking import create_store; create_store(sys.argv[1])"
    return subprocess.Popen([sys.executable, "-c", code, settings.mlflow_uri], cwd=Path(__file__).resolve().parent.parent,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def _wait_for(child) -> None:
    if child is not None and child.wait() != 0:
        log.warning("creating the MLflow store beside the first jobs failed (exit %s): the steps create it",
                    child.returncode)


def run_graph(settings: Settings, defs: dg.Definitions | None = None,
              listener: Callable | None = None,
              on_run_start: Callable[[str, str | None], None] | None = None) -> list[RunSummary]:
    """Materialise every asset through the code location's jobs; stops at the first failed run.

    Args:
        settings: the resolved settings (prepare_home points Dagster and the code location at them).
        defs: the code location (default: `build_defs(settings)`).
        listener: called with every event log entry.
        on_run_start: called with (job, partition) before each run.
    Returns:
        One RunSummary per run executed.
    """
    from models.classical.registry import import_serializer
    from orchestration.definitions import build_defs
    from pipelines.profiling.hardware import host_hardware_id

    import_serializer()  # before any step imports transformers (its docstring says why)
    prepare_home(settings)
    store = _create_tracking_store(settings)
    try:
        defs = defs or build_defs(settings)
        instance = dg.DagsterInstance.get()
        for run_id in release_abandoned_runs(instance):
            log.warning("run %s was left started by a process that is gone: marked failed, its pool slots freed", run_id)
        host = host_hardware_id(settings.profiling.measure_device) if settings.profiling.measure_on_cuda else None
        summaries: list[RunSummary] = []
        for job, partition in planned_runs(settings, instance):
            if job not in _JOBS_WITHOUT_MLFLOW:
                _wait_for(store)
                store = None
            if on_run_start is not None:
                on_run_start(job, partition)
            n = _processes(settings, job, partition, host)
            summary = execute_code_location_job(defs, instance, job, partition, processes=n,
                                                tags={"kernelcast/profile": settings.profile},
                                                listener=listener)
            summaries.append(summary)
            if not summary.success:
                break
        return summaries
    finally:
        _wait_for(store)


def _processes(settings: Settings, job: str, partition: str | None, host: str | None) -> int:
    """Processes a run needs: steps side by side need one each. The measuring steps of this
    host's partition and the forecasting steps of the downstream run fan out one per GPU;
    everything else runs here."""
    from pipelines.profiling.hardware import forecast_gpus, gpu_count

    if partition is not None and partition == host:
        return gpu_count(settings.profiling.gpus, settings.profiling.measure_device)
    if job == "downstream_job":
        return forecast_gpus(settings.profiling)
    return 1
