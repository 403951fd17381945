"""The profiler resource swapped in a test: `recorded` serves committed H200 results as if
measured here, `batch_file` writes the batch for an outside job runner and measures nothing.

Real parts: a slice of a committed result file and of its kernels file, a DuckDB file, an
ephemeral Dagster instance; the data folder holds no shipped measurements, so every row the
warehouse gets came through the profiler."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from asset_runs import materialize

from orchestration.definitions import build_defs
from orchestration.resources import ProfilerResource
from orchestration.settings import load_settings

REPO = Path(__file__).resolve().parents[2]
H200 = "nvidia-h200-sm90"
COMMITTED = REPO / "data" / "measurements" / "h200"
RESULTS = COMMITTED / "results-2026-12-02-nontemplate-b.parquet"
KERNELS = COMMITTED / "kernels-2026-12-02-nontemplate.parquet"


@pytest.fixture()
def settings(tmp_path, monkeypatch):
    (tmp_path / "data" / "measurements").mkdir(parents=True)
    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KERNELCAST_DATA", str(tmp_path / "data"))  # no shipped measurements
    return load_settings("smoke")


@pytest.fixture()
def recorded(tmp_path, settings):
    """Three recorded results in a folder of their own, and in the warehouse the task suite,
    their kernels and one more kernel that has no recorded row."""
    from pipelines.tasks import catalog
    from warehouse import tables
    from warehouse.db import connect
    from warehouse.ingest import ingest_path

    rows = pl.read_parquet(RESULTS).filter(pl.col("hardware_id") == H200).sort("kernel_id").head(3)
    kernels = pl.read_parquet(KERNELS)
    extra = kernels.filter(~pl.col("kernel_id").is_in(rows["kernel_id"].implode()) & (pl.col("language") == "triton"))
    picked = pl.concat([kernels.filter(pl.col("kernel_id").is_in(rows["kernel_id"].implode())), extra.head(1)])
    assert picked.height == 4
    folder = tmp_path / "recorded"
    folder.mkdir()
    rows.write_parquet(folder / "results-slice.parquet")
    picked.write_parquet(folder / "kernels-slice.parquet")  # a kernels file in the folder is skipped
    with connect(settings.warehouse_path) as con:
        tables.upsert_tasks(con, catalog.task_rows())  # what the data checks count cases against
        ingest_path(con, folder / "kernels-slice.parquet")
    return folder, rows, extra["kernel_id"][0]


def _measurements(settings) -> pl.DataFrame:
    from warehouse.db import connect, query_frame

    with connect(settings.warehouse_path, read_only=True) as con:
        return query_frame(con, "SELECT kernel_id, batch_id, status, speedup, hardware_id FROM measurements")


def _run(settings, profiler: ProfilerResource):
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("hardware", [H200])
    defs = build_defs(settings, resources={"profiler": profiler})
    return materialize(defs, dg.AssetSelection.assets("kernel_measurements"), instance, partition_key=H200)


def test_recorded_results_are_ingested_as_if_measured(settings, recorded):
    folder, rows, unrecorded = recorded
    run = _run(settings, ProfilerResource(kind="recorded", folder=str(folder)))
    assert run.success, [e.message for e in run.all_events if e.is_failure]
    stored = _measurements(settings).sort("kernel_id")
    assert stored["kernel_id"].to_list() == rows["kernel_id"].to_list()
    assert stored["batch_id"].to_list() == rows["batch_id"].to_list()  # the recorded batches, kept
    assert stored["status"].to_list() == rows["status"].to_list()
    assert stored["speedup"].to_list() == rows["speedup"].to_list()
    assert unrecorded not in stored["kernel_id"].to_list()  # no recorded row: left unmeasured
    meta = run.get_asset_materialization_events()[0].step_materialization_data.materialization.metadata
    assert meta["profiled_here"].value == 3 and meta["measuring_steps"].value == 1
    # The kernels already served are not planned again; the unrecorded one is, and gets nothing.
    again = _run(settings, ProfilerResource(kind="recorded", folder=str(folder)))
    assert again.success and _measurements(settings).height == 3


def test_batch_file_writes_the_unmeasured_kernels_and_ingests_nothing(settings, recorded, tmp_path):
    _, rows, unrecorded = recorded
    outbox = tmp_path / "outbox"
    run = _run(settings, ProfilerResource(kind="batch_file", folder=str(outbox)))
    assert run.success, [e.message for e in run.all_events if e.is_failure]
    written = list(outbox.rglob("*.parquet"))
    assert [p.parent.name for p in written] == [H200]
    batch = pl.read_parquet(written[0])
    assert sorted(batch["kernel_id"].to_list()) == sorted([*rows["kernel_id"].to_list(), unrecorded])
    assert {"kernel_id", "task", "source"} <= set(batch.columns)  # what the worker's --batch reads
    assert _measurements(settings).height == 0
    meta = run.get_asset_materialization_events()[0].step_materialization_data.materialization.metadata
    assert meta["profiled_here"].value == 0 and meta["rows_added"].value == 0


def test_a_run_config_picks_the_kind(settings, recorded):
    """The same swap without code: the run's config names the profiler's kind and folder."""
    folder, rows, _ = recorded
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("hardware", [H200])
    job = dg.define_asset_job("t", selection=dg.AssetSelection.assets("kernel_measurements"))
    defs = dg.Definitions.merge(build_defs(settings), dg.Definitions(jobs=[job]))
    run = defs.resolve_job_def("t").execute_in_process(
        instance=instance, partition_key=H200, raise_on_error=False,
        run_config={"resources": {"profiler": {"config": {"kind": "recorded", "folder": str(folder)}}}})
    assert run.success, [e.message for e in run.all_events if e.is_failure]
    assert sorted(_measurements(settings)["kernel_id"].to_list()) == sorted(rows["kernel_id"].to_list())


def test_default_profiler_measures_nothing_without_a_gpu_of_the_partition(settings, recorded):
    """The cuda kind on a host without an H200: ingest only, as `make run` does."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA host measures its own partition")
    run = _run(settings, ProfilerResource())
    assert run.success
    assert _measurements(settings).height == 0


@pytest.mark.parametrize(("kind", "folder", "cls"), [
    ("cuda", "", "CudaWorkerProfiler"), ("recorded", "/data/h200", "RecordedProfiler"),
    ("batch_file", "", "BatchFileProfiler")])
def test_each_kind_is_its_own_profiler_made_once(kind, folder, cls):
    resource = ProfilerResource(kind=kind, folder=folder, pin_gpu_per_step=False)
    made = resource.profiler()
    assert type(made).__name__ == cls and made.kind == kind
    assert resource.profiler() is made  # chosen once, not per call
    assert resource.pinned_gpu(3) is None  # pinning off, or no GPU at all


def test_the_cuda_worker_pins_its_step_gpu_and_a_bad_kind_is_one_line():
    assert ProfilerResource().pinned_gpu(3) == 3
    with pytest.raises(ValueError, match="unknown profiler kind 'nope'; one of cuda, recorded, batch_file"):
        ProfilerResource(kind="nope").profiler()
    with pytest.raises(ValueError, match="needs the folder"):
        ProfilerResource(kind="recorded").profiler()
