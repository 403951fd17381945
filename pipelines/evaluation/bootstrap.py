"""Uncertainty of headline metrics: bootstrap intervals over pairs, spread over repeats.

The resampling unit is the pair: all repeats of one pair enter or leave together, because
repeats of one pair are not independent evidence. Pairs are resampled within each task
(stratified), so every replicate holds every task and "mean over tasks" keeps its meaning.
Intervals are percentile intervals (default 95%) of the replicate values, NaN replicates
ignored. Seeded: the same inputs and seed give the same intervals.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

log = logging.getLogger(__name__)

MetricFn = Callable[[np.ndarray], Mapping[str, float]]


def resample_rows(group: np.ndarray, strata: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Row indices of one bootstrap replicate: groups drawn with replacement within strata.

    Args:
        group: (n,) group code of each row (the pair).
        strata: (n,) stratum of each row (the task); a group lies in one stratum.
        rng: the random generator.
    Returns:
        Row indices; a group drawn twice contributes its rows twice.

    >>> rows = resample_rows(np.array([0, 0, 1]), np.array([0, 0, 0]), np.random.default_rng(0))
    >>> sorted(set(np.array([0, 0, 1])[rows].tolist())) in ([0], [1], [0, 1])
    True
    """
    group = np.asarray(group)
    order = np.argsort(group, kind="stable")
    _, start, count = np.unique(group[order], return_index=True, return_counts=True)
    g_stratum = np.asarray(strata)[order][start]
    chosen = []
    for s in np.unique(g_stratum):
        members = np.nonzero(g_stratum == s)[0]
        chosen.append(rng.choice(members, size=members.size, replace=True))
    picked = np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64)
    counts = count[picked]
    # Expand each picked group to its rows: start offset plus 0..count-1.
    offsets = np.repeat(start[picked] - np.cumsum(np.r_[0, counts[:-1]]), counts)
    return order[offsets + np.arange(counts.sum())]


def bootstrap_intervals(
    metric_fn: MetricFn,
    group: np.ndarray,
    strata: np.ndarray,
    keys: Sequence[str],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, list[float] | None]:
    """Percentile intervals of metrics over pair resamples.

    Args:
        metric_fn: row indices -> {metric: value}.
        group: (n,) pair code per row.
        strata: (n,) task code per row.
        keys: metrics to report.
        n_boot: replicates.
        seed: seed of numpy's default generator.
        level: coverage of the interval.
        progress: called as progress(done, n_boot) after each replicate.
    Returns:
        {key: [low, high]}, None where every replicate was NaN.

    >>> x = np.array([0.0, 1.0, 0.0, 1.0])
    >>> iv = bootstrap_intervals(lambda r: {"m": float(x[r].mean())}, np.arange(4), np.zeros(4), ["m"], n_boot=200)
    >>> 0.0 <= iv["m"][0] <= 0.5 <= iv["m"][1] <= 1.0
    True
    """
    if n_boot <= 0:
        return {k: None for k in keys}
    rng = np.random.default_rng(seed)
    values = {k: np.empty(n_boot) for k in keys}
    for b in range(n_boot):
        m = metric_fn(resample_rows(group, strata, rng))
        for k in keys:
            v = m.get(k)
            values[k][b] = math.nan if v is None else v
        if progress is not None:
            progress(b + 1, n_boot)
    tail = (1.0 - level) / 2.0 * 100.0
    out: dict[str, list[float] | None] = {}
    for k, v in values.items():
        v = v[np.isfinite(v)]
        out[k] = [float(np.percentile(v, tail)), float(np.percentile(v, 100.0 - tail))] if v.size else None
    return out


def repeat_spread(per_repeat: Sequence[Mapping[str, float]], keys: Sequence[str]) -> dict[str, float | None]:
    """Sample standard deviation (ddof=1) of each metric over repeats; None with one repeat.

    >>> repeat_spread([{"a": 1.0}, {"a": 3.0}], ["a"])
    {'a': 1.4142135623730951}
    """
    out: dict[str, float | None] = {}
    for k in keys:
        v = np.array([r.get(k, math.nan) for r in per_repeat], dtype=np.float64)
        v = v[np.isfinite(v)]
        out[k] = float(np.std(v, ddof=1)) if v.size >= 2 else None
    return out
