"""End to end on real Dagster, DuckDB and MLflow files: empty state -> `kernelcast run` (in a
pseudo-terminal, read as a user's screen) -> a batch of
a new GPU type dropped into the inbox -> ingested once, its partition created, the downstream
assets requested by the automation condition and run -> promotion decides -> a second drop of
the same batch changes nothing.

Each reaction is a real tick against the instance `kernelcast run` left: the inbox sensor
(`evaluate_tick`) and the declarative automation (`evaluate_automation_conditions`, what the
automation sensor evaluates in the daemon); the runs they request are executed in process.
The new GPU's batch is built from committed H200 rows of run C, relabelled as an H100 batch
(another device fingerprint and batch id): the test needs a second hardware type, not new
timings. Data: two committed H200 files (run B and its kernels) to keep the run short.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_run_terminal import LIBRARY_LINE, run_in_terminal, screen_lines

REPO = Path(__file__).resolve().parents[2]
H200_DIR = REPO / "data" / "measurements" / "h200"
H200 = "nvidia-h200-sm90"
H100 = "nvidia-h100-80gb-hbm3-sm90"


def h100_batch(dst: Path) -> Path:
    """Run C's H200 rows as one H100 batch: new batch id, H100 fingerprint, same kernels."""
    table = pq.read_table(H200_DIR / "results-2026-11-29-harness1-run-c.parquet")
    fp = json.loads(table["hardware_json"][0].as_py())
    fp.update(name="NVIDIA H100 80GB HBM3", hardware_id=H100)
    n = table.num_rows
    batch_id = uuid.UUID(int=7).hex
    for col, value in (("batch_id", batch_id), ("hardware_id", H100), ("hardware_json", json.dumps(fp, sort_keys=True))):
        table = table.set_column(table.schema.get_field_index(col), col, pa.array([value] * n, pa.string()))
    pq.write_table(table, dst)
    return dst


@pytest.fixture()
def home(tmp_path, monkeypatch):
    data = tmp_path / "data" / "measurements" / "h200"
    data.mkdir(parents=True)
    for name in ("kernels-2026-11-29-harness1.parquet", "results-2026-11-29-harness1-run-b.parquet"):
        shutil.copy(H200_DIR / name, data / name)
    for key, value in (("KERNELCAST_HOME", tmp_path / "home"), ("KERNELCAST_DATA", tmp_path / "data"),
                       ("DAGSTER_HOME", tmp_path / "home" / "dagster"), ("KERNELCAST_PROFILE", "smoke")):
        monkeypatch.setenv(key, str(value))
    from orchestration.settings import load_settings

    return load_settings("smoke")


def _tick_inbox(defs, instance, settings, cursor):
    from orchestration.resources import build_resources

    sensor = defs.get_repository_def().get_sensor_def("measurement_inbox_sensor")
    # As the daemon does: the instance (by its ref) is the store of dynamic partitions.
    with dg.build_sensor_context(instance=instance, instance_ref=instance.get_ref(), cursor=cursor,
                                 definitions=defs, resources=build_resources(settings)) as ctx:
        return sensor.evaluate_tick(ctx)


