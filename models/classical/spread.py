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
