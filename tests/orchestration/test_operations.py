"""Operations on real Dagster instances: sensor and schedule ticks, the automation conditions,
the measuring fan-out (one step per GPU, faked as two on CPU where the real worker measures in
Triton's interpreter) and the validation of both code locations (one host, Kubernetes). The
forecasting fan-out is tested on the tiny registered model of tests/assets/test_surrogate_assets.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from tests.warehouse.test_warehouse_factory import (
    A100,
    A100_ID,
    kernel_row,
    kernel_table,
    result_row,
    results_table,
    write,
)

REPO = Path(__file__).resolve().parents[2]
CPU_ROWS_FAIL = "speedup_requires_correctness"


@pytest.fixture()
def settings(tmp_path, monkeypatch):
    for key, value in (("KERNELCAST_HOME", tmp_path / "home"), ("KERNELCAST_DATA", tmp_path / "data"),
                       ("DAGSTER_HOME", tmp_path / "home" / "dagster"), ("KERNELCAST_PROFILE", "smoke")):
        monkeypatch.setenv(key, str(value))
    (tmp_path / "data" / "measurements").mkdir(parents=True)
    from orchestration.settings import load_settings

    s = load_settings("smoke")
    s.inbox.mkdir(parents=True)
    return s


def _tick(defs, instance, settings, cursor=None):
    from orchestration.resources import build_resources

    sensor = defs.get_repository_def().get_sensor_def("measurement_inbox_sensor")
    with dg.build_sensor_context(instance=instance, instance_ref=instance.get_ref(), cursor=cursor,
                                 definitions=defs, resources=build_resources(settings)) as ctx:
        return sensor.evaluate_tick(ctx)


def test_inbox_sensor_requests_each_content_once(settings):
    from orchestration.definitions import build_defs
    from warehouse.db import connect
    from warehouse.ingest import ingest_path

    (settings.home / "dagster").mkdir()
    defs, instance = build_defs(settings), dg.DagsterInstance.local_temp(str(settings.home / "dagster"))
    assert "no result files" in _tick(defs, instance, settings).skip_message
    kernels = [kernel_row(i) for i in range(3)]
    write(kernel_table(kernels), settings.inbox / "kernels.parquet")
    assert "no new measurement content" in _tick(defs, instance, settings).skip_message  # kernels alone
    results = write(results_table([result_row(k["kernel_id"], fingerprint=A100, hw_id=A100_ID) for k in kernels]),
                    settings.inbox / "a100.parquet")
    first = _tick(defs, instance, settings)
    [request] = first.run_requests
    assert request.partition_key == A100_ID and request.job_name in (None, "measurement_ingest_job")
    assert [r.partition_keys for r in first.dynamic_partitions_requests] == [[A100_ID]]
    assert request.tags["kernelcast/inbox_files"] == "a100.parquet"
    # Same cursor: nothing new. The same bytes under another name: nothing new.
    assert not _tick(defs, instance, settings, first.cursor).run_requests
    shutil.copy(results, settings.inbox / "a100-copy.parquet")
    assert not _tick(defs, instance, settings, first.cursor).run_requests
    # Without a cursor (a new daemon) the warehouse says what is ingested already.
    with connect(settings.warehouse_path) as con:
        ingest_path(con, settings.inbox)
    assert "no new measurement content" in _tick(defs, instance, settings).skip_message
    # Changed content under the old name is new.
    write(results_table([result_row(k["kernel_id"], fingerprint=A100, hw_id=A100_ID, batch_id="batch-2") for k in kernels]), results)
    instance.add_dynamic_partitions("hardware", [A100_ID])
    again = _tick(defs, instance, settings, first.cursor)
    assert [r.partition_key for r in again.run_requests] == [A100_ID] and not again.dynamic_partitions_requests
    assert again.run_requests[0].run_key != request.run_key


def test_nightly_schedule_requests_one_run_per_hardware_partition(settings):
    from orchestration.definitions import build_defs

    repo = build_defs(settings).get_repository_def()
    schedule = repo.get_schedule_def("nightly_schedule")
    assert schedule.job_name == "full_graph_job" and schedule.cron_schedule == "0 3 * * *"
    (settings.home / "dagster").mkdir()
    instance = dg.DagsterInstance.local_temp(str(settings.home / "dagster"))
    with dg.build_schedule_context(instance=instance, repository_def=repo) as ctx:
        assert "no hardware partitions" in schedule.evaluate_tick(ctx).skip_message
    instance.add_dynamic_partitions("hardware", ["nvidia-h200-sm90", A100_ID])
    from datetime import UTC, datetime

    with dg.build_schedule_context(instance=instance, repository_def=repo,
                                   scheduled_execution_time=datetime(2026, 12, 2, 3, tzinfo=UTC)) as ctx:
        requests = schedule.evaluate_tick(ctx).run_requests
    assert sorted((r.partition_key, r.run_key) for r in requests) == [
        (A100_ID, f"nightly-2026-12-02-{A100_ID}"), ("nvidia-h200-sm90", "nightly-2026-12-02-nvidia-h200-sm90")]


def test_automation_waits_for_measurements_on_an_empty_instance(settings):
    """Nothing downstream is requested before any measurement exists (eager would request
    curation of an empty warehouse); the base model, with no upstream, is built when missing."""
    from orchestration.automation import REACTING
    from orchestration.definitions import build_defs

    defs = build_defs(settings)
    graph = defs.get_repository_def().asset_graph
    assert {k.to_user_string() for k in REACTING.resolve(graph)} == {
        "curated_pairs", "eval_set", "rl_training_pool", "discovery_pairs", "surrogate_model", "forecasts",
        "calibration_report", "utility_report", "model_promotion", "classical_forecasters", "search_simulation",
        "card_forecasters", "cross_hardware_report", "card_champions"}
    result = dg.evaluate_automation_conditions(defs=defs, instance=dg.DagsterInstance.ephemeral())
    requested = {k.to_user_string() for k in graph.get_all_asset_keys() if result.get_requested_partitions(k)}
    assert requested == {"base_model"}
    sensors = {s.name: s for s in defs.get_repository_def().sensor_defs}
    assert sensors["downstream_automation_sensor"].default_status == dg.DefaultSensorStatus.RUNNING


def test_fanout_helpers():
    from assets.profiling import pinned_gpu
    from pipelines.profiling.hardware import gpu_count

    assert gpu_count(3, "cuda") == 3 and gpu_count(None, "cpu") == 1 and gpu_count(0, "cuda") == 1
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    with pinned_gpu(1):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == before
    with pinned_gpu(None):
        assert os.environ.get("CUDA_VISIBLE_DEVICES") == before


def test_runs_with_a_fanout_get_one_process_per_gpu(settings):
    """`kernelcast run` on a host of two GPUs: the measurement run of its own GPU type and the
    downstream run (the forecasting steps) side by side, one process per GPU; the rest in process."""
    from dataclasses import replace

    from orchestration.runner import _processes

    two = replace(settings, profiling=replace(settings.profiling, gpus=2))
    assert _processes(two, "measurement_ingest_job", "nvidia-h200-sm90", "nvidia-h200-sm90") == 2
    assert _processes(two, "measurement_ingest_job", A100_ID, "nvidia-h200-sm90") == 1
    assert _processes(two, "downstream_job", None, None) == 2
    assert _processes(two, "candidates_job", None, "nvidia-h200-sm90") == 1
    import torch

    # None configured: every CUDA device of the host, one process where there is none.
    assert _processes(settings, "downstream_job", None, None) == max(1, torch.cuda.device_count())


def _softmax_kernels(settings, n: int) -> list[str]:
    """n generated softmax kernels (no compile) in the warehouse: what the fan-out measures."""
    from pipelines.generation.candidates import build_candidates, write_batch
    from warehouse.db import connect
    from warehouse.ingest import ingest_path

    frame = build_candidates("softmax", n, seed=0, compile=False)
    path = write_batch(frame, settings.home / "kernels.parquet")
    with connect(settings.warehouse_path) as con:
        ingest_path(con, path)
    return sorted(frame.filter(frame["language"] == "triton")["kernel_id"].to_list())


def _fanout_settings(settings, monkeypatch):
    from dataclasses import replace

    monkeypatch.setenv("KERNELCAST_GPUS", "2")  # what the step processes read
    monkeypatch.setenv("KERNELCAST_MEASURE_DEVICE", "cpu")
    return replace(settings, profiling=replace(settings.profiling, gpus=2, measure_device="cpu", max_kernels=4,
                                               timeout_s=120.0))


def _measured(settings) -> list[tuple[str, str]]:
    from warehouse.db import connect

    with connect(settings.warehouse_path, read_only=True) as con:
        return sorted(con.execute("SELECT kernel_id, status FROM measurements WHERE hardware_id = 'cpu'").fetchall())


@pytest.mark.slow
def test_measurements_fan_out_one_process_per_gpu_and_merge_through_ingest(settings, monkeypatch):
    """Two fake GPUs, as `kernelcast run` starts them on a host of several: the plan splits the
    unmeasured kernels in two shards, each measured by the real worker (CPU interpreter) in its
    own process of the multiprocess executor with its own CUDA_VISIBLE_DEVICES; the ingest step
    merges them. The plan step's process loads the settings again: `kernelcast measure --limit`
    reaches it through KERNELCAST_MAX_KERNELS. A second run, without the limit, measures the
    kernel left; a third finds nothing left to measure."""
    from orchestration.definitions import build_defs
    from orchestration.runner import execute_code_location_job, prepare_home

    monkeypatch.setenv("KERNELCAST_MAX_KERNELS", "2")
    s = _fanout_settings(settings, monkeypatch)
    prepare_home(s)
    ids = _softmax_kernels(s, 3)
    defs, instance = build_defs(s), dg.DagsterInstance.get()
    instance.add_dynamic_partitions("hardware", ["cpu"])
    run = execute_code_location_job(defs, instance, "measurement_ingest_job", "cpu", processes=2)
    # Interpreter rows time the tasks' correctness cases, not their benchmark cases: the data
    # check that guards curation rejects them, as it must (CPU timings are for tests only).
    assert run.checks_failed == [CPU_ROWS_FAIL], run.error
    pids = {e.step_key: e.dagster_event.pid for e in instance.all_logs(run.run_id)
            if e.dagster_event_type == dg.DagsterEventType.STEP_START and "measure_shard" in (e.step_key or "")}
    assert sorted(pids) == ["kernel_measurements.measure_shard[gpu_0]", "kernel_measurements.measure_shard[gpu_1]"]
    assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()
    meta = run.metadata["kernel_measurements"]
    assert meta["measuring_steps"] == 2 and meta["profiled_here"] == 2
    assert "| 0 | 0 |" in meta["shards"] and "| 1 | 1 |" in meta["shards"]  # GPU i saw CUDA_VISIBLE_DEVICES=i
    first = [k for k, _ in _measured(s)]
    assert len(first) == 2 and set(first) < set(ids)  # 2 of the 3: the limit held in the step processes

    monkeypatch.delenv("KERNELCAST_MAX_KERNELS")
    rest = execute_code_location_job(defs, instance, "measurement_ingest_job", "cpu")
    assert rest.metadata["kernel_measurements"]["profiled_here"] == 1
    measured = _measured(s)
    assert [k for k, _ in measured] == ids  # every kernel once, merged from the shards of both runs
    again = execute_code_location_job(defs, instance, "measurement_ingest_job", "cpu")
    assert again.metadata["kernel_measurements"]["measuring_steps"] == 0
    assert _measured(s) == measured


@pytest.mark.parametrize("target", [["-w", "workspace.yaml"], ["-m", "orchestration.k8s"]], ids=["local", "k8s"])
def test_code_locations_validate(target, tmp_path):
    env = {**os.environ, "KERNELCAST_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dagster"),
           "PYTHONPATH": str(REPO)}
    (tmp_path / "dagster").mkdir()
    out = subprocess.run([str(Path(sys.executable).parent / "dagster"), "definitions", "validate", *target],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "All code locations passed validation" in out.stderr + out.stdout


def test_k8s_code_location_requests_gpus_and_pins_none():
    from orchestration import k8s
    from orchestration.settings import load_settings

    defs = k8s.build_defs(load_settings("smoke"), executor=k8s.EXECUTOR, pin_gpu_per_step=False)
    job = defs.resolve_job_def("measurement_ingest_job")
    assert job.executor_def.name == "kernelcast_k8s_executor"
    shard = job.graph.node_named("kernel_measurements").definition.node_named("measure_shard")
    assert json.loads(shard.tags["dagster-k8s/config"])["container_config"]["resources"]["limits"] == {
        "nvidia.com/gpu": "1"}
    # The language models' forecasting steps too; the plan and store steps around them need none.
    forecasts = defs.resolve_job_def("downstream_job").graph.node_named("forecasts").definition
    assert json.loads(forecasts.node_named("forecast_llm_shard").tags["dagster-k8s/config"]) == json.loads(
        shard.tags["dagster-k8s/config"])
    assert "dagster-k8s/config" not in forecasts.node_named("plan_forecasts").tags
    assert defs.resources["profiler"].pin_gpu_per_step is False


def test_runs_left_started_by_a_dead_process_free_their_pool_slot(settings):
    """A killed `kernelcast run` leaves its run started and its DuckDB slot claimed; the next one
    fails that run and frees the slot, or every DuckDB step would wait forever."""
    import socket

    from orchestration.definitions import build_defs
    from orchestration.runner import release_abandoned_runs

    (settings.home / "dagster").mkdir()
    instance = dg.DagsterInstance.local_temp(str(settings.home / "dagster"))
    job = build_defs(settings).resolve_job_def("candidates_job")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    tags = {"kernelcast/host": socket.gethostname()}
    dead = instance.create_run_for_job(job, status=dg.DagsterRunStatus.STARTED, tags={**tags, "kernelcast/pid": str(gone.pid)})
    alive = instance.create_run_for_job(job, status=dg.DagsterRunStatus.STARTED, tags={**tags, "kernelcast/pid": str(os.getpid())})
    storage = instance.event_log_storage
    storage.set_concurrency_slots("duckdb_writer", 1)
    assert storage.claim_concurrency_slot("duckdb_writer", dead.run_id, "kernel_tasks").is_claimed
    assert release_abandoned_runs(instance) == [dead.run_id]
    assert instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.FAILURE
    assert instance.get_run_by_id(alive.run_id).status == dg.DagsterRunStatus.STARTED
    assert dead.run_id not in storage.get_concurrency_run_ids()
    assert storage.claim_concurrency_slot("duckdb_writer", alive.run_id, "kernel_tasks").is_claimed


def test_a_new_home_gets_its_mlflow_store_from_a_child_process(settings):
    """`kernelcast run` creates a new home's MLflow store beside its first jobs; a home that has
    one starts no child."""
    from mlflow import MlflowClient

    from orchestration.runner import _create_tracking_store, _wait_for

    settings.home.mkdir(parents=True, exist_ok=True)
    child = _create_tracking_store(settings)
    assert child is not None
    _wait_for(child)
    assert child.returncode == 0 and (settings.home / "mlflow.db").is_file()
    client = MlflowClient(tracking_uri=settings.mlflow_uri, registry_uri=settings.mlflow_uri)
    assert [e.name for e in client.search_experiments()] == ["Default"]
    assert _create_tracking_store(settings) is None


@pytest.mark.parametrize("name", ["orchestration.run_display", "pipelines.sharding", "pipelines.promotion.scores"])
def test_doctests(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
