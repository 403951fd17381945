"""The simulation asks its forecaster once per distinct (anchor, candidate) pair: every run
gets the rows it would have got from the forecaster itself, with far fewer calls. The
remembering wrapper (RecordsForecaster) is itself a PairForecaster: pairs frames in too."""

from __future__ import annotations

import numpy as np
import pytest
import search_toy

from pipelines.forecasting.base import RecordsForecaster, single_anchor_pairs
from pipelines.forecasting.references import OracleForecaster
from pipelines.search.simulate import SimulationPlan, run_summary, simulate


class Counting:
    """A deterministic forecaster of varied rows that counts the candidates it was asked for."""

    name = "counting"

    def __init__(self, inner):
        self.inner, self.asked = inner, 0

    def predict_kernels(self, anchor, candidates, hardware_id):
        self.asked += len(candidates)
        p = np.asarray(self.inner.predict_kernels(anchor, candidates, hardware_id)) + 0.05
        return p / p.sum(axis=1, keepdims=True)


def _plain_simulate(plan, table, forecaster):
    """simulate() without the memo: every run asks the forecaster itself."""
    from pipelines.search.driver import SearchRun, drive
    from pipelines.search.measure import SimulatedMeasurer

    runs = []
    for task in plan.tasks:
        batch = [SearchRun(c, forecaster=forecaster if c.forecasts else None, features=table.features)
                 for c in plan.configs("counting") if c.task == task]
        drive(batch, SimulatedMeasurer(table))
        runs += batch
    return runs


def test_memo_gives_the_runs_of_the_forecaster_itself_with_fewer_calls(toy):
    plan = SimulationPlan(tasks=(search_toy.TASK,), seeds=4, budget=12, hardware_id="toy-hw")
    direct = Counting(OracleForecaster(toy))
    memo = Counting(OracleForecaster(toy))
    want = [run_summary(r) for r in _plain_simulate(plan, toy, direct)]
    got = [run_summary(r) for r in simulate(plan, toy, memo, forecaster_label="counting")]
    assert got == want
    assert 0 < memo.asked < direct.asked


def test_memo_remembers_per_pair_and_passes_bad_answers_on(toy):
    inner = Counting(OracleForecaster(toy))
    memo = RecordsForecaster(inner, remember=True)
    anchor = {"kernel_id": "ref", "generator": "reference"}
    kids = sorted(toy.outcomes)[:3]
    cands = [{"kernel_id": k} for k in kids]
    first = memo.predict_kernels(anchor, cands, "toy-hw")
    again = memo.predict_kernels(anchor, cands[::-1] + cands[:1], "toy-hw")
    assert inner.asked == 3 and memo.calls == 1
    np.testing.assert_array_equal(again, np.stack([first[2], first[1], first[0], first[0]]))
    memo.predict_kernels(anchor, [{"kernel_id": kids[0], "parent_kernel_id": "other"}], "toy-hw")
    assert inner.asked == 4  # another record (parent) is another pair

    class Wrong:
        def predict_kernels(self, anchor, candidates, hardware_id):
            return np.ones((1, 3))

    with pytest.raises(ValueError, match="shape"):
        RecordsForecaster(Wrong(), remember=True).predict_kernels(anchor, cands, "toy-hw")


def test_the_wrapper_answers_pairs_frames_as_the_records_it_wraps(toy):
    """A predict_kernels object behind the one interface: forecast_pairs of the single-anchor
    pairs gives the inner object's rows; an object without predict_kernels is refused."""
    inner = Counting(OracleForecaster(toy))
    wrapped = RecordsForecaster(inner)
    anchor = {"kernel_id": "ref", "generator": "reference", "task": search_toy.TASK}
    cands = [{"kernel_id": k, "task": search_toy.TASK} for k in sorted(toy.outcomes)[:4]]
    pairs, kernels = single_anchor_pairs(anchor, cands, "toy-hw")
    np.testing.assert_array_equal(wrapped.forecast_pairs(pairs, kernels), inner.predict_kernels(anchor, cands, "toy-hw"))
    assert wrapped.name == "counting" and wrapped.calls == 1 and not wrapped.memo
    with pytest.raises(ValueError, match="no predict_kernels"):
        RecordsForecaster(object())


def test_the_measured_oracle_answers_frames_and_records_alike(toy):
    """The search's oracle (measured outcomes) gives the same rows through both doors."""
    oracle = OracleForecaster(toy)
    anchor = {"kernel_id": "ref", "generator": "reference", "task": search_toy.TASK}
    cands = [{"kernel_id": k, "task": search_toy.TASK} for k in sorted(toy.outcomes)] + [{"kernel_id": "nowhere"}]
    pairs, kernels = single_anchor_pairs(anchor, cands, "toy-hw")
    rows = oracle.predict_kernels(anchor, cands, "toy-hw")
    np.testing.assert_array_equal(oracle.forecast_pairs(pairs, kernels), rows)
    assert rows[-1].tolist() == [0.125] * 8 and (rows[:-1].max(axis=1) == 1.0).all()
