"""The budgeted search (pipelines/search): PUCT pieces, the event log, replay, budgets, modes.

Most tests run on the toy space of tests/search_toy.py (known speedups); the budget test also
runs on the committed H200 measurements.
"""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import search_toy

from pipelines.forecasting.base import checked_probs
from pipelines.forecasting.references import OracleForecaster, UniformForecaster
from pipelines.search import engine, puct
from pipelines.search.config import MODES, SearchConfig
from pipelines.search.driver import SearchRun, drive
from pipelines.search.events import (
    Child,
    EventLog,
    JsonlLog,
    Measured,
    Outcome,
    Proposed,
    Selected,
    Started,
    from_json,
    to_json,
)
from pipelines.search.forecasters import (
    ForecasterContext,
    register_forecaster,
    resolve_forecaster,
    unregister_forecaster,
)
from pipelines.search.measure import SimulatedMeasurer
from pipelines.search.simulate import SimulationPlan, simulate

REPO = Path(__file__).resolve().parents[2]
TASK = search_toy.TASK


def _run(table, mode, seed, budget=24, forecaster=None, log=None, **kw):
    cfg = SearchConfig(TASK, mode, seed, budget, hardware_id="toy-hw", **kw)
    fc = forecaster if cfg.forecasts else None
    run = SearchRun(cfg, log=log if log is not None else EventLog(), forecaster=fc)
    drive([run], SimulatedMeasurer(table))
    return run


def _finals(table, mode, seeds, forecaster=None, **kw):
    return np.array([_run(table, mode, s, forecaster=forecaster, **kw).state.best_curve[-1] for s in seeds])


# ---- PUCT pieces --------------------------------------------------------------------------
def test_rank_prior_and_scores_follow_the_paper():
    r = np.array([0.0, 2.0, 1.0])
    assert puct.rank_prior(r).tolist() == pytest.approx([1 / 6, 3 / 6, 2 / 6])
    arch = [puct.Node("root", 0.0, None, ()), puct.Node("a", 2.0, "root", ("root",)), puct.Node("b", 1.0, "root", ("root",))]
    # scale = max - min over non-root rewards = 1; T = 0; unvisited: Q = own reward
    s = puct.puct_scores(arch, {}, {}, 0, "root", c_puct=1.0)
    assert s.tolist() == pytest.approx([0.0 + 1 / 6, 2.0 + 3 / 6, 1.0 + 2 / 6])
    # a visited node uses its best child's reward and a smaller bonus
    s2 = puct.puct_scores(arch, {"b": 1}, {"b": 5.0}, 1, "root", c_puct=1.0)
    assert s2[2] == pytest.approx(5.0 + (2 / 6) * math.sqrt(2) / 2)


def test_lineage_blocking_never_picks_an_ancestor_and_a_descendant():
    arch = [puct.Node("root", 0.0, None, ()), puct.Node("a", 3.0, "root", ("root",)),
            puct.Node("aa", 4.0, "a", ("a", "root")), puct.Node("b", 1.0, "root", ("root",))]
    picked = puct.select_parents(arch, {}, {}, 0, "root", batch_size=3)
    assert picked[0] == "aa" and "a" not in picked and "root" not in picked and "b" in picked
    assert puct.select_parents(arch, {}, {}, 0, "root", batch_size=3, eligible={"a", "b"}) == ["a", "b"]


def test_admission_keeps_top_k_per_parent_and_the_root_under_capacity():
    arch = [puct.Node("root", -9.0, None, ())]
    kids = {"root": [puct.Node(f"c{i}", float(i), "root", ("root",)) for i in range(5)]}
    added = puct.admit(arch, kids, k=2, capacity=2, root_id="root")
    assert added == ["c4", "c3"]
    assert [n.kernel_id for n in arch] == ["root", "c4"]  # capacity 2: the root stays


def test_events_round_trip_through_json():
    c = Child("k1", "grid", '{"K0": 1}', "K0:0->1")
    events = [Started({"task": "t", "mode": "standard", "seed": 0, "budget": 4}, c),
              Proposed(0, "k0", (c,)), Selected(0, "k0", ("k1",), ("k2",)),
              Measured(0, (Outcome("k1", "ok", 1.5), Outcome("k2", "failed", None, "timeout")))]
    for e in events:
        assert from_json(json.loads(json.dumps(to_json(e)))) == e
    with pytest.raises(ValueError, match="unknown search event"):
        from_json({"kind": "nope"})


