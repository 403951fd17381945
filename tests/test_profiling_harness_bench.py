"""The harness benchmark's CPU-testable parts: the kernel draw, the protocol comparison, the
submissions table, and the whole benchmark (pipelines.profiling.harness_bench) on the CPU
(Triton interpreter) with a GPU MODE-style submission written for these tests."""

from __future__ import annotations

import collections
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.profiling import harness_bench
from pipelines.profiling import protocol_bench as bench
from pipelines.profiling.formats import RESULT_SCHEMA

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data" / "measurements" / "h200"


def test_the_draw_is_deterministic_spread_and_measured_correct_before():
    first = bench.draw_kernels(DATA, 100)
    assert [r["kernel_id"] for r in first] == [r["kernel_id"] for r in bench.draw_kernels(DATA, 100)]
    counts = collections.Counter(r["task"] for r in first)
    assert len(first) == 100 and counts["trimul"] == 2 and set(counts.values()) == {2, 12, 13} and len(counts) == 9
    ok = bench.measured_ok(sorted(DATA.glob("results-*.parquet")))
    assert all(r["kernel_id"] in ok and "def custom_kernel" in r["source"] for r in first)
    other = bench.draw_kernels(DATA, 100, seed=1)
    assert {r["kernel_id"] for r in other} != {r["kernel_id"] for r in first}


def _row(kid, task, status="ok", kc=(1.0, 2.0), speedup=2.0, cases=("a", "b")):
    return {"kernel_id": kid, "task": task, "status": status, "failure_kind": None if status == "ok" else status,
            "error": None, "case_ids": list(cases), "kernel_median_ms": list(kc), "kernel_mean_ms": list(kc),
            "speedup": speedup}


def test_compare_takes_ratios_of_kernels_correct_under_both():
    kc = [_row("k1", "t", kc=(1.0, 2.0), speedup=3.0), _row("k2", "t", kc=(2.0, 2.0), speedup=1.0),
          _row("k3", "u", status="incorrect")]
    gm = [_row("k1", "t", kc=(2.0, 8.0), speedup=1.5), _row("k2", "t", kc=(2.0, 2.0), speedup=1.0),
          _row("k3", "u", kc=(1.0, 1.0))]
    c = bench.compare(kc, gm)
    # k1: sqrt(1/2 * 2/8) = 0.3536, k2: 1.0
    assert c["both_ok"] == 2 and c["time_ratio"]["median"] == pytest.approx((0.35355 + 1.0) / 2, rel=1e-4)
    assert c["speedup_ratio"]["p95"] <= 2.0 and c["disagree"] == ["k3"]
    assert c["status"]["kernelcast"] == {"ok": 2, "incorrect": 1}


def test_submissions_table_gives_gpu_modes_score():
    sub = bench.SUBMISSION_PREFIX + "x"
    table = bench.submissions_table([_row(sub, "trimul", kc=(1.0, 4.0))], [_row(sub, "trimul", status="crashed")])
    assert table[0]["submission"] == "x" and table[0]["kernelcast"]["score_us"] == pytest.approx(2000.0)
    assert table[0]["gpumode"]["status"] == "crashed"


@pytest.mark.slow
def test_the_benchmark_runs_end_to_end_on_the_cpu(tmp_path, capsys):
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(REPO / "tests" / "fixtures_kernels" / "gpumode" / "trimul_submission.py", subs)
    out = tmp_path / "out"
    code = harness_bench.main(["--out", str(out), "--device", "cpu", "--n", "2", "--tasks", "softmax,rms_norm",
                               "--submissions", str(subs), "--no-fault", "--deadline-s", "200"])
    res = capsys.readouterr()
    assert code == 0, res.err[-2000:]
    assert "kernel time kernelcast/gpumode: median" in res.out and "trimul_submission" in res.out
    files = {f.name for f in out.iterdir()}
    assert files == {"results-kernelcast.parquet", "results-gpumode.parquet", "submissions-kernelcast.parquet",
                     "submissions-gpumode.parquet", "bench-batch.parquet", "bench-summary.json"}
    for p in ("kernelcast", "gpumode"):
        t = pq.read_table(out / f"results-{p}.parquet")
        assert t.schema.equals(RESULT_SCHEMA) and t.num_rows == 2
        assert set(t.column("protocol").to_pylist()) == {p} and set(t.column("status").to_pylist()) == {"ok"}
        s = pq.read_table(out / f"submissions-{p}.parquet").to_pylist()
        assert len(s) == 1 and s[0]["status"] == "ok", s
    summary = json.loads((out / "bench-summary.json").read_text())
    assert summary["comparison"]["both_ok"] == 2 and summary["sandbox"]["gpumode"].startswith("sandbox: ")


def test_on_one_gpu_gpumode_measures_exactly_what_kernelcast_finished(tmp_path):
    import pyarrow as pa

    batch = tmp_path / "batch.parquet"
    pq.write_table(pa.table({"kernel_id": ["a", "b", "c"], "task": ["softmax"] * 3, "source": ["x", "y", "z"]}), batch)
    assert harness_bench._finished_batch(batch, tmp_path / "none.parquet", tmp_path / "g.parquet") == batch
    out = tmp_path / "raw.parquet"
    pq.write_table(pa.table({"kernel_id": ["c", "a"]}), out)
    sub = harness_bench._finished_batch(batch, out, tmp_path / "g.parquet")
    assert pq.read_table(sub).column("kernel_id").to_pylist() == ["a", "c"]  # batch order, sources kept
    assert pq.read_table(sub).column("source").to_pylist() == ["x", "z"]
