"""Speedup recovered under a measurement budget (method.md section 4).

A pool is every correct candidate of one task on one hardware, each with its true speedup S
over the pool's common anchor (the task reference). A forecaster ranks the pool, by default by
the expected log2-speedup sum_b p_b r_b (r = models.bins.BIN_LOG2_VALUES), parse failures
last. With budget fraction f the top k = max(1, ceil(f n)) candidates are measured and

    recovered(f) = max S over the top k / max S over the pool.

Ties: a group of equal scores that the budget boundary cuts contributes its exact expectation
over the random orders of the group (`tied_recovered_curve`): a constant forecaster scores
exactly the random-order expectation, and the one-hot oracle its within-bin expectation, instead
of whatever the kernel ids happen to sort first.

Budgets are whole percents 1..50, so k is computed in integers (ceil(7 * 100 / 100) must be
7, and 0.07 * 100 in floating point is 7.000000000000001). A task's curve is the mean of its
pools' curves (one pool per hardware). Headline: mean over the 50 budgets per task, then mean
over tasks; beside it the exact expectation under a uniformly random order (closed form from
order statistics) and the oracle, 1.0 by definition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from models.bins import BIN_LOG2_VALUES

BUDGET_PERCENTS = np.arange(1, 51)  # f = 1%, 2%, ..., 50%
WITHIN_THRESHOLD = 0.8  # "within 20%" of the pool's best


def expected_log2_score(p: np.ndarray) -> np.ndarray:
    """Ranking score sum_b p_b r_b of (n, 8) distributions.

    >>> expected_log2_score(np.array([[0.0] * 7 + [1.0]])).tolist()
    [2.5]
    """
    return np.asarray(p, dtype=np.float64) @ np.asarray(BIN_LOG2_VALUES)


def budget_k(n: int, percents: np.ndarray = BUDGET_PERCENTS) -> np.ndarray:
    """k = max(1, ceil(percent * n / 100)) in exact integer arithmetic.

    >>> budget_k(100, np.array([1, 7, 50])).tolist(), budget_k(3, np.array([1, 10, 50])).tolist()
    ([1, 7, 50], [1, 1, 2])
    """
    pct = np.asarray(percents, dtype=np.int64)
    return np.maximum(1, -(-(pct * n) // 100))


# Kept per (group size, subset size) and per pool size: a report meets a few dozen of each, and
# the bounds keep a process's worst case to tens of MB.
@lru_cache(maxsize=1024)
def _subset_max_weights(g: int, j: int) -> np.ndarray:
    """P(the max of a uniformly random j-subset of g values is the i-th largest), i = 1..g:
    C(g - i, j - 1) / C(g, j). The same for every pool of a size, so kept (read only)."""
    w = np.zeros(g)
    w[0] = j / g
    for i in range(1, g - j + 1):
        w[i] = w[i - 1] * (g - i - j + 1) / (g - i)
    w.flags.writeable = False
    return w


def _expected_max_with(floor: float, values_desc: np.ndarray, j: int) -> float:
    """E[max(floor, max of a uniformly random j-subset of `values`)], values sorted descending."""
    return float(_subset_max_weights(values_desc.size, j) @ np.maximum(values_desc, floor))


def tied_recovered_curve(speedup: np.ndarray, score: np.ndarray, parse_ok: np.ndarray,
                         percents: np.ndarray = BUDGET_PERCENTS) -> np.ndarray:
    """recovered(f) of a pool ranked by `score` (failures last), ties in expectation.

    Groups of equal score are measured in a random order within the group: a group the budget
    boundary cuts contributes E[max] of a uniformly random subset of it of the size the budget
    leaves (method.md section 4).

    >>> s = np.array([1.0, 4.0, 2.0, 3.0])
    >>> tied_recovered_curve(s, np.zeros(4), np.ones(4, bool), np.array([25, 50])).tolist()  # all tied
    [0.625, 0.8333333333333334]
    >>> tied_recovered_curve(s, np.array([0, 3, 1, 2.0]), np.ones(4, bool), np.array([25])).tolist()
    [1.0]
    """
    s = np.asarray(speedup, dtype=np.float64)
    ok = np.asarray(parse_ok, dtype=bool)
    key = np.where(ok, np.asarray(score, dtype=np.float64), -np.inf)
    order = np.lexsort((-s, -key, ~ok))  # groups in measuring order, each sorted descending by S
    ks, ss, oks = key[order], s[order], ok[order]
    n = order.size
    # Group boundaries in arrays, not a Python walk: this runs once per pool per bootstrap
    # replicate (thousands of times per report). NaN scores compare unequal, one group each.
    starts = np.flatnonzero(np.concatenate(([True], (ks[1:] != ks[:-1]) | (oks[1:] != oks[:-1]))))
    ends = np.append(starts[1:], n)
    best_so_far = np.maximum.accumulate(ss)  # the best of whole groups taken so far
    best = s.max()
    k = _budgets(n, percents)
    cut = np.searchsorted(ends, k, side="left")  # the group holding the k-th measurement
    out = best_so_far[k - 1] / best  # right wherever the budget ends on a group boundary
    for i in np.flatnonzero(ends[cut] != k):  # a budget that cuts a group: its tie in expectation
        start, end = starts[cut[i]], ends[cut[i]]
        floor = float(best_so_far[start - 1]) if start else -np.inf
        out[i] = _expected_max_with(floor, ss[start:end], int(k[i] - start)) / best
    return out


def random_recovered_curve(speedup: np.ndarray, percents: np.ndarray = BUDGET_PERCENTS) -> np.ndarray:
    """Exact E[recovered(f)] when the pool is measured in a uniformly random order.

    With S sorted ascending S_(1) <= ... <= S_(n), the best of a random k-subset is S_(i)
    with probability C(i-1, k-1) / C(n, k) (i = k..n), so
    E[max] = sum_i S_(i) C(i-1, k-1) / C(n, k). Ties in S need no care: the sum is over
    positions, and equal values give the same expected value.

    >>> random_recovered_curve(np.array([1.0, 2.0]), np.array([1, 100])).tolist()  # k = 1, 2
    [0.75, 1.0]
    """
    s_desc = np.sort(np.asarray(speedup, dtype=np.float64))[::-1]
    return _order_statistic_weights(s_desc.size, _percents_key(percents)) @ s_desc / s_desc[0]


def _percents_key(percents: np.ndarray) -> tuple[int, ...]:
    return tuple(np.asarray(percents, dtype=np.int64).tolist())


def _budgets(n: int, percents: np.ndarray) -> np.ndarray:
    return _budgets_cached(n, _percents_key(percents))


@lru_cache(maxsize=256)
def _budgets_cached(n: int, percents: tuple[int, ...]) -> np.ndarray:
    k = budget_k(n, np.asarray(percents))
    k.flags.writeable = False
    return k


@lru_cache(maxsize=64)
def _order_statistic_weights(n: int, percents: tuple[int, ...]) -> np.ndarray:
    """|w| of random_recovered_curve for a pool of n: they depend on n and the budgets only, and
    a bootstrap replicate keeps every pool's size, so they are computed once per size."""
    k = _budgets_cached(n, percents).astype(np.float64)[:, None]  # (budgets, 1)
    # Weights w_i = C(i-1, k-1) / C(n, k) of S_(n), S_(n-1), ..., S_(1): w_n = k / n and
    # w_{i-1} / w_i = (i - k) / (i - 1). The ratio is 0 at i = k, so every weight below S_(k)
    # is 0; the running product never forms a huge binomial.
    i = np.arange(n, 1, -1, dtype=np.float64)[None, :]  # n .. 2, (1, n-1)
    ratios = (i - k) / (i - 1.0)
    w = (k / n) * np.concatenate([np.ones_like(k), np.cumprod(ratios, axis=1)], axis=1)  # (budgets, n)
    w = np.abs(w)  # 0 * a negative ratio leaves -0.0, harmless
    w.flags.writeable = False
    return w


