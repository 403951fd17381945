"""The profiling benchmarks (benchmarks.profiling) on small result files: the batch
bookkeeping between the calls on a GPU host (subset, remaining) and the repeatability comparison."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks import profiling


def _results(path: Path, speedups: dict[str, float | None]) -> str:
    n = len(speedups)
    pq.write_table(pa.table({
        "kernel_id": list(speedups), "status": ["ok" if s else "failed" for s in speedups.values()],
        "failure_kind": [None if s else "incorrect" for s in speedups.values()],
        "speedup": list(speedups.values()), "protocol": ["kernelcast"] * n,
        "kernel_median_ms": [[1.0, 2.0]] * n, "kernel_stderr_ms": [[0.001, 0.004]] * n}), path)
    return str(path)


def test_remaining_keeps_batch_order_and_retries_only_infrastructure_failures(tmp_path):
    batch = tmp_path / "batch.parquet"
    pq.write_table(pa.table({"kernel_id": ["k1", "k2", "k3", "k4", "k5"], "source": ["s"] * 5}), batch)
    run1 = _results(tmp_path / "r1.parquet", {"k2": 1.5, "k9": 2.0})
    run2 = tmp_path / "r2.parquet"  # k4 was wrong (done); k5 lost to a harness fault (retried)
    pq.write_table(pa.table({"kernel_id": ["k4", "k5"], "status": ["failed", "failed"],
                             "failure_kind": ["incorrect", "infrastructure"]}), run2)
    out = tmp_path / "rest.parquet"
    report = profiling.remaining(str(batch), [run1, str(run2)], str(out))
    assert report == {"batch": 5, "done": 2, "remaining": 3, "out": str(out)}
    assert pq.read_table(out).column("kernel_id").to_pylist() == ["k1", "k3", "k5"]
    assert pq.read_table(out).column_names == ["kernel_id", "source"]


def test_subset_picks_only_correct_kernels_deterministically(tmp_path):
    batch = tmp_path / "batch.parquet"
    ids = [f"k{i}" for i in range(10)]
    pq.write_table(pa.table({"kernel_id": ids}), batch)
    run = _results(tmp_path / "r.parquet", {k: (None if k in ("k0", "k1") else 1.0 + i) for i, k in enumerate(ids)})
    a = profiling.subset(run, str(batch), 5, str(tmp_path / "a.parquet"), seed=3)
    profiling.subset(run, str(batch), 5, str(tmp_path / "b.parquet"), seed=3)
    picked = pq.read_table(tmp_path / "a.parquet").column("kernel_id").to_pylist()
    assert a["written"] == 5 and picked == pq.read_table(tmp_path / "b.parquet").column("kernel_id").to_pylist()
    assert not {"k0", "k1"} & set(picked)


def test_remaining_cli_reports_a_missing_file_in_one_line(tmp_path, capsys):
    code = profiling.main(["remaining", str(tmp_path / "nope.parquet"), str(tmp_path / "r.parquet"),
                                 "--out", str(tmp_path / "x.parquet")])
    assert code == 2 and capsys.readouterr().err.startswith("error:")


@pytest.mark.parametrize("shift", [1.0, 1.1])
def test_compare_measures_the_log2_ratio_between_runs(tmp_path, shift):
    a = _results(tmp_path / "a.parquet", {f"k{i}": 1.0 + i for i in range(20)})
    b = _results(tmp_path / "b.parquet", {f"k{i}": (1.0 + i) * shift for i in range(20)})
    report = profiling.compare(a, b)
    assert report["common"] == 20 and report["spearman"] == pytest.approx(1.0)
    assert report["median_abs_log2"] == pytest.approx(math.log2(shift), abs=1e-9)
    assert report["p95_abs_log2"] == pytest.approx(math.log2(shift), abs=1e-9)
    assert report["spread_a"] == {"cases": 40, "median_rel_stderr": pytest.approx(0.0015),
                                  "p95_rel_stderr": pytest.approx(0.002)}


def test_throughput_counts_correct_kernels_per_hour_and_the_measuring_share(tmp_path):
    import datetime as dt
    import json

    t0 = dt.datetime(2026, 11, 29, 17, 0, tzinfo=dt.UTC)
    n = 4
    pq.write_table(pa.table({
        "kernel_id": [f"k{i}" for i in range(n)], "status": ["ok", "ok", "ok", "failed"],
        "measured_at": [t0 + dt.timedelta(seconds=10 * i) for i in range(n)],
        "compile_s": [1.0] * n, "check_s": [0.5, 0.5, 0.5, None], "time_s": [2.0, 2.0, 2.0, None]}), tmp_path / "r.parquet")
    (tmp_path / "s.json").write_text(json.dumps({"elapsed_s": 30.0, "measured_now": n}))
    report = profiling.throughput(str(tmp_path / "r.parquet"), str(tmp_path / "s.json"))
    assert report["ok_per_gpu_hour"] == pytest.approx(3 / 30 * 3600)
    assert report["ok_per_gpu_hour_steady"] == pytest.approx(3 / 30 * 3600)  # 30 s from first to last row
    assert report["measuring_share"] == pytest.approx(7.5 / 30)
    assert report["median_time_s"] == 2.0


def test_throughput_many_sums_correct_kernels_over_gpu_seconds(tmp_path):
    import datetime as dt
    import json

    t0 = dt.datetime(2026, 11, 29, 17, 0, tzinfo=dt.UTC)
    for name, statuses, wall in (("a", ["ok", "ok", "failed"], 30.0), ("b", ["ok"] * 5, 60.0)):
        n = len(statuses)
        pq.write_table(pa.table({
            "kernel_id": [f"{name}{i}" for i in range(n)], "status": statuses,
            "measured_at": [t0 + dt.timedelta(seconds=i) for i in range(n)],
            "compile_s": [1.0] * n, "check_s": [0.1] * n, "time_s": [0.2] * n}), tmp_path / f"results-{name}.parquet")
        (tmp_path / f"summary-{name}.json").write_text(json.dumps({"elapsed_s": wall, "measured_now": n}))
    report = profiling.throughput_many([str(tmp_path / "results-a.parquet"), str(tmp_path / "results-b.parquet")])
    assert (report["correct"], report["gpu_s"]) == (7, 90.0)
    assert report["ok_per_gpu_hour"] == round(7 / 90 * 3600)
    assert report["results-a"].startswith("2 correct in 30.0 s")
    (tmp_path / "summary-b.json").unlink()
    with pytest.raises(OSError, match="no run summary beside it"):
        profiling.throughput_many([str(tmp_path / "results-b.parquet")])

