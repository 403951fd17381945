"""Ingest of result and kernel files: atomic per file, idempotent by content and by row."""

from __future__ import annotations

import json
import math
import shutil

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_warehouse_factory import (
    A100,
    A100_ID,
    H200,
    H200_ID,
    kernel_row,
    kernel_table,
    result_row,
    results_table,
    write,
)

import warehouse
from warehouse.db import connect, execute
from warehouse.errors import IngestError
from warehouse.formats import RESULT_SCHEMA, measurement_id

WRITTEN_TABLES = ("measurements", "ingested_files", "hardware", "batches", "kernels")


@pytest.fixture
def con():
    c = connect(":memory:")
    yield c
    c.close()


def _counts(con) -> dict[str, int]:
    return {t: execute(con, f"SELECT count(*) FROM {t}")[0][0] for t in WRITTEN_TABLES}


def _kernels(n: int = 4) -> list[dict]:
    return [kernel_row(i) for i in range(n)]


def _results(kernels: list[dict], batch_id: str = "batch-1") -> list[dict]:
    rows = [
        result_row(k["kernel_id"], batch_id=batch_id, speedup=0.5 + i)
        for i, k in enumerate(kernels[:-1])
    ]
    rows.append(
        result_row(
            kernels[-1]["kernel_id"], batch_id=batch_id, status="failed", failure_kind="incorrect"
        )
    )
    return rows


def _assert_refused(con, path, match: str) -> None:
    before = _counts(con)
    with pytest.raises(IngestError, match=match) as err:
        warehouse.ingest_path(con, path)
    assert "\n" not in str(err.value)
    assert str(path) in str(err.value)
    assert _counts(con) == before


def _with_readings(row: dict, **smi: str) -> None:
    fp = json.loads(row["hardware_json"])
    fp["nvidia_smi"] = {"driver_version": "580.159.04", "clocks_max_sm": "1980", **smi}
    row["hardware_json"] = json.dumps(fp)


def test_a_resumed_run_whose_gpu_warmed_up_is_one_device(con, tmp_path):
    """A worker run resumed on the same file and GPU reads another temperature and clock: the
    batch is still one device; another driver is not."""
    rows = _results(_kernels(6))
    for i, row in enumerate(rows):
        _with_readings(row, temperature_gpu="37" if i < 3 else "43", clocks_sm="1980" if i < 3 else "1755")
    report = warehouse.ingest_results(con, write(results_table(rows), tmp_path / "resumed.parquet"))
    assert report.added == 6 and _counts(con)["measurements"] == 6
    rows = _results(_kernels(6), batch_id="batch-2")
    for i, row in enumerate(rows):
        _with_readings(row, temperature_gpu="37", **({"driver_version": "999"} if i >= 3 else {}))
    _assert_refused(con, write(results_table(rows), tmp_path / "two-drivers.parquet"), "mixes hardware fingerprints")


def test_valid_results_file_adds_rows_then_nothing(con, tmp_path):
    kernels = _kernels()
    path = write(results_table(_results(kernels)), tmp_path / "results.parquet")

    first = warehouse.ingest_results(con, path)
    assert (first.kind, first.rows, first.added, first.skipped) == ("results", 4, 4, 0)
    assert first.unknown_kernels == 4  # kernels not ingested yet: counted, not refused
    ids = {r[0] for r in execute(con, "SELECT measurement_id FROM measurements")}
    assert ids == {measurement_id("batch-1", k["kernel_id"]) for k in kernels}

    again = warehouse.ingest_results(con, path)
    assert (again.added, again.skipped, again.duplicate_file) == (0, 4, True)

    copy = shutil.copy(path, tmp_path / "renamed.parquet")
    assert [r.added for r in warehouse.ingest_path(con, copy)] == [0]
    assert _counts(con)["measurements"] == 4
    assert _counts(con)["ingested_files"] == 1


def test_same_rows_in_other_bytes_add_nothing(con, tmp_path):
    table = results_table(_results(_kernels()))
    warehouse.ingest_results(con, write(table, tmp_path / "a.parquet"))
    other = tmp_path / "b.parquet"
    pq.write_table(table, other, compression="snappy")  # same rows, different file bytes
    report = warehouse.ingest_results(con, other)
    assert (report.added, report.skipped, report.duplicate_file) == (0, 4, False)
    assert _counts(con)["measurements"] == 4
    assert _counts(con)["ingested_files"] == 2


