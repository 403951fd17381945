"""Utility (speedup recovered), discovery and bootstrap against hand-computed values."""

import itertools
import math

import numpy as np
import pytest

from pipelines.evaluation import bootstrap, discovery, utility


def test_budget_k_never_zero_and_exact_ceil():
    assert utility.budget_k(3, np.array([1, 33, 34, 50])).tolist() == [1, 1, 2, 2]
    assert utility.budget_k(100, np.array([7, 29])).tolist() == [7, 29]  # no float ceil drift
    assert utility.budget_k(1, np.array([1, 50])).tolist() == [1, 1]


def test_pool_of_one_recovers_everything():
    u = utility.utility(np.array(["t"]), np.array([0]), np.array([0.7]), np.array([0.0]), np.array([True]), np.array(["k"]))
    assert np.all(u.model["t"] == 1.0) and np.allclose(u.random["t"], 1.0)
    s = u.summary()
    assert s["recovered_mean"] == 1.0 and s["within_20"] == 1.0 and s["recovered_oracle_mean"] == 1.0


@pytest.mark.parametrize("speedups", [[3.0, 1.0, 1.0, 5.0, 2.0, 0.5, 7.0], [1.0, 1.0, 1.0], [0.2, 9.0]])
def test_random_order_expectation_matches_brute_force(speedups):
    s = np.array(speedups)
    n = s.size
    pct = np.array([1, 20, 34, 50, 67, 100])
    exact = utility.random_recovered_curve(s, pct)
    for k, e in zip(utility.budget_k(n, pct), exact):
        brute = np.mean([max(c) for c in itertools.combinations(s, int(k))]) / s.max()
        assert e == pytest.approx(brute, rel=1e-12)


def test_utility_ties_are_expectations_and_summary():
    # Two tasks. Task a: equal scores, so the budget takes a random subset of {1, 4, 2}.
    task = np.array(["a", "a", "a", "b", "b"])
    pool = np.array([0, 0, 0, 1, 1])
    s = np.array([1.0, 4.0, 2.0, 1.0, 2.0])
    score = np.array([0.0, 0.0, 0.0, 1.0, 0.5])  # task b: ranks S=1 first
    ids = np.array(["k1", "k2", "k3", "x", "y"])
    u = utility.utility(task, pool, s, score, np.ones(5, bool), ids)
    # a: n=3, k=1 for f<=33% (E[max] = 7/3), k=2 for 34..50% (E[max] = 10/3), over the best 4
    k1, k2 = (7 / 3) / 4, (10 / 3) / 4
    assert u.model["a"][:33] == pytest.approx(k1) and u.model["a"][33:] == pytest.approx(k2)
    assert u.model["a"] == pytest.approx(u.random["a"])  # a constant score is the random order
    # b: n=2, k=1 for every f <= 50% -> 1/2
    assert u.model["b"] == pytest.approx(0.5)
    summ = u.summary()
    assert summ["recovered_mean"] == pytest.approx(((33 * k1 + 17 * k2) / 50 + 0.5) / 2)
    assert summ["recovered_at_10"] == pytest.approx((k1 + 0.5) / 2)
    assert summ["within_20"] == pytest.approx(17 / 100)
    # random, b: k=1 -> (1+2)/2/2 = 0.75 at every budget
    assert u.random["b"] == pytest.approx(0.75)


def test_expected_log2_score_ranks_by_bin_values():
    p = np.zeros((2, 8))
    p[0, 4] = p[0, 5] = 0.5  # 0.5*0.25 + 0.5*0.75
    p[1, 7] = 1.0
    assert utility.expected_log2_score(p).tolist() == [0.5, 2.5]


def test_discovery_metrics_and_ap_with_ties():
    assert discovery.average_precision(np.array([0.8, 0.8, 0.3]), np.array([1, 0, 1])) == pytest.approx(
        0.5 * 0.5 + 0.5 * (2 / 3)
    )
    m = discovery.discovery_metrics(np.array([0.5, 0.9, 0.1]), np.array([True, False, True]))
    assert m["precision"] == 0.0 and m["recall"] == 0.0 and m["f1"] == 0.0  # 0.5 is not > 0.5
    assert m["base_rate"] == pytest.approx(2 / 3)
    none = discovery.discovery_metrics(np.array([0.1]), np.array([False]))
    assert math.isnan(none["precision"]) and math.isnan(none["pr_auc"])


def test_discovery_probability_bins_5_to_8():
    p = np.array([[0.1, 0.1, 0.1, 0.2, 0.3, 0.1, 0.05, 0.05]])
    assert discovery.discovery_probability(p)[0] == pytest.approx(0.5)


def test_bootstrap_is_seeded_and_keeps_pairs_together():
    x = np.array([0.0, 0.0, 1.0, 1.0, 0.5, 0.5])
    group = np.array([0, 0, 1, 1, 2, 2])
    strata = np.zeros(6)
    seen = []

    def metric(rows):
        # Rows of one pair always come together.
        g = group[rows]
        assert all(np.sum(g == v) % 2 == 0 for v in np.unique(g))
        seen.append(len(rows))
        return {"m": float(x[rows].mean())}

    a = bootstrap.bootstrap_intervals(metric, group, strata, ["m"], n_boot=200, seed=3)
    b = bootstrap.bootstrap_intervals(metric, group, strata, ["m"], n_boot=200, seed=3)
    assert a == b and 0.0 <= a["m"][0] <= 0.5 <= a["m"][1] <= 1.0
    assert set(seen) == {6}


def test_bootstrap_stratified_keeps_strata_sizes():
    group = np.arange(5)
    strata = np.array([0, 0, 0, 1, 1])
    rows = bootstrap.resample_rows(group, strata, np.random.default_rng(0))
    assert np.sum(strata[rows] == 0) == 3 and np.sum(strata[rows] == 1) == 2


def test_repeat_spread():
    assert bootstrap.repeat_spread([{"a": 1.0}], ["a"]) == {"a": None}
    assert bootstrap.repeat_spread([{"a": 1.0}, {"a": 2.0}, {"a": 3.0}], ["a"]) == {"a": 1.0}
