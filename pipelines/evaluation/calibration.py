"""Expected calibration error and reliability-diagram data (method.md section 3).

Confidence is the probability the forecast puts on the bin it STATES, p[predicted_bin], so a
forecast whose stated bin is not its argmax is judged on what it said. Ten equal-width
buckets on [0, 1], index min(floor(10 c), 9) (c = 1.0 falls in the top bucket).
ECE = sum_i (n_i / N) |mean confidence_i - accuracy_i| over non-empty buckets, over parsed
forecasts only (a failure states no bin, so it has no confidence to calibrate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

N_BUCKETS = 10


@dataclass(frozen=True)
class Reliability:
    """Per-bucket data of a reliability diagram; bucket i covers [i/10, (i+1)/10).

    Attributes:
        count: (10,) forecasts per bucket.
        mean_confidence: (10,) mean confidence per bucket, NaN where empty.
        accuracy: (10,) share correct per bucket, NaN where empty.
        ece: the expected calibration error (NaN when no forecast parsed).
    """

    count: np.ndarray
    mean_confidence: np.ndarray
    accuracy: np.ndarray
    ece: float

    def to_dict(self) -> dict:
        """JSON-friendly form (NaN -> None)."""

        def clean(a: np.ndarray) -> list:
            return [None if not np.isfinite(v) else float(v) for v in a]

        return {
            "edges": [i / N_BUCKETS for i in range(N_BUCKETS + 1)],
            "count": [int(c) for c in self.count],
            "mean_confidence": clean(self.mean_confidence),
            "accuracy": clean(self.accuracy),
            "ece": None if math.isnan(self.ece) else self.ece,
        }


def stated_confidence(p: np.ndarray, predicted_bin: np.ndarray) -> np.ndarray:
    """p[predicted_bin] per row: (n, 8), (n,) bins 1..8 -> (n,).

    >>> stated_confidence(np.array([[0.1, 0.6] + [0.05] * 6]), np.array([1])).tolist()
    [0.1]
    """
    p = np.asarray(p, dtype=np.float64)
    return p[np.arange(p.shape[0]), np.asarray(predicted_bin, dtype=np.int64) - 1]


def bucket_index(confidence: np.ndarray) -> np.ndarray:
    """min(floor(10 c), 9) per confidence.

    >>> bucket_index(np.array([0.0, 0.099, 0.1, 0.95, 1.0])).tolist()
    [0, 0, 1, 9, 9]
    """
    return np.minimum(np.floor(np.asarray(confidence) * N_BUCKETS), N_BUCKETS - 1).astype(np.int64)


def reliability(confidence: np.ndarray, correct: np.ndarray) -> Reliability:
    """Bucketed calibration of parsed forecasts.

    Args:
        confidence: (n,) stated confidences in [0, 1].
        correct: (n,) bool or 0/1, the stated bin was right.
    Returns:
        A `Reliability`.

    >>> round(reliability(np.array([0.9, 0.9]), np.array([1, 0])).ece, 6)
    0.4
    """
    conf = np.asarray(confidence, dtype=np.float64)
    corr = np.asarray(correct, dtype=np.float64)
    idx = bucket_index(conf)
    count = np.bincount(idx, minlength=N_BUCKETS).astype(np.int64)
    conf_sum = np.bincount(idx, weights=conf, minlength=N_BUCKETS)
    corr_sum = np.bincount(idx, weights=corr, minlength=N_BUCKETS)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.where(count > 0, conf_sum / np.maximum(count, 1), np.nan)
        acc = np.where(count > 0, corr_sum / np.maximum(count, 1), np.nan)
    n = conf.size
    if n == 0:
        ece = math.nan
    else:
        nonempty = count > 0
        ece = float(np.sum(count[nonempty] / n * np.abs(mean_conf[nonempty] - acc[nonempty])))
    return Reliability(count=count, mean_confidence=mean_conf, accuracy=acc, ece=ece)


def expected_calibration_error(
    p: np.ndarray, predicted_bin: np.ndarray, y: np.ndarray, parse_ok: np.ndarray
) -> Reliability:
    """ECE and reliability data from forecasts; parse failures are left out.

    Args:
        p: (n, 8) probabilities.
        predicted_bin: (n,) stated bins.
        y: (n,) true bins.
        parse_ok: (n,) bool.
    Returns:
        A `Reliability` over the parsed rows.
    """
    ok = np.asarray(parse_ok, dtype=bool)
    pb = np.asarray(predicted_bin)[ok]
    conf = stated_confidence(np.asarray(p)[ok], pb)
    return reliability(conf, pb == np.asarray(y)[ok])
