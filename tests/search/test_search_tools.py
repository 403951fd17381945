"""Coverage, the neighbourhood batch, and the Triton autotune hook (interpreter on CPU)."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pyarrow.parquet as pq
import pytest
import search_toy

from pipelines.forecasting.references import OracleForecaster, UniformForecaster
from pipelines.search import space
from pipelines.search.coverage import Imputer, coverage, frontier, proposed, write_frontier_batch
from pipelines.search.simulate import SimulationPlan, simulate
from warehouse.formats import KERNEL_BATCH_SCHEMA

TASK = search_toy.TASK


def _plan(**kw):
    return SimulationPlan(tasks=(TASK,), seeds=3, budget=12, hardware_id="toy-hw", **kw)


def test_coverage_counts_proposed_and_measured_children(toy):
    sparse = search_toy.toy_table(drop=0.4, seed=2)
    runs = simulate(_plan(), sparse, OracleForecaster(sparse))
    cov = coverage(runs, sparse)
    props = proposed(runs)
    assert cov["proposed"] == len(props)
    assert cov["covered"] == sum(c.kernel_id in sparse for _, c, _, _ in props)
    assert 0.4 < cov["coverage"] < 0.8
    unmeasured = sum(m.outcome.status == "unmeasured" for r in runs for m in r.state.measured)
    assert cov["measured"] - cov["measured_covered"] == unmeasured
    assert coverage(simulate(_plan(), toy, OracleForecaster(toy)), toy)["coverage"] == 1.0


def test_frontier_holds_every_unmeasured_child_and_measuring_it_closes_the_gaps(toy, tmp_path):
    sparse = search_toy.toy_table(drop=0.4, seed=2)
    scenarios = [(_plan(), OracleForecaster), (_plan(), lambda t: UniformForecaster())]
    entries, stats = frontier(scenarios, sparse, rounds=3)
    assert stats[0]["new"] > 0 and stats[0]["coverage"] < 1.0
    first = [r for p, f in scenarios for r in simulate(p, sparse, f(sparse))]
    missing = {c.kernel_id for _, c, _, _ in proposed(first) if c.kernel_id not in sparse}
    ids = [e.child.kernel_id for e in entries]
    assert missing <= set(ids) and len(ids) == len(set(ids))
    rounds = [e.first_round for e in entries]
    assert rounds == sorted(rounds)  # children today's runs need come first
    # measured (here: the toy truth filled in), today's runs propose nothing unmeasured
    completed = sparse.copy()
    for e in entries:
        completed.add(TASK, toy.get(e.child.kernel_id))
    assert coverage(first, completed)["coverage"] == 1.0
    # the batch: kernel batch schema, lineage to a measured kernel or another entry
    info = write_frontier_batch(entries, tmp_path, limit=5)
    batch, every = pq.read_table(tmp_path / "neighbourhood.parquet"), pq.read_table(tmp_path / "kernels.parquet")
    assert batch.schema.equals(KERNEL_BATCH_SCHEMA) and batch.num_rows == 5 == info["batch"]
    assert every.num_rows == len(entries)
    known = set(sparse.outcomes) | set(ids)
    for row in every.to_pylist():
        assert row["parent_kernel_id"] in known and row["mutation"]
        assert space.kernel_record(TASK, space.Child(row["kernel_id"], row["algorithm"], row["knobs_json"]))["source"] == row["source"]


def test_imputer_stays_inside_the_measured_range(toy):
    imp = Imputer(search_toy.toy_table(drop=0.5, seed=3))
    lo, hi = imp.range[TASK]
    outs = [imp.outcome(TASK, f"k{i}", 1.0, salt=0) for i in range(300)]
    ok = [o.speedup for o in outs if o.ok]
    assert ok and min(ok) >= lo and max(ok) <= hi
    assert 0 < sum(not o.ok for o in outs) < 60  # failures at about the toy's 4% rate
    assert imp.outcome(TASK, "k1", 1.0, salt=0) == outs[1]  # one kernel, one imputed outcome


# ---- autotune ---------------------------------------------------------------------------
class PreferBigBlocks:
    """Puts each softmax online_two_pass config in a bin that grows with BLOCK_N."""

    name = "prefer-big-blocks"

    def __init__(self):
        self.calls = 0

    def predict_kernels(self, anchor, candidates, hardware_id):
        self.calls += 1
        out = np.zeros((len(candidates), 8))
        for i, c in enumerate(candidates):
            assert c["task"] == "softmax" and c["source"] and anchor["generator"] == "reference"
            knobs = json.loads(c["knobs_json"])
            # two bins per doubling of BLOCK_N, so the top two configs share the biggest block (no tie)
            out[i, max(0, min(7, 2 * (int(math.log2(knobs["BLOCK_N"])) - 8) + (knobs["NUM_WARPS"] == 2)))] = 1.0
        return out


def test_autotune_hook_benchmarks_only_the_forecasters_top_k():
    import torch
    import triton

    from benchmarks.autotune_demo import TUNABLES, _fresh_kernel
    from pipelines.search.autotune import surrogate_pruning

    tunable = TUNABLES["softmax"]
    configs = [triton.Config({"BLOCK_N": b}, num_warps=w, num_stages=1) for b in (128, 256, 512) for w in (1, 2)]
    fc = PreferBigBlocks()
    prune = surrogate_pruning(fc, "softmax", tunable.algorithm, configs, top_k=2, fixed_knobs=tunable.fixed)
    benched = []

    def bench(fn, quantiles):
        benched.append(1)
        fn()
        return [float(len(benched))] * 3  # the first benchmarked config wins

    kernel = triton.autotune(configs, key=["M", "N"], prune_configs_by=prune, do_bench=bench)(
        _fresh_kernel("softmax", tunable, "t"))
    x = torch.randn(3, 300, dtype=torch.bfloat16)
    y = tunable.launch(kernel, (x,))
    assert len(benched) == 2 and fc.calls == 1
    assert prune["perf_model"].calls == len(configs) and prune["perf_model"].forecast_rows == len(configs)
    assert kernel.best_config.kwargs["BLOCK_N"] == 512
    assert torch.allclose(y.float(), torch.softmax(x.float(), -1), atol=1e-2)


def test_autotune_hook_refuses_bad_top_k_and_ranks_invalid_configs_last():
    from pipelines.search.autotune import ForecastPerfModel, surrogate_pruning

    with pytest.raises(ValueError, match="top_k"):
        surrogate_pruning(UniformForecaster(), "softmax", "online_two_pass", [], top_k=0)
    model = ForecastPerfModel(UniformForecaster(), "softmax", "online_two_pass",
                              fixed_knobs={"eviction": "none", "online_state": "vector"})
    assert model(BLOCK_N=256, num_warps=4, num_stages=1) == pytest.approx(1.0)
    assert model(BLOCK_N=4096, num_warps=1, num_stages=1) == math.inf  # too many elements per thread
    with pytest.raises(ValueError, match="no value for knob"):
        ForecastPerfModel(UniformForecaster(), "softmax", "online_two_pass")(BLOCK_N=256, num_warps=4, num_stages=1)


def test_autotune_demo_runs_pruned_then_exhaustive_on_cpu(tmp_path):
    from benchmarks.autotune_demo import main

    path = tmp_path / "f.pkl"
    path.write_bytes(pickle.dumps(PreferBigBlocks()))
    out = tmp_path / "autotune.json"
    assert main(["--device", "cpu", "--grid", "BLOCK_N=256+512+1024;NUM_WARPS=1+2;NUM_STAGES=1", "--top-k", "2",
                 "--forecaster-file", str(path), "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    ex, pr = rep["phases"]["exhaustive"], rep["phases"]["pruned:prefer-big-blocks"]
    assert rep["configs"] == 6 and ex["benchmarked"] == 6 and pr["benchmarked"] == 2 and pr["forecast_rows"] == 6
    assert ex["correct"] and pr["correct"]
    assert json.loads(pr["best_config"])["BLOCK_N"] == 1024
    assert pr["slowdown_vs_exhaustive_best"] == pytest.approx(pr["chosen_ms_in_exhaustive"] / ex["best_ms"])