def _counts(settings) -> dict[str, int]:
    from warehouse.db import connect

    with connect(settings.warehouse_path, read_only=True) as con:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("measurements", "ingested_files", "dataset_versions", "promotion_decisions")}


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_new_gpu_batch_is_ingested_once_and_backfilled_downstream(home):
    from orchestration.automation import REACTING
    from orchestration.definitions import build_defs
    from orchestration.runner import execute_code_location_job
    from warehouse.db import connect
    from warehouse.promotions import read_promotion_decisions

    settings = home
    # 1. Empty state -> `kernelcast run` in a pseudo-terminal, as a user starts it: one line per
    #    asset, the promotion decision and the table reach the screen, not one DEBUG, INFO or
    #    WARNING line of a library does; every run succeeds, one hardware partition.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("KERNELCAST_PROFILE", None)
    code, raw = run_in_terminal([sys.executable, "-m", "orchestration.cli", "run", "--profile", "smoke"], env, 1400)
    lines = screen_lines(raw)
    assert not [line for line in lines if LIBRARY_LINE.search(line)], "\n".join(lines)
    assert code is not None, "ran past 1400 s; on screen until then:\n" + "\n".join(lines[-30:])
    assert code == 0, "\n".join(lines[-30:])
    for start in ("ok kernel_tasks", "ok model_promotion", "@champion: surrogate/", "dataset ds-"):
        assert any(line.startswith(start) for line in lines), (start, lines)
    # the terminal wraps a long path: the log line goes on until the file name ends
    at = next(i for i, line in enumerate(lines) if line.startswith("log:"))
    log = lines[at].removeprefix("log:").strip()
    while not log.endswith(".log") and at + 1 < len(lines):
        at += 1
        log += lines[at].strip()
    assert Path(log).parent == settings.home / "logs" and "STEP_OUTPUT" in Path(log).read_text()
    defs = build_defs(settings)
    instance = dg.DagsterInstance.get()
    assert instance.get_dynamic_partitions("hardware") == [H200]
    runs = instance.get_runs()[::-1]
    assert [(r.job_name, r.tags.get("dagster/partition"), r.is_success) for r in runs] == [
        ("candidates_job", None, True), ("measurement_ingest_job", H200, True), ("downstream_job", None, True)]
    first = _counts(settings)
    assert first["dataset_versions"] == 1 and first["promotion_decisions"] == 2  # @champion, @champion-external

    # Nothing new: the sensor skips, automation requests nothing.
    tick = _tick_inbox(defs, instance, settings, None)
    assert tick.skip_message and not tick.run_requests
    auto = dg.evaluate_automation_conditions(defs=defs, instance=instance)
    assert auto.total_requested == 0

    # 2. A batch of a new GPU type lands in the inbox: one run for its new partition.
    batch = h100_batch(settings.inbox / "h100-batch.parquet")
    tick = _tick_inbox(defs, instance, settings, None)
    [request] = tick.run_requests
    assert request.partition_key == H100
    assert [r.partition_keys for r in tick.dynamic_partitions_requests] == [[H100]]
    instance.add_dynamic_partitions("hardware", [H100])
    ingest = execute_code_location_job(defs, instance, "measurement_ingest_job", H100, tags=dict(request.tags))
    assert ingest.success, ingest.error
    assert ingest.metadata["kernel_measurements"]["rows_added"] == pq.ParquetFile(batch).metadata.num_rows

    # 3. The automation condition requests everything downstream of the measurements, in one run.
    auto = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=auto.cursor)
    graph = defs.get_repository_def().asset_graph
    requested = {k for k in graph.get_all_asset_keys() if auto.get_requested_partitions(k)}
    assert requested == set(REACTING.resolve(graph))
    job = defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection=requested)
    backfill = job.execute_in_process(instance=instance, raise_on_error=False)
    assert backfill.success, [e.message for e in backfill.all_events if e.is_failure]

    # 4. Promotion decided on the new dataset version, which holds the H100 measurements.
    after = _counts(settings)
    assert after["measurements"] == first["measurements"] + pq.ParquetFile(batch).metadata.num_rows
    assert after["dataset_versions"] == 2 and after["promotion_decisions"] == 4
    with connect(settings.warehouse_path, read_only=True) as con:
        newest = con.execute("SELECT dataset_version FROM dataset_versions ORDER BY created_at DESC LIMIT 1").fetchone()[0]
        hw = {r[0] for r in con.execute(
            "SELECT DISTINCT m.hardware_id FROM dataset_measurements d JOIN measurements m USING (measurement_id) "
            "WHERE d.dataset_version = ?", [newest]).fetchall()}
        decision = read_promotion_decisions(con).row(0, named=True)
    assert hw == {H200, H100}
    assert decision["dataset_version"] == newest and decision["outcome"] in ("promoted", "kept", "held_back")
    assert decision["dagster_run_id"] == backfill.run_id

    # 5. The same batch dropped again, under another name: nothing is requested, nothing changes.
    shutil.copy(batch, settings.inbox / "h100-batch-again.parquet")
    again = _tick_inbox(defs, instance, settings, tick.cursor)
    assert not again.run_requests and "no new measurement content" in again.skip_message
    # A fresh cursor (e.g. a new daemon) finds both files in the warehouse's ingested_files.
    assert not _tick_inbox(defs, instance, settings, None).run_requests
    assert dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=auto.cursor).total_requested == 0
    assert _counts(settings) == after

    # The nightly schedule asks for one full run per hardware partition.
    schedule = defs.get_repository_def().get_schedule_def("nightly_schedule")
    with dg.build_schedule_context(instance=instance, repository_def=defs.get_repository_def()) as ctx:
        nightly = schedule.evaluate_tick(ctx)
    assert sorted(r.partition_key for r in nightly.run_requests) == sorted([H100, H200])
