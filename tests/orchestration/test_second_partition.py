"""A second hardware partition arrives as a user's would: the H200 partition ingested, then real
H100 measurements (rewrites of H200 kernels of that partition, from data/measurements/h100)
dropped into the inbox. The inbox sensor asks for one ingest run of the new partition alone; the
run adds the H100 rows and leaves every H200 row as it was; the automation condition asks for
the downstream assets; curated again, the H200 pairs are the same, pair for pair.

Real parts: a DuckDB file, an ephemeral-in-a-folder Dagster instance, the committed files.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from asset_runs import h100_batch

REPO = Path(__file__).resolve().parents[2]
H200_DIR = REPO / "data" / "measurements" / "h200"
H200, H100 = "nvidia-h200-sm90", "nvidia-h100-80gb-hbm3-sm90"
RUN_B = "results-2026-11-29-harness1-run-b.parquet"


@pytest.fixture()
def settings(tmp_path, monkeypatch):
    data = tmp_path / "data" / "measurements" / "h200"
    data.mkdir(parents=True)
    for name in ("kernels-2026-11-29-harness1.parquet", RUN_B):
        shutil.copy(H200_DIR / name, data / name)
    for key, value in (("KERNELCAST_HOME", tmp_path / "home"), ("KERNELCAST_DATA", tmp_path / "data"),
                       ("DAGSTER_HOME", tmp_path / "home" / "dagster"), ("KERNELCAST_PROFILE", "smoke")):
        monkeypatch.setenv(key, str(value))
    from orchestration.runner import prepare_home
    from orchestration.settings import load_settings

    s = load_settings("smoke")
    prepare_home(s)
    return s


def _measurements(settings, hardware: str) -> pl.DataFrame:
    from warehouse.db import connect
    from warehouse.measurements import measurements_frame

    with connect(settings.warehouse_path, read_only=True) as con:
        return measurements_frame(con, hardware_id=hardware).drop("ingested_at", strict=False).sort("measurement_id")


def _curated(settings) -> pl.DataFrame:
    from pipelines.curation.stored import curate_and_store

    stored = curate_and_store(settings.warehouse_path, settings.curation)
    assert stored.dataset.leakage == []
    return stored.rows


def _keys(rows: pl.DataFrame, hardware: str) -> list[tuple]:
    return sorted(rows.filter(pl.col("hardware_id") == hardware)
                  .select("split", "pair_type", "anchor_kernel_id", "candidate_kernel_id", "speedup", "true_bin").rows())


def test_a_second_partition_is_backfilled_by_the_sensor_without_touching_the_first(settings):
    from orchestration.automation import REACTING
    from orchestration.cli_common import ensure_tasks
    from orchestration.definitions import build_defs
    from orchestration.resources import build_resources
    from orchestration.runner import execute_code_location_job
    from warehouse.db import connect

    with connect(settings.warehouse_path) as con:  # rows are checked against their task's cases
        ensure_tasks(con)
    defs = build_defs(settings)
    instance = dg.DagsterInstance.get()
    instance.add_dynamic_partitions("hardware", [H200])
    first = execute_code_location_job(defs, instance, "measurement_ingest_job", H200)
    assert first.success, first.error
    h200_before = _measurements(settings, H200)
    pairs_before = _curated(settings)
    assert h200_before.height and set(pairs_before["hardware_id"]) == {H200}

    _, n_rows = h100_batch(settings.inbox)
    sensor = defs.get_repository_def().get_sensor_def("measurement_inbox_sensor")
    with dg.build_sensor_context(instance=instance, instance_ref=instance.get_ref(), definitions=defs,
                                 resources=build_resources(settings)) as ctx:
        tick = sensor.evaluate_tick(ctx)
    [request] = tick.run_requests  # one run, for the new partition only
    assert request.partition_key == H100
    assert [r.partition_keys for r in tick.dynamic_partitions_requests] == [[H100]]
    instance.add_dynamic_partitions("hardware", [H100])
    auto_before = dg.evaluate_automation_conditions(defs=defs, instance=instance)
    ingest = execute_code_location_job(defs, instance, "measurement_ingest_job", H100, tags=dict(request.tags))
    assert ingest.success, ingest.error
    assert ingest.metadata["kernel_measurements"]["rows_added"] == n_rows

    # The first partition's rows are as they were; the new ones are the new partition's.
    assert _measurements(settings, H200).equals(h200_before)
    assert _measurements(settings, H100).height == n_rows
    # The downstream assets are requested by the automation condition: curation, the classical
    # forecasters of both cards and the cross-hardware report (those behind the language model wait
    # for base_model, which this test never builds; tests/orchestration/test_backfill_e2e.py has it).
    auto = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=auto_before.cursor)
    graph = defs.get_repository_def().asset_graph
    requested = {k.to_user_string() for k in graph.get_all_asset_keys() if auto.get_requested_partitions(k)}
    assert {"curated_pairs", "eval_set", "rl_training_pool", "discovery_pairs", "classical_forecasters",
            "card_forecasters", "cross_hardware_report", "card_champions"} <= requested
    assert requested <= {k.to_user_string() for k in REACTING.resolve(graph)}
    # Curated again: the H200 pairs pair for pair, the H100 ones beside them, the H200 card the reference.
    pairs_after = _curated(settings)
    assert _keys(pairs_after, H200) == _keys(pairs_before, H200)
    assert pairs_after.filter(pl.col("hardware_id") == H100).height > 0
    from pipelines.surrogates.export import version_hardware, version_roles
    from warehouse.datasets import current_dataset_version

    with connect(settings.warehouse_path, read_only=True) as con:
        version = current_dataset_version(con)
        assert version_hardware(con, version) == H200
        assert set(version_roles(con, version, None).fit["hardware_id"]) == {H200}
