"""Candidates of several tasks at once: the rows of one `build_candidates` per task, compile
records taken from the committed compile-features files where they have the kernel."""

from __future__ import annotations

import polars as pl

from pipelines.generation import aot
from pipelines.generation.candidates import (
    build_candidates,
    build_candidates_many,
    committed_compile_features,
    sample_records,
)

TASKS = ("softmax", "rms_norm")


def test_many_tasks_give_the_rows_of_one_call_per_task():
    many, compiled = build_candidates_many(TASKS, 3, seed=0, compile=False)
    one = pl.concat([build_candidates(t, 3, seed=0, compile=False) for t in TASKS])
    assert compiled == 0
    assert many.equals(one)


def test_known_compile_records_are_used_not_compiled():
    records = [r for t in TASKS for r in sample_records(t, 2, 0)]
    known = {r["kernel_id"]: aot.Features("compiled", n_regs=40 + i, n_spills=0, shared_bytes=1024, n_kernels=1,
                                          n_launches=1, seconds=0.5) for i, r in enumerate(records)}
    frame, compiled = build_candidates_many(TASKS, 2, seed=0, compile=True, known=known)
    assert compiled == 2  # only the two PyTorch reference rows go to compile_many (and are skipped there)
    triton = frame.filter(pl.col("language") == "triton")
    assert triton["n_regs"].to_list() == [40 + i for i in range(len(records))]
    assert set(triton["compile_status"]) == {"compiled"} and set(triton["compile_target"]) == {"sm_90"}
    assert set(frame.filter(pl.col("language") != "triton")["compile_status"]) == {"skipped"}


def test_committed_compile_features_keep_kept_statuses_of_the_target(tmp_path):
    pl.DataFrame({"kernel_id": ["a", "b", "c", "d"], "target": ["sm_90", "sm_90", "sm_80", "sm_90"],
                  "status": ["compiled", "error", "compiled", "rejected"], "n_regs": [32, None, 64, None],
                  "n_spills": [0, None, 0, None], "shared_bytes": [0, None, 0, None], "n_kernels": [1, 0, 1, 0],
                  "n_launches": [1, 0, 1, 0], "error": [None, "x", None, "too much shared memory"],
                  "seconds": [1.0, 0.1, 1.0, 0.2]}).write_parquet(tmp_path / "compile-features-1.parquet")
    # a source-features file (compile_status column) is another table's, never read here
    pl.DataFrame({"kernel_id": ["e"], "target": ["sm_90"], "status": ["ok"], "compile_status": ["compiled"]}) \
        .write_parquet(tmp_path / "source-features-1.parquet")
    (tmp_path / "broken.parquet").write_text("not parquet")
    known = committed_compile_features(tmp_path)
    assert sorted(known) == ["a", "d"]
    assert known["a"].n_regs == 32 and known["a"].status == "compiled"
    assert known["d"].status == "rejected" and known["d"].error == "too much shared memory"
