"""The cost model's eight-bin distribution from a point forecast (numpy only).

log2 S ~ Laplace(mu, scale); each bin gets the Laplace mass between its edges. Kept apart from
models.classical.cost_model (scikit-learn) so a portable forecaster (models.classical.portable)
computes the same distribution on a host that has numpy alone.
"""

from __future__ import annotations

import numpy as np

from models.bins import BIN_UPPER_EDGES

LOG2_EDGES = np.log2(np.asarray(BIN_UPPER_EDGES))


def laplace_cdf(z: np.ndarray) -> np.ndarray:
    """The standard Laplace CDF, written out (the closed form scipy.stats.laplace also uses)."""
    z = np.asarray(z, dtype=np.float64)
    return np.where(z < 0, 0.5 * np.exp(np.minimum(z, 0.0)), 1.0 - 0.5 * np.exp(-np.maximum(z, 0.0)))


def laplace_bins(mu: np.ndarray, scale: np.ndarray | float) -> np.ndarray:
    """(n, 8) bin probabilities of log2 S ~ Laplace(mu, scale).

    >>> p = laplace_bins(np.array([0.0]), 0.3)
    >>> round(float(p.sum()), 6), int(p.argmax()) + 1  # S = 1 sits on the edge of bins 4 and 5
    (1.0, 4)
    """
    mu = np.asarray(mu, dtype=np.float64)
    s = np.broadcast_to(np.asarray(scale, dtype=np.float64), mu.shape)
    cdf = laplace_cdf((LOG2_EDGES[None, :] - mu[:, None]) / s[:, None])
    padded = np.concatenate([np.zeros((len(mu), 1)), cdf, np.ones((len(mu), 1))], axis=1)
    return np.clip(np.diff(padded, axis=1), 0.0, 1.0)


SCALE_GRID = np.arange(0.05, 1.5, 0.025)  # candidate Laplace scales, log2 units
SHRINK = 0.02  # weight of the log-ratio penalty pulling a group's scale to the pooled one


def laplace_brier(p: np.ndarray, y: np.ndarray) -> float:
    """Mean halved Brier score of (n, 8) forecasts against bins 1..8."""
    onehot = np.eye(p.shape[1])[np.asarray(y) - 1]
    return float(0.5 * ((p - onehot) ** 2).sum(axis=1).mean())


def fit_scales(mu: np.ndarray, y: np.ndarray, groups) -> tuple[float, dict[str, float]]:
    """The pooled Laplace scale of point forecasts `mu` (log2 S) against true bins `y` that
    minimises the Brier score, and one scale per group (a task) shrunk towards it, so a group
    with few calibration pairs stays near the pooled scale.

    >>> mu = np.array([0.0, 0.1, 2.0, 2.2]); y = np.array([5, 5, 7, 7])
    >>> pooled, per = fit_scales(mu, y, ["a", "a", "b", "b"])
    >>> sorted(per) == ["a", "b"] and 0.05 <= pooled < 1.5
    True
    """
    mu, y = np.asarray(mu, dtype=np.float64), np.asarray(y)
    pooled = float(min(SCALE_GRID, key=lambda s: laplace_brier(laplace_bins(mu, s), y)))
    groups = np.asarray(groups)
    scales = {}
    for g in np.unique(groups):
        m = groups == g
        scales[str(g)] = float(min(
            SCALE_GRID,
            key=lambda s, m=m: laplace_brier(laplace_bins(mu[m], s), y[m]) + SHRINK * np.log(s / pooled) ** 2,
        ))
    return pooled, scales
