"""The side-by-side of the worker's labels and an independent do_bench timing: bins, the median
|log2 ratio| and the disagreements over 1.5x with what explains them (CPU; the timing itself needs
a GPU)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.independent_timing import compare
from warehouse.formats import RESULT_SCHEMA


def _row(kernel_id: str, speedup: float, program: float, status: str = "ok") -> dict:
    return {"batch_id": "b", "kernel_id": kernel_id, "task": "softmax", "status": status, "protocol": "kernelcast",
            "harness_version": "h", "hardware_id": "gpu", "hardware_json": "{}", "measured_at": None,
            "case_ids": ["c"], "kernel_median_ms": [1.0 / speedup], "ref_median_ms": [1.0],
            "kernel_host_ms": [0.5], "ref_host_ms": [0.01], "speedup": speedup if status == "ok" else None,
            "program_speedup": program, "launch_bound": program < speedup}


def test_agreement_and_disagreements_are_counted(tmp_path):
    import datetime

    rows = [_row("a", 2.0, 2.0), _row("b", 10.0, 3.0), _row("c", 1.0, 1.0, status="failed")]
    for r in rows:
        r["measured_at"] = datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)
    results = tmp_path / "results.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=RESULT_SCHEMA), results)
    independent = tmp_path / "independent.jsonl"
    lines = [{"reference": "softmax", "case_ids": ["c"], "ms": [1.0]},
             {"kernel_id": "a", "task": "softmax", "case_ids": ["c"], "ms": [0.52], "speedup": 1.92},
             {"kernel_id": "b", "task": "softmax", "case_ids": ["c"], "ms": [0.33], "speedup": 3.0},
             {"kernel_id": "c", "task": "softmax", "error": "exit 1: boom"}]
    independent.write_text("\n".join(json.dumps(x) for x in lines))
    report = compare(str(results), str(independent), {"b": "softmax/wrapper"})
    assert report["kernels"] == 2 and report["same_bin"] == 1  # 2.0 vs 1.92: bin 6 both; 10 vs 3: 8 vs 7
    assert [d["kernel_id"] for d in report["over_1_5x"]] == ["b"]
    far = report["over_1_5x"][0]
    assert far["name"] == "softmax/wrapper" and far["worker_program"] == 3.0 and far["kernel_host_ms"] == [0.5]


def test_missing_or_corrupt_inputs_are_one_line(tmp_path, capsys):
    from benchmarks.independent_timing import main

    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"no")
    assert main(["compare", str(tmp_path / "missing.parquet"), str(tmp_path / "i.jsonl")]) == 2
    assert main(["compare", str(bad), str(tmp_path / "i.jsonl")]) == 2
    assert main(["time", str(bad), "--out", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and err[0].startswith("cannot compare") and err[2].startswith("cannot time")


def test_the_gpu_lock_lets_one_process_time_at_a_time(tmp_path, monkeypatch):
    """Processes timing in parallel take turns: while one holds the lock, another cannot take it."""
    import fcntl

    from benchmarks.independent_timing import LOCK_ENV, _gpu_lock

    lock = tmp_path / "gpu.lock"
    monkeypatch.setenv(LOCK_ENV, str(lock))
    with _gpu_lock(), open(lock, "a+") as other:
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            taken = True
        except BlockingIOError:
            taken = False
    assert not taken
    with open(lock, "a+") as other:  # released on leaving
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