def test_checked_probs_refuses_bad_answers_and_renormalises():
    assert checked_probs(np.full((2, 8), 2.0), 2).sum(axis=1).tolist() == [1.0, 1.0]
    for bad in (np.ones((2, 7)), -np.ones((1, 8)), np.zeros((1, 8)), np.full((1, 8), np.nan)):
        with pytest.raises(ValueError):
            checked_probs(bad, bad.shape[0])


# ---- the search ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_replay_of_a_truncated_log_ends_where_the_full_run_ends(toy, mode, tmp_path):
    oracle = OracleForecaster(toy)
    full = _run(toy, mode, seed=3, budget=20, forecaster=oracle).log.read()
    assert len(full) > 20
    for cut in (1, 2, 7, len(full) // 2, len(full) - 1):
        resumed = _run(toy, mode, seed=3, budget=20, forecaster=oracle, log=EventLog(full[:cut]))
        assert resumed.log.read() == full, f"cut at {cut}"
    # the same through a JSONL file whose last line was torn by a crash
    path = tmp_path / "run.jsonl"
    with JsonlLog(path) as log:
        for e in full[:9]:
            log.append(e)
    with open(path, "a") as fh:
        fh.write('{"kind": "measured", "ste')
    with JsonlLog(path) as log:
        _run(toy, mode, seed=3, budget=20, forecaster=oracle, log=log)
    with JsonlLog(path) as log:
        assert log.read() == full


def test_a_log_of_another_run_is_refused(toy):
    log = _run(toy, "standard", seed=1, budget=8).log
    with pytest.raises(engine.LogError, match="another run"):
        SearchRun(SearchConfig(TASK, "standard", 2, 8, hardware_id="toy-hw"), log=EventLog(log.read()))


@pytest.mark.parametrize("budget", [13, 24])
def test_every_mode_spends_the_same_number_of_measurements(toy, budget):
    oracle = OracleForecaster(toy)
    for mode in MODES:
        for seed in range(3):
            run = _run(toy, mode, seed, budget=budget, forecaster=oracle)
            assert run.state.spent == budget, (mode, seed)
            assert run.state.finished == "budget spent"
            assert len(run.state.best_curve) == budget + 1
            measured = [o for e in run.log.read() if isinstance(e, Measured) and e.step >= 0 for o in e.outcomes]
            assert len(measured) == budget


def test_every_mode_spends_the_budget_on_the_committed_h200_data():
    from pipelines.search.table import load_table_parquet

    table = load_table_parquet(REPO / "data" / "measurements", "nvidia-h200-sm90")
    plan = SimulationPlan(tasks=("softmax", "trimul"), seeds=2, budget=12)
    runs = simulate(plan, table, OracleForecaster(table))
    assert len(runs) == 2 * len(MODES) * 2
    assert {r.state.spent for r in runs} == {12}
    # standard measures what it draws; the filtering modes consider about the whole neighbourhood
    for r in runs:
        if r.config.mode == "standard":
            assert len(r.state.considered) == 12
        else:
            assert len(r.state.considered) > 24


def test_oracle_makes_filtered_beat_standard_on_the_toy_space(toy):
    seeds = range(40)
    oracle = OracleForecaster(toy)
    filt, std = _finals(toy, "filtered", seeds, oracle), _finals(toy, "standard", seeds)
    gap = filt.mean() - std.mean()
    se = math.sqrt(filt.var(ddof=1) / len(filt) + std.var(ddof=1) / len(std))
    assert gap > 3 * se, (filt.mean(), std.mean(), se)


def test_constant_forecaster_ties_random_filtered_in_expectation(toy):
    seeds = range(150)
    filt = _finals(toy, "filtered", seeds, UniformForecaster())
    rand = _finals(toy, "random", seeds)
    assert not np.array_equal(filt, rand)  # independent draws, not the same runs twice
    se = math.sqrt(filt.var(ddof=1) / len(filt) + rand.var(ddof=1) / len(rand))
    assert abs(filt.mean() - rand.mean()) <= 3 * se, (filt.mean(), rand.mean(), se)
    # the same check has the power to see a forecaster that does know something
    orac = _finals(toy, "filtered", seeds, OracleForecaster(toy))
    assert orac.mean() - rand.mean() > 3 * math.sqrt(orac.var(ddof=1) / len(orac) + rand.var(ddof=1) / len(rand))


def test_selective_trusts_confident_forecasts_and_still_spends_the_budget(toy):
    run = _run(toy, "selective", seed=0, budget=16, forecaster=OracleForecaster(toy))
    assert run.state.spent == 16 and run.state.trusted
    trusted = {kid for kid, _, _ in run.state.trusted}
    measured = {m.kernel_id for m in run.state.measured}
    assert not trusted & measured
    # the uniform forecaster is never confident: nothing is trusted
    assert not _run(toy, "selective", seed=0, budget=16, forecaster=UniformForecaster()).state.trusted


def test_a_failing_forecaster_is_recorded_and_the_run_goes_on(toy):
    class Broken:
        def predict_kernels(self, anchor, candidates, hardware_id):
            raise RuntimeError("model server down")

    run = _run(toy, "filtered", seed=0, budget=8, forecaster=Broken())
    assert run.state.spent == 8 and run.state.forecast_errors > 0
    errors = [e.error for e in run.log.read() if getattr(e, "error", None)]
    assert errors and "model server down" in errors[0]


def test_unmeasured_children_cost_a_measurement_and_are_counted(toy):
    sparse = search_toy.toy_table(drop=0.5, seed=1)
    run = _run(sparse, "standard", seed=0, budget=16)
    unmeasured = [m for m in run.state.measured if m.outcome.status == "unmeasured"]
    assert run.state.spent == 16 and unmeasured
    assert all(m.kernel_id not in sparse for m in unmeasured)


def test_the_same_config_gives_the_same_log(toy):
    a = _run(toy, "filtered", seed=5, budget=12, forecaster=OracleForecaster(toy)).log.read()
    b = _run(toy, "filtered", seed=5, budget=12, forecaster=OracleForecaster(toy)).log.read()
    c = _run(toy, "filtered", seed=6, budget=12, forecaster=OracleForecaster(toy)).log.read()
    assert a == b and a != c


# ---- forecasters --------------------------------------------------------------------------
def test_oracle_bins_against_the_reference_and_against_a_parent(toy):
    kid, out = next((k, o) for k, o in toy.outcomes.items() if o.ok and 1.5 < o.speedup < 1.9)
    oracle = OracleForecaster(toy)
    p = oracle.predict_kernels({"kernel_id": "ref", "generator": "reference"}, [{"kernel_id": kid}], "toy-hw")
    assert p[0].argmax() == 5  # bin 6: sqrt(2) < S <= 2
    failed = next(k for k, o in toy.outcomes.items() if o.status == "failed")
    q = oracle.predict_kernels({"kernel_id": kid, "generator": "kernelcast-space"},
                               [{"kernel_id": kid}, {"kernel_id": failed}, {"kernel_id": "unknown"}], "toy-hw")
    assert q[0].argmax() == 3 and q[1].argmax() == 0 and q[2].tolist() == [0.125] * 8


def test_resolver_names_hooks_and_files(toy, tmp_path):
    ctx = ForecasterContext(table=toy)
    assert isinstance(resolve_forecaster("uniform"), UniformForecaster)
    assert isinstance(resolve_forecaster("oracle", ctx), OracleForecaster)
    prior = resolve_forecaster("bin-prior", ctx).predict_kernels({}, [{"task": TASK}], "toy-hw")
    assert prior.shape == (1, 8) and prior.sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown forecaster"):
        resolve_forecaster("crystal-ball")
    unregister_forecaster("models:/")  # a hook another module registered (pipelines.search.registered)
    with pytest.raises(ValueError, match="no loader registered"):
        resolve_forecaster("models:/kernelcast-surrogate@champion")
    register_forecaster("models:/", lambda name, c: UniformForecaster())
    try:
        assert isinstance(resolve_forecaster("models:/kernelcast-surrogate@champion"), UniformForecaster)
    finally:
        unregister_forecaster("models:/")
    path = tmp_path / "f.pkl"
    path.write_bytes(pickle.dumps(UniformForecaster()))
    assert isinstance(resolve_forecaster(f"file:{path}"), UniformForecaster)
    path.write_bytes(pickle.dumps({"not": "a forecaster"}))
    with pytest.raises(ValueError, match="no predict_kernels"):
        resolve_forecaster(f"file:{path}")
