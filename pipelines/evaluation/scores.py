"""Proper scores of one forecast against its true bin (method.md section 3).

Every function is vectorised: `p` is a (n, 8) array of distributions over the bins (rows sum
to 1), `y` a (n,) array of true bins 1..8, `predicted_bin` a (n,) array of stated bins 1..8.
Each returns one value per forecast; the caller averages.

Parse failures: `effective_probabilities` swaps a failed row for the uniform distribution, so
full-set means score a failure as "no information" (Brier 0.4375, NLL ln 8); accuracy and
off-by-one count a failure as wrong (a failed forecast states no bin).

>>> import numpy as np
>>> p = np.full((1, 8), 1 / 8)
>>> float(brier(p, np.array([3]))[0])
0.4375
"""

from __future__ import annotations

import math

import numpy as np

from models.bins import NUM_BINS

NLL_FLOOR = 1e-12  # p_y is floored here so a confident miss costs ln(1e12) ~ 27.6 nats, not inf
UNIFORM = np.full(NUM_BINS, 1.0 / NUM_BINS)


def _one_hot(y: np.ndarray) -> np.ndarray:
    """(n,) bins 1..8 -> (n, 8) indicator rows."""
    return np.eye(NUM_BINS)[np.asarray(y, dtype=np.int64) - 1]


def effective_probabilities(p: np.ndarray, parse_ok: np.ndarray) -> np.ndarray:
    """Rows of `p` with each parse failure replaced by the uniform distribution.

    Args:
        p: (n, 8) probabilities; failed rows may hold anything (NaN included).
        parse_ok: (n,) bool, False where the forecast failed to parse.
    Returns:
        (n, 8) array, a copy.

    >>> effective_probabilities(np.array([[1.0] + [0.0] * 7]), np.array([False]))[0, 0]
    np.float64(0.125)
    """
    out = np.array(p, dtype=np.float64, copy=True)
    out[~np.asarray(parse_ok, dtype=bool)] = UNIFORM
    return out


def brier(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Halved multi-class Brier score 0.5 * sum_b (p_b - 1[b=y])^2, in [0, 1].

    >>> float(brier(np.array([[0.0, 1.0] + [0.0] * 6]), np.array([2]))[0])
    0.0
    >>> float(brier(np.array([[1.0] + [0.0] * 7]), np.array([8]))[0])
    1.0
    """
    return 0.5 * np.sum((np.asarray(p, dtype=np.float64) - _one_hot(y)) ** 2, axis=1)


def crps(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Ordinal CRPS (1/7) * sum_{k=1..7} (F_k - 1[k >= y])^2, F_k = sum_{b<=k} p_b.

    Rewards mass near the true bin: one bin off costs less than three bins off.

    >>> float(crps(np.array([[0, 0, 0, 1.0, 0, 0, 0, 0]]), np.array([5]))[0])  # one bin off
    0.14285714285714285
    """
    cdf = np.cumsum(np.asarray(p, dtype=np.float64), axis=1)[:, : NUM_BINS - 1]  # (n, 7): F_1..F_7
    k = np.arange(1, NUM_BINS)  # 1..7
    step = (k[None, :] >= np.asarray(y)[:, None]).astype(np.float64)
    return np.sum((cdf - step) ** 2, axis=1) / (NUM_BINS - 1)


def nll(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Negative log-likelihood -ln max(p_y, 1e-12), nats.

    >>> round(float(nll(np.full((1, 8), 0.125), np.array([1]))[0]), 6) == round(math.log(8), 6)
    True
    """
    p = np.asarray(p, dtype=np.float64)
    py = p[np.arange(p.shape[0]), np.asarray(y, dtype=np.int64) - 1]
    return -np.log(np.maximum(py, NLL_FLOOR))


def entropy(p: np.ndarray) -> np.ndarray:
    """Shannon entropy -sum p ln p in nats (0 ln 0 = 0); uniform over 8 gives ln 8.

    >>> float(entropy(np.array([[1.0] + [0.0] * 7]))[0])
    0.0
    """
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return np.maximum(-np.sum(terms, axis=1), 0.0)  # max(): no -0.0 for a point mass


def accuracy(predicted_bin: np.ndarray, y: np.ndarray, parse_ok: np.ndarray | None = None) -> np.ndarray:
    """1.0 where the stated bin equals the true bin; parse failures count as wrong.

    The stated `predicted_bin` is used as is, even where it differs from argmax(p).

    >>> accuracy(np.array([3, 4]), np.array([3, 3])).tolist()
    [1.0, 0.0]
    """
    hit = np.asarray(predicted_bin) == np.asarray(y)
    if parse_ok is not None:
        hit &= np.asarray(parse_ok, dtype=bool)
    return hit.astype(np.float64)


def off_by_one(predicted_bin: np.ndarray, y: np.ndarray, parse_ok: np.ndarray | None = None) -> np.ndarray:
    """1.0 where |predicted_bin - y| <= 1; parse failures count as wrong.

    >>> off_by_one(np.array([2, 4, 5]), np.array([3, 3, 3])).tolist()
    [1.0, 1.0, 0.0]
    """
    hit = np.abs(np.asarray(predicted_bin, dtype=np.int64) - np.asarray(y, dtype=np.int64)) <= 1
    if parse_ok is not None:
        hit &= np.asarray(parse_ok, dtype=bool)
    return hit.astype(np.float64)


SCORE_KEYS = ("brier", "crps", "nll", "entropy", "accuracy", "off_by_one")


def _mean(x: np.ndarray) -> float:
    return float(np.mean(x)) if x.size else math.nan


def score_means(
    p: np.ndarray, y: np.ndarray, predicted_bin: np.ndarray, parse_ok: np.ndarray,
    keys: tuple[str, ...] = SCORE_KEYS, parsed: bool = True,
) -> dict[str, dict[str, float]]:
    """Full-set and parsed-only means of every score (or of `keys`), plus the parse rate.

    Args:
        p: (n, 8) stated probabilities (rows of failures are ignored).
        y: (n,) true bins.
        predicted_bin: (n,) stated bins (ignored for failures).
        parse_ok: (n,) bool.
        keys: the scores to average (SCORE_KEYS; fewer for a bootstrap replicate, whose
            intervals need only some of them).
        parsed: whether to give the parsed-only means too.
    Returns:
        {"full": {key: mean}, "parsed": {key: mean} ({} without `parsed`), "parse_rate": float};
        full-set means score a failure as uniform (and as wrong for accuracy / off-by-one);
        parsed-only means are NaN when nothing parsed.
    """
    ok = np.asarray(parse_ok, dtype=bool)
    pe = effective_probabilities(p, ok)
    rows = {
        "brier": lambda: brier(pe, y),
        "crps": lambda: crps(pe, y),
        "nll": lambda: nll(pe, y),
        "entropy": lambda: entropy(pe),
        "accuracy": lambda: accuracy(np.where(ok, predicted_bin, 0), y, ok),
        "off_by_one": lambda: off_by_one(np.where(ok, predicted_bin, 0), y, ok),
    }
    per_row = {k: rows[k]() for k in SCORE_KEYS if k in keys}
    return {
        "full": {k: _mean(v) for k, v in per_row.items()},
        "parsed": {k: _mean(v[ok]) for k, v in per_row.items()} if parsed else {},
        "parse_rate": _mean(ok.astype(np.float64)),
    }