@dataclass
class UtilityResult:
    """Budget curves per task and their summaries.

    Attributes:
        percents: (50,) budget percents.
        model: task -> (50,) recovered(f) of the forecaster.
        random: task -> (50,) expected recovered(f) under a random order.
    """

    percents: np.ndarray
    model: dict[str, np.ndarray] = field(default_factory=dict)
    random: dict[str, np.ndarray] = field(default_factory=dict)

    def summary(self, tasks: list[str] | None = None) -> dict[str, float]:
        """Headline numbers over `tasks` (default all): means over tasks of per-task values."""
        tasks = sorted(self.model) if tasks is None else tasks
        if not tasks:
            return {k: math.nan for k in ("recovered_mean", "recovered_at_10", "within_20",
                                           "recovered_random_mean", "recovered_random_at_10")}
        m = np.stack([self.model[t] for t in tasks])  # (tasks, 50)
        r = np.stack([self.random[t] for t in tasks])
        at10 = int(np.nonzero(self.percents == 10)[0][0]) if 10 in self.percents else None
        return {
            "recovered_mean": float(m.mean(axis=1).mean()),
            "recovered_at_10": float(m[:, at10].mean()) if at10 is not None else math.nan,
            "within_20": float(np.mean(m >= WITHIN_THRESHOLD - 1e-12)),
            "recovered_random_mean": float(r.mean(axis=1).mean()),
            "recovered_random_at_10": float(r[:, at10].mean()) if at10 is not None else math.nan,
            "recovered_oracle_mean": 1.0,
        }


def utility(
    task: np.ndarray,
    pool: np.ndarray,
    speedup: np.ndarray,
    score: np.ndarray,
    parse_ok: np.ndarray,
    tiebreak: np.ndarray,
    percents: np.ndarray = BUDGET_PERCENTS,
) -> UtilityResult:
    """Recovered-speedup curves of one forecaster over all pools.

    Args:
        task: (n,) task of each candidate.
        pool: (n,) pool key (task and hardware); every pool lies in one task.
        speedup: (n,) true S of each candidate over the pool anchor, > 0.
        score: (n,) ranking score (e.g. `expected_log2_score`).
        parse_ok: (n,) bool.
        tiebreak: (n,) kernel ids (a concrete order for listing; the curves take ties in
            expectation).
        percents: budget percents.
    Returns:
        A `UtilityResult`; a task's curve is the mean of its pools' curves.
    """
    task = np.asarray(task)
    pool = np.asarray(pool)
    speedup = np.asarray(speedup, dtype=np.float64)
    out = UtilityResult(percents=np.asarray(percents))
    per_task_model: dict[str, list[np.ndarray]] = {}
    per_task_random: dict[str, list[np.ndarray]] = {}
    # Each pool's rows in ascending order, as np.nonzero(pool == key) gives them, found with one
    # stable sort instead of a scan of every row per pool (this runs per bootstrap replicate).
    order = np.argsort(pool, kind="stable")
    bounds = np.flatnonzero(pool[order][1:] != pool[order][:-1]) + 1
    for idx in np.split(order, bounds) if order.size else []:
        t = str(task[idx[0]])
        per_task_model.setdefault(t, []).append(tied_recovered_curve(speedup[idx], score[idx], parse_ok[idx], percents))
        per_task_random.setdefault(t, []).append(random_recovered_curve(speedup[idx], percents))
    for t, curves in per_task_model.items():
        out.model[t] = np.mean(curves, axis=0)
        out.random[t] = np.mean(per_task_random[t], axis=0)
    return out