def test_measurement_columns_round_trip(con, tmp_path):
    kernels = _kernels(2)
    warehouse.ingest_results(con, write(results_table(_results(kernels)), tmp_path / "r.parquet"))
    ok = warehouse.measurements_frame(con).filter(pl.col("status") == "ok").row(0, named=True)
    assert ok["case_ids"] == ["n=1", "n=2"]
    assert ok["kernel_median_ms"] == [1.0, 1.0] and ok["ref_reps"] == [100, 100]
    assert ok["speedup"] == 0.5 and ok["case_speedups"] == [0.5, 0.5]
    assert ok["hardware_id"] == H200_ID and ok["protocol"] == "kernelcast"
    assert ok["source_file"].endswith("r.parquet")
    failed = (
        warehouse.measurements_frame(con).filter(pl.col("status") == "failed").row(0, named=True)
    )
    assert failed["failure_kind"] == "incorrect" and failed["speedup"] is None


def test_hardware_row_is_registered_from_fingerprint(con, tmp_path):
    warehouse.ingest_results(
        con, write(results_table(_results(_kernels())), tmp_path / "r.parquet")
    )
    hw = warehouse.read_hardware(con).row(0, named=True)
    assert hw["hardware_id"] == "nvidia-h200-sm90"
    assert (hw["device_name"], hw["capability"], hw["sm_count"]) == ("NVIDIA H200", "9.0", 132)
    assert hw["memory_gb"] == pytest.approx(150.0)
    assert (hw["driver_version"], hw["torch_version"], hw["triton_version"]) == (
        "570.86",
        "2.13.0",
        "3.6.0",
    )
    assert json.loads(hw["fingerprint_json"]) == H200
    assert execute(con, "SELECT batch_id, hardware_id FROM batches") == [("batch-1", H200_ID)]


@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_truncated_file_is_refused(con, tmp_path, keep):
    good = write(results_table(_results(_kernels())), tmp_path / "good.parquet")
    data = good.read_bytes()
    bad = tmp_path / "truncated.parquet"
    bad.write_bytes(data[: int(len(data) * keep)])
    _assert_refused(con, bad, "not a readable Parquet file")


def test_garbage_file_is_refused(con, tmp_path):
    bad = tmp_path / "garbage.parquet"
    bad.write_bytes(b"PAR1 this is not parquet at all")
    _assert_refused(con, bad, "not a readable Parquet file")


def test_missing_column_is_refused(con, tmp_path):
    table = results_table(_results(_kernels())).drop_columns(["speedup"])
    _assert_refused(con, write(table, tmp_path / "r.parquet"), "missing column 'speedup'")


def test_wrong_typed_column_is_refused(con, tmp_path):
    table = results_table(_results(_kernels()))
    idx = table.schema.get_field_index("speedup")
    table = table.set_column(
        idx, "speedup", pa.array([str(v) for v in table.column("speedup").to_pylist()])
    )
    _assert_refused(
        con, write(table, tmp_path / "r.parquet"), "column 'speedup' is string, expected double"
    )


def test_null_in_required_column_is_refused(con, tmp_path):
    rows = _results(_kernels())
    rows[1]["protocol"] = None
    table = pa.Table.from_pylist(
        rows,
        schema=RESULT_SCHEMA.set(
            RESULT_SCHEMA.get_field_index("protocol"), pa.field("protocol", pa.string())
        ),
    )
    _assert_refused(con, write(table, tmp_path / "r.parquet"), "'protocol' has 1 null")


