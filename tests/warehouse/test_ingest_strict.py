"""Strict ingest: rows the warehouse's own checks would reject are refused with one line, a
conflicting re-measurement is reported, a folder goes in file by file (the CLI exits non-zero)."""

from __future__ import annotations

import json
import math

import pyarrow.parquet as pq
import pytest
from test_warehouse_factory import H200_ID, result_row, results_table, write
from typer.testing import CliRunner

import warehouse
from orchestration.cli import app
from warehouse import checks
from warehouse.db import connect, execute
from warehouse.errors import IngestError
from warehouse.formats import RESULT_SCHEMA
from warehouse.ingest import ingest_all

TASKS = [  # two benchmark cases (the factory's "n=1", "n=2"), three correctness cases
    {"task": "softmax", "description": "Row softmax.", "benchmark_cases": [{"n": 1}, {"n": 2}],
     "correctness_cases": [{"n": 1}, {"n": 2}, {"n": 3}]},
]


@pytest.fixture
def con():
    c = connect(":memory:")
    warehouse.upsert_tasks(c, TASKS)
    yield c
    c.close()


def _rows(n: int = 4, batch: str = "b1") -> list[dict]:
    return [result_row(f"k{i}", batch_id=batch, speedup=1.0 + i) for i in range(n)]


def _refused(con, path, match: str) -> None:
    before = execute(con, "SELECT count(*) FROM measurements")[0][0]
    with pytest.raises(IngestError, match=match) as err:
        warehouse.ingest_results(con, path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    assert execute(con, "SELECT count(*) FROM measurements")[0][0] == before


@pytest.mark.parametrize(
    "spoil,match",
    [
        (lambda r: r.update(task="no_such_task"), "unknown task 'no_such_task'"),
        (lambda r: r.update(kernel_median_ms=[math.nan, 1.0]), "kernel_median_ms holds a NaN"),
        (lambda r: r.update(ref_mean_ms=[-1.0, 1.0]), "ref_mean_ms holds a NaN, infinite or non-positive"),
        (lambda r: r.update(case_speedups=[math.inf, 1.0]), "case_speedups holds"),
        (lambda r: r.update(kernel_stderr_ms=[-0.1, 0.0]), "kernel_stderr_ms holds a NaN or negative"),
        (lambda r: r.update(ref_reps=[0, 5]), "ref_reps holds a count below 1"),
        (lambda r: r.update(speedup=9.0), "not the geometric mean"),
        (lambda r: r.update(case_ids=["n=1"], **{k: [1.0] for k in ("kernel_median_ms", "kernel_mean_ms",
                                                                     "kernel_stderr_ms", "ref_median_ms",
                                                                     "ref_mean_ms", "ref_stderr_ms")},
                            kernel_reps=[1], ref_reps=[1], case_speedups=[r["speedup"]]),
         "with 1 cases, but task 'softmax' has 2"),
    ],
)
def test_rows_the_checks_reject_are_refused(con, tmp_path, spoil, match):
    rows = _rows()
    spoil(rows[2])
    _refused(con, write(results_table(rows), tmp_path / "r.parquet"), match)


def test_what_is_refused_is_what_the_asset_checks_flag(tmp_path):
    """The same short row, forced into a warehouse past ingest, is what checks.ok_without_every_case flags."""
    c = connect(":memory:")
    rows = _rows(1)
    r = rows[0]
    r.update(case_ids=["n=1"], kernel_median_ms=[1.0], kernel_mean_ms=[1.0], kernel_stderr_ms=[0.0], kernel_reps=[3],
             ref_median_ms=[1.0], ref_mean_ms=[1.0], ref_stderr_ms=[0.0], ref_reps=[3], case_speedups=[r["speedup"]])
    report = warehouse.ingest_results(c, write(results_table(rows), tmp_path / "r.parquet"))  # no tasks yet
    assert report.added == 1 and report.tasks_checked is False
    warehouse.upsert_tasks(c, TASKS)
    assert checks.ok_without_every_case(c, H200_ID)  # the check the refusal anticipates


def test_an_infinite_stderr_of_a_single_call_is_kept(con, tmp_path):
    rows = _rows(2)
    rows[0]["kernel_stderr_ms"] = [math.inf, 0.01]
    assert warehouse.ingest_results(con, write(results_table(rows), tmp_path / "r.parquet")).added == 2


def test_a_conflicting_re_measurement_is_refused_loudly(con, tmp_path):
    warehouse.ingest_results(con, write(results_table(_rows()), tmp_path / "a.parquet"))
    again = _rows()  # same batch and kernels, another speedup for one of them
    again[1].update(speedup=7.0, case_speedups=[7.0, 7.0])
    with pytest.raises(IngestError, match=r"1 row\(s\) re-measure .* speedup 2.0 before, 7.0 now") as err:
        warehouse.ingest_results(con, write(results_table(again), tmp_path / "b.parquet"))
    assert "\n" not in str(err.value)
    same = tmp_path / "c.parquet"
    pq.write_table(results_table(_rows()), same, compression="snappy")  # same values, other bytes
    assert warehouse.ingest_results(con, same).skipped == 4


def test_the_sandbox_column_is_stored_and_old_files_without_it_load(con, tmp_path):
    rows = _rows(2)
    rows[0]["sandbox"] = "env,tmpdir,netns,pidns"
    warehouse.ingest_results(con, write(results_table(rows), tmp_path / "new.parquet"))
    old = results_table(_rows(2, batch="b0")).drop_columns(["sandbox"])
    assert "sandbox" in RESULT_SCHEMA.names and "sandbox" not in old.schema.names
    warehouse.ingest_results(con, write(old, tmp_path / "old.parquet"))
    got = dict(execute(con, "SELECT batch_id || kernel_id, sandbox FROM measurements"))
    assert got == {"b1k0": "env,tmpdir,netns,pidns", "b1k1": None, "b0k0": None, "b0k1": None}


def test_a_folder_goes_in_file_by_file(con, tmp_path):
    folder = tmp_path / "inbox"
    folder.mkdir()
    write(results_table(_rows(2, batch="good1")), folder / "a.parquet")
    (folder / "b.parquet").write_bytes(b"PAR1 not parquet")
    bad = _rows(2, batch="bad")
    bad[0]["task"] = "no_such_task"
    write(results_table(bad), folder / "c.parquet")
    write(results_table(_rows(2, batch="good2")), folder / "d.parquet")
    outcome = ingest_all(con, [folder, tmp_path / "missing.parquet"])
    assert [r.path.rsplit("/", 1)[1] for r in outcome.reports] == ["a.parquet", "d.parquet"]
    assert len(outcome.errors) == 3 and all("\n" not in e for e in outcome.errors)
    assert any("b.parquet" in e for e in outcome.errors) and any("c.parquet" in e for e in outcome.errors)
    assert execute(con, "SELECT count(*) FROM measurements")[0][0] == 4
    with pytest.raises(IngestError, match="3 files refused; the others were ingested"):
        warehouse.ingest_paths(con, [folder, tmp_path / "missing.parquet"])


def test_cli_ingest_lists_bad_files_and_exits_non_zero(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    folder = tmp_path / "inbox"
    folder.mkdir()
    rows = [result_row(f"k{i}", batch_id="b", speedup=2.0, cases=4) for i in range(2)]
    for r in rows:  # the real softmax task has four benchmark cases
        r["case_ids"] = [f"M=8192,N=8192,seed={s}" for s in range(4)]
    write(results_table(rows), folder / "good.parquet")
    (folder / "broken.parquet").write_bytes(b"not parquet")
    res = CliRunner().invoke(app, ["ingest", str(folder), "--json"])
    assert res.exit_code == 2
    report = json.loads(res.stdout)
    assert [f["added"] for f in report["files"]] == [2] and len(report["errors"]) == 1
    assert "broken.parquet" in report["errors"][0]


def test_cli_measure_refuses_a_missing_batch_before_creating_anything(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("KERNELCAST_HOME", str(home))
    res = CliRunner().invoke(app, ["measure", "--batch", str(tmp_path / "gone.parquet")])
    assert res.exit_code == 2 and "gone.parquet: no such file or folder" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not home.exists()


def test_a_row_of_the_tampered_kind_is_a_failure_like_any_other(con, tmp_path):
    rows = _rows(2)
    rows[1] = result_row("k1", status="failed", failure_kind="tampered")
    assert warehouse.ingest_results(con, write(results_table(rows), tmp_path / "r.parquet")).added == 2
    assert execute(con, "SELECT failure_kind FROM measurements WHERE status = 'failed'") == [("tampered",)]


def test_a_fresh_warehouse_gets_the_task_catalogue_before_measured_rows_are_checked(tmp_path, monkeypatch):
    """`kernelcast measure` on a fresh home: without the tasks, every correct H200 row would fail
    "speedup requires correctness" (its cases cannot be compared with its task's)."""
    from pathlib import Path

    import warehouse.kernels as kernels_module
    from orchestration.cli_common import ensure_tasks
    from warehouse.ingest import ingest_path

    data = Path(__file__).resolve().parents[2] / "data" / "measurements" / "h200"
    with connect(tmp_path / "w.duckdb") as con:
        ingest_path(con, data / "kernels-2026-11-29-harness2.parquet")
        ingest_path(con, data / "results-2026-11-29-harness2-run-1.parquet")
        assert checks.ok_without_every_case(con, H200_ID)  # rows whose task is unknown here
        ensure_tasks(con)
        calls = []
        monkeypatch.setattr(kernels_module, "upsert_tasks", lambda *a, **k: calls.append(a))
        ensure_tasks(con)  # a warehouse that has them: nothing written again
        assert calls == []
        assert checks.ok_without_every_case(con, H200_ID) == []
        (n, distinct), = execute(con, "SELECT count(*), count(DISTINCT task) FROM tasks")
        assert n == distinct >= 9
