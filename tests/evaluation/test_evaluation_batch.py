"""The report's batch evaluation: the same numbers as one `evaluate_forecasts` per forecaster,
identical rows evaluated once, results read back from the cache, and worker processes giving
the same answer as this process."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from pipelines.evaluation import batch
from pipelines.evaluation.evaluate import evaluate_forecasts


def _forecasts(ref: str, n: int = 60, seed: int = 0, ties: bool = False) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(8), size=n)
    if ties:  # a coarse forecaster: many equal scores, the tie rules of the utility metric
        p = np.round(p, 1) + 1e-3
        p = p / p.sum(axis=1, keepdims=True)
    data = {"pair_id": [f"p{i}" for i in range(n)], "task": [f"t{i % 3}" for i in range(n)],
            "true_speedup": np.exp(rng.normal(0, 1, n)), "candidate_kernel_id": [f"k{i}" for i in range(n)],
            "anchor_kernel_id": [f"a{i % 3}" for i in range(n)], "model_ref": [ref] * n}
    data.update({f"p{j + 1}": p[:, j] for j in range(8)})
    return pl.DataFrame(data)


def test_batch_equals_one_evaluation_per_forecaster(tmp_path):
    a, b = _forecasts("m:a", seed=1), _forecasts("m:b", seed=2, ties=True)
    out = batch.evaluate_splits({"in_distribution": pl.concat([a, b])}, n_boot=20, workers=1, cache_dir=tmp_path)
    for ref, frame in (("m:a", a), ("m:b", b)):
        assert out["in_distribution"][ref] == evaluate_forecasts(frame.drop("model_ref"), n_boot=20, seed=0)


def test_identical_rows_are_evaluated_once_and_read_back(tmp_path):
    a = _forecasts("m:a", seed=3)
    lines: list[str] = []
    out = batch.evaluate_splits({"in_distribution": a, "source_only": a.sample(fraction=1.0, shuffle=True, seed=1)},
                                n_boot=10, workers=1, cache_dir=tmp_path, progress=lines.append)
    assert out["in_distribution"]["m:a"] == out["source_only"]["m:a"]
    assert out["in_distribution"]["m:a"] is not out["source_only"]["m:a"]  # copies, not one object
    assert sum("evaluated" in line for line in lines) == 1  # row order does not make a new job
    assert len(list(tmp_path.glob("*.json"))) == 1
    lines.clear()
    again = batch.evaluate_splits({"in_distribution": a}, n_boot=10, workers=1, cache_dir=tmp_path, progress=lines.append)
    assert again["in_distribution"]["m:a"] == out["in_distribution"]["m:a"]
    assert lines == ["m:a (in_distribution): unchanged, read back"]
    # Another n_boot, or a changed forecast, is another result.
    batch.evaluate_splits({"in_distribution": a}, n_boot=11, workers=1, cache_dir=tmp_path)
    changed = a.with_columns(pl.when(pl.col("pair_id") == "p0").then(pl.col("true_speedup") * 2)
                             .otherwise(pl.col("true_speedup")).alias("true_speedup"))
    batch.evaluate_splits({"in_distribution": changed}, n_boot=10, workers=1, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.json"))) == 3
    # A column the evaluation does not read (when the row was written) is not a new result.
    stamped = a.with_columns(pl.lit("2026-12-02T05:00:00").alias("created_at"), pl.lit(0.5).alias("latency_s"))
    batch.evaluate_splits({"in_distribution": stamped}, n_boot=10, workers=1, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.json"))) == 3


def test_a_torn_cache_file_is_evaluated_again(tmp_path):
    a = _forecasts("m:a", seed=4)
    first = batch.evaluate_splits({"s": a}, n_boot=5, workers=1, cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.json")
    path.write_text('{"n": 3')  # a run killed mid-write
    assert batch.evaluate_splits({"s": a}, n_boot=5, workers=1, cache_dir=tmp_path) == first
    assert json.loads(path.read_text()) == first["s"]["m:a"]


def test_worker_processes_give_the_same_results(tmp_path):
    frames = pl.concat([_forecasts(f"m:{i}", seed=i, ties=i % 2 == 1) for i in range(3)])
    here = batch.evaluate_splits({"in_distribution": frames}, n_boot=8, workers=1)
    there = batch.evaluate_splits({"in_distribution": frames}, n_boot=8, workers=2)
    assert here == there


def test_bad_forecasts_are_a_one_line_error():
    bad = _forecasts("m:a").with_columns(pl.lit(-1.0).alias("true_speedup"))
    with pytest.raises(ValueError, match="true_speedup must be finite"):
        batch.evaluate_splits({"in_distribution": bad}, n_boot=5, workers=1)