def _spoil(kind: str, row: dict) -> None:
    """Make one row of a batch invalid in a named way."""
    if kind == "ok_null_speedup":
        row["speedup"] = None
    elif kind in ("nan", "inf", "zero", "negative"):
        row["speedup"] = {"nan": math.nan, "inf": math.inf, "zero": 0.0, "negative": -1.0}[kind]
    elif kind == "unknown_failure_kind":
        row.update(status="failed", failure_kind="cosmic_ray", speedup=None)
    elif kind == "failed_without_kind":
        row.update(status="failed", failure_kind=None, speedup=None)
    elif kind == "failed_with_speedup":
        row.update(status="failed", failure_kind="incorrect", speedup=2.0)
    elif kind == "unknown_status":
        row["status"] = "maybe"
    elif kind == "mixed_fingerprint":
        row["hardware_json"] = json.dumps({**H200, "driver_version": "999"})
    elif kind == "mixed_hardware_id":
        row.update(hardware_id=A100_ID, hardware_json=json.dumps(A100))
    elif kind == "misaligned_lists":
        row["kernel_median_ms"] = [1.0]
    else:  # pragma: no cover - a typo in the parametrisation
        raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind,match",
    [
        ("ok_null_speedup", "status ok with null speedup"),
        ("nan", "must be finite and > 0"),
        ("inf", "must be finite and > 0"),
        ("zero", "must be finite and > 0"),
        ("negative", "must be finite and > 0"),
        ("unknown_failure_kind", "unknown failure kind 'cosmic_ray'"),
        ("failed_without_kind", "without a failure_kind"),
        ("failed_with_speedup", "no speedup without correctness"),
        ("unknown_status", "status 'maybe'"),
        ("mixed_fingerprint", "mixes hardware fingerprints"),
        ("mixed_hardware_id", "mixes hardware fingerprints"),
        ("misaligned_lists", "kernel_median_ms is not aligned"),
    ],
)
def test_half_valid_batch_writes_nothing(con, tmp_path, kind, match):
    rows = _results(_kernels(8))
    _spoil(kind, rows[5])
    _assert_refused(con, write(results_table(rows), tmp_path / "half.parquet"), match)


def test_unparseable_fingerprint_is_refused(con, tmp_path):
    rows = _results(_kernels())
    for r in rows:
        r["hardware_json"] = "{not json"
    _assert_refused(
        con, write(results_table(rows), tmp_path / "r.parquet"), "hardware_json is not valid JSON"
    )


def test_repeated_kernel_in_batch_is_refused(con, tmp_path):
    rows = _results(_kernels())
    rows.append(dict(rows[0]))
    _assert_refused(
        con, write(results_table(rows), tmp_path / "r.parquet"), "appears twice in batch"
    )


def test_batch_seen_with_other_fingerprint_is_refused(con, tmp_path):
    kernels = _kernels()
    warehouse.ingest_results(
        con, write(results_table(_results(kernels[:2])), tmp_path / "a.parquet")
    )
    later = [
        result_row(k["kernel_id"], fingerprint={**H200, "driver_version": "1"}) for k in kernels[2:]
    ]
    _assert_refused(
        con,
        write(results_table(later), tmp_path / "b.parquet"),
        "ingested before with another hardware",
    )


def test_two_batches_on_two_devices_in_one_file(con, tmp_path):
    kernels = _kernels(2)
    rows = _results(kernels, batch_id="h200") + [
        {**r, "batch_id": "a100", "hardware_id": A100_ID, "hardware_json": json.dumps(A100)}
        for r in _results(kernels, batch_id="a100")
    ]
    report = warehouse.ingest_results(con, write(results_table(rows), tmp_path / "r.parquet"))
    assert report.added == 4
    assert warehouse.read_hardware(con)["hardware_id"].to_list() == [A100_ID, H200_ID]
    assert warehouse.measurements_frame(con, hardware_id=A100_ID).height == 2


def test_polars_written_file_is_accepted(con, tmp_path):
    """polars writes large_string/large_list; they are the same data."""
    path = tmp_path / "polars.parquet"
    pl.from_arrow(results_table(_results(_kernels()))).write_parquet(path)
    assert pq.read_schema(path).field("task").type == pa.large_string()
    assert warehouse.ingest_file(con, path).added == 4


def test_kernel_file_ingest_and_mismatch(con, tmp_path):
    kernels = _kernels()
    path = write(kernel_table(kernels), tmp_path / "k.parquet")
    report = warehouse.ingest_kernels(con, path)
    assert (report.kind, report.rows, report.added) == ("kernels", 4, 4)
    assert warehouse.ingest_kernels(con, path).duplicate_file

    more = [kernel_row(10), {**kernel_row(11), "kernel_id": kernel_row(12)["kernel_id"]}]
    _assert_refused(
        con, write(kernel_table(more), tmp_path / "bad.parquet"), "does not match its source"
    )


