"""Discovery moments: does the forecaster spot a child kernel that beats its parent?

On parent -> child pairs (anchor = parent, candidate = child) a true discovery is S > 1. The
predicted probability of a discovery is the mass on the speedup bins 5..8. A forecast counts
as predicting a discovery when that probability is strictly above 0.5, so a parse failure
(scored as uniform, exactly 0.5) never claims one. PR-AUC is average precision
AP = sum_n (R_n - R_{n-1}) P_n over the distinct probabilities, highest first (ties enter
together), as scikit-learn defines it.
"""

from __future__ import annotations

import math

import numpy as np

DECISION_THRESHOLD = 0.5


def discovery_probability(p: np.ndarray) -> np.ndarray:
    """Sum of p over bins 5..8 for (n, 8) distributions.

    >>> discovery_probability(np.array([[0.1] * 4 + [0.15] * 4])).round(6).tolist()
    [0.6]
    """
    return np.asarray(p, dtype=np.float64)[:, 4:].sum(axis=1)


def average_precision(prob: np.ndarray, truth: np.ndarray) -> float:
    """Average precision of scores `prob` for binary `truth`; NaN with no positives.

    >>> average_precision(np.array([0.9, 0.8, 0.7]), np.array([1, 0, 1]))  # 1*0.5 + (2/3)*0.5
    0.8333333333333333
    """
    prob = np.asarray(prob, dtype=np.float64)
    truth = np.asarray(truth, dtype=bool)
    pos = int(truth.sum())
    if pos == 0:
        return math.nan
    order = np.argsort(-prob, kind="stable")
    s, t = prob[order], truth[order].astype(np.float64)
    last = np.nonzero(np.r_[s[1:] != s[:-1], True])[0]
    tp = np.cumsum(t)[last]
    precision = tp / (last + 1)
    recall = tp / pos
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def discovery_metrics(prob: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """Precision, recall, F1 at 0.5, PR-AUC and base rate.

    Args:
        prob: (n,) predicted probability of a discovery.
        truth: (n,) bool, S > 1.
    Returns:
        {"n", "base_rate", "precision", "recall", "f1", "pr_auc"}; a ratio with a zero
        denominator is NaN (no predicted positives: precision; no positives: recall, PR-AUC).

    >>> m = discovery_metrics(np.array([0.9, 0.6, 0.2, 0.4]), np.array([1, 0, 1, 0]))
    >>> m["precision"], m["recall"], m["f1"], m["base_rate"]
    (0.5, 0.5, 0.5, 0.5)
    """
    prob = np.asarray(prob, dtype=np.float64)
    truth = np.asarray(truth, dtype=bool)
    pred = prob > DECISION_THRESHOLD
    tp = float(np.sum(pred & truth))
    n_pred, n_pos = float(pred.sum()), float(truth.sum())
    precision = tp / n_pred if n_pred else math.nan
    recall = tp / n_pos if n_pos else math.nan
    if math.isnan(precision) or math.isnan(recall):
        f1 = math.nan
    else:
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "n": int(prob.size),
        "base_rate": float(truth.mean()) if truth.size else math.nan,
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "pr_auc": average_precision(prob, truth),
    }