def test_plain_batch_file_is_a_kernels_file(con, tmp_path):
    """A BATCH_SCHEMA file (no lineage columns) still registers its kernels."""
    rows = [{k: r[k] for k in ("kernel_id", "task", "source")} for r in _kernels(2)]
    report = warehouse.ingest_file(
        con, write(pa.Table.from_pylist(rows), tmp_path / "batch.parquet")
    )
    assert (report.kind, report.added) == ("kernels", 2)
    assert warehouse.read_kernels(con)["generator"].null_count() == 2


def test_unrecognised_file_is_refused(con, tmp_path):
    path = write(pa.table({"a": [1]}), tmp_path / "other.parquet")
    _assert_refused(con, path, "neither a results file")


def test_wrong_kind_for_typed_ingest(con, tmp_path):
    path = write(kernel_table(_kernels(1)), tmp_path / "k.parquet")
    with pytest.raises(IngestError, match="looks like a kernels file, expected results"):
        warehouse.ingest_results(con, path)


def test_directory_ingests_kernels_before_results(con, tmp_path):
    kernels = _kernels()
    # Named so that the results file sorts first: order must come from the kind, not the name.
    write(results_table(_results(kernels)), tmp_path / "a_results.parquet")
    write(kernel_table(kernels), tmp_path / "b_kernels.parquet")
    (tmp_path / "notes.txt").write_text("ignored")

    reports = warehouse.ingest_path(con, tmp_path)
    assert [(r.kind, r.rows, r.added, r.unknown_kernels) for r in reports] == [
        ("kernels", 4, 4, 0),
        ("results", 4, 4, 0),
    ]
    again = warehouse.ingest_path(con, tmp_path)
    assert [(r.added, r.skipped) for r in again] == [(0, 4), (0, 4)]


def test_ingest_paths_mixes_files_and_dirs(con, tmp_path):
    kernels = _kernels()
    sub = tmp_path / "inbox"
    sub.mkdir()
    r = write(results_table(_results(kernels)), tmp_path / "r.parquet")
    write(kernel_table(kernels), sub / "k.parquet")
    reports = warehouse.ingest_paths(con, [r, sub])
    assert [x.kind for x in reports] == ["kernels", "results"]
    with pytest.raises(IngestError, match="no such file or directory"):
        warehouse.ingest_paths(con, [tmp_path / "missing.parquet"])


def test_hardware_id_must_match_fingerprint(con, tmp_path):
    rows = _results(_kernels())
    for r in rows:
        r["hardware_json"] = json.dumps({**H200, "hardware_id": A100_ID})
    _assert_refused(con, write(results_table(rows), tmp_path / "r.parquet"), "fingerprint says")


WORKER_FP = {  # as pipelines/profiling/hardware.cuda_fingerprint writes it
    "kind": "cuda",
    "name": "NVIDIA H200",
    "compute_capability": [9, 0],
    "sm_count": 132,
    "total_memory_bytes": 150 * 1024**3,
    "l2_cache_bytes": 0,
    "torch": "2.13.0",
    "cuda": "12.8",
    "triton": "3.6.0",
    "nvidia_smi": {"driver_version": "570.86", "clocks_sm": "1500", "clocks_max_sm": "1980"},
    "hardware_id": H200_ID,
}


@pytest.mark.parametrize(
    "fp,expected",
    [
        (
            WORKER_FP,
            {
                "device_name": "NVIDIA H200",
                "capability": "9.0",
                "sm_count": 132,
                "memory_gb": 150.0,
                "l2_bytes": None,
                "sm_clock_mhz": 1980.0,
                "driver_version": "570.86",
                "cuda_version": "12.8",
            },
        ),
        (
            {"kind": "cpu", "name": "x86_64", "torch": "2.13.0", "hardware_id": "cpu"},
            {
                "device_name": "x86_64",
                "capability": None,
                "sm_count": None,
                "torch_version": "2.13.0",
            },
        ),
        ({"device_name": "GPU", "capability": "sm_90"}, {"capability": "9.0"}),
    ],
)
def test_hardware_row_reads_fingerprint_spellings(fp, expected):
    from warehouse.hardware import hardware_row

    row = hardware_row("x", fp)
    assert {k: row[k] for k in expected} == expected
    assert json.loads(row["fingerprint_json"]) == fp
