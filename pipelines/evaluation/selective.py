"""Selective prediction: risk-coverage curves and AURC (method.md section 3).

A forecaster that may abstain answers only when its confidence score is at least a
threshold t. For every distinct score t (highest first) the covered set is the parsed
forecasts with score >= t; parse failures always abstain.

- coverage(t) = covered / N, N = all forecasts, failures included, so the curve ends at
  coverage = parse rate.
- risk(t) = 1 - accuracy of the covered set (accuracy of the stated bin).
- AURC: trapezoid rule over the curve points in order of coverage, with the first point's
  risk held flat back to coverage 0 (so a forecaster with a single distinct score gets its
  plain error rate, not 0), divided by the largest coverage reached. With no parse failures
  that is the usual area under [0, 1]; with failures it is the mean risk over the coverage
  the forecaster can reach, so failures do not shrink the area; read it beside parse_rate.
- Selective risk at 50% coverage: the risk at the first threshold whose coverage reaches
  0.5 (an operating point one can actually pick, no interpolation); None when the
  forecaster never reaches 50% coverage (parse rate < 0.5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from models.bins import NUM_BINS

CONFIDENCE_SCORES = ("max_prob", "certainty", "margin")


def confidence_scores(p: np.ndarray, names: tuple[str, ...] = CONFIDENCE_SCORES) -> dict[str, np.ndarray]:
    """The three confidence scores of (n, 8) distributions (or those of `names`).

    Returns:
        {"max_prob": max_b p_b, "certainty": 1 - H(p) / ln 8, "margin": top-1 minus top-2 p},
        in that order, restricted to `names`.

    >>> s = confidence_scores(np.array([[0.5, 0.3, 0.2] + [0.0] * 5]))
    >>> float(s["max_prob"][0]), round(float(s["margin"][0]), 6)
    (0.5, 0.2)
    """
    p = np.asarray(p, dtype=np.float64)
    srt = np.sort(p, axis=1)
    out = {}
    if "max_prob" in names:
        out["max_prob"] = srt[:, -1]
    if "certainty" in names:
        with np.errstate(divide="ignore", invalid="ignore"):
            h = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=1)
        out["certainty"] = 1.0 - h / math.log(NUM_BINS)
    if "margin" in names:
        out["margin"] = srt[:, -1] - srt[:, -2]
    return out


@dataclass(frozen=True)
class RiskCoverage:
    """A risk-coverage curve, points in increasing coverage (decreasing threshold)."""

    threshold: np.ndarray
    coverage: np.ndarray
    risk: np.ndarray

    @property
    def aurc(self) -> float:
        """Normalised trapezoid area (see the module docstring); NaN for an empty curve."""
        return aurc(self.coverage, self.risk)

    def risk_at(self, target: float = 0.5) -> float:
        """Risk at the first point with coverage >= target; NaN if never reached."""
        hit = np.nonzero(self.coverage >= target - 1e-12)[0]
        return float(self.risk[hit[0]]) if hit.size else math.nan

    def to_dict(self) -> dict:
        """JSON-friendly form."""
        return {"coverage": self.coverage.tolist(), "risk": self.risk.tolist()}


def risk_coverage(score: np.ndarray, correct: np.ndarray, parse_ok: np.ndarray) -> RiskCoverage:
    """Risk-coverage curve over every distinct score of the parsed forecasts.

    Args:
        score: (n,) confidence scores (failed rows ignored).
        correct: (n,) bool, the stated bin was right.
        parse_ok: (n,) bool.
    Returns:
        A `RiskCoverage` with one point per distinct parsed score.

    >>> rc = risk_coverage(np.array([0.9, 0.8, 0.8, 0.1]), np.array([1, 0, 1, 0]), np.ones(4, bool))
    >>> rc.coverage.tolist(), rc.risk.tolist()
    ([0.25, 0.75, 1.0], [0.0, 0.3333333333333333, 0.5])
    """
    ok = np.asarray(parse_ok, dtype=bool)
    n = ok.size
    s = np.asarray(score, dtype=np.float64)[ok]
    c = np.asarray(correct, dtype=np.float64)[ok]
    if s.size == 0:
        empty = np.zeros(0)
        return RiskCoverage(empty, empty, empty)
    order = np.argsort(-s, kind="stable")
    s, c = s[order], c[order]
    # The last index of each run of equal scores: a threshold covers whole ties at once.
    last = np.nonzero(np.r_[s[1:] != s[:-1], True])[0]
    covered = last + 1
    errors = np.cumsum(1.0 - c)[last]
    return RiskCoverage(threshold=s[last], coverage=covered / n, risk=errors / covered)


def aurc(coverage: np.ndarray, risk: np.ndarray) -> float:
    """Trapezoid area under (coverage, risk), first risk held back to 0, over max coverage.

    >>> aurc(np.array([0.5, 1.0]), np.array([0.0, 1.0]))  # 0 on [0, .5], ramp 0->1 on [.5, 1]
    0.25
    """
    coverage = np.asarray(coverage, dtype=np.float64)
    risk = np.asarray(risk, dtype=np.float64)
    if coverage.size == 0 or coverage[-1] <= 0:
        return math.nan
    x = np.r_[0.0, coverage]
    r = np.r_[risk[0], risk]
    area = float(np.sum((x[1:] - x[:-1]) * (r[1:] + r[:-1]) / 2.0))
    return area / float(coverage[-1])


def coverage_at_brier(score: np.ndarray, brier: np.ndarray, parse_ok: np.ndarray, target: float) -> float:
    """The largest coverage at which the selected forecasts' mean Brier is at most `target`.

    Forecasts are selected by decreasing confidence `score`, whole ties at once; parse failures
    always abstain; coverage counts them in the denominator (as `risk_coverage`). 0.0 when no
    threshold reaches the target (or nothing parsed), NaN for a NaN target.

    Args:
        score: (n,) confidence (max-prob for the report).
        brier: (n,) each forecast's Brier.
        parse_ok: (n,) bool.
        target: the Brier to reach (the best forecaster's at full coverage).

    >>> coverage_at_brier(np.array([0.9, 0.8, 0.5, 0.4]), np.array([0.1, 0.2, 0.6, 0.2]), np.ones(4, bool), 0.3)
    1.0
    >>> coverage_at_brier(np.array([0.9, 0.8, 0.5, 0.4]), np.array([0.1, 0.2, 0.9, 0.9]), np.ones(4, bool), 0.3)
    0.5
    >>> coverage_at_brier(np.array([0.9, 0.8]), np.array([0.5, 0.5]), np.ones(2, bool), 0.3)
    0.0
    """
    if not math.isfinite(target):
        return math.nan
    ok = np.asarray(parse_ok, dtype=bool)
    n = ok.size
    s = np.asarray(score, dtype=np.float64)[ok]
    b = np.asarray(brier, dtype=np.float64)[ok]
    if s.size == 0:
        return 0.0
    order = np.argsort(-s, kind="stable")
    s, b = s[order], b[order]
    last = np.nonzero(np.r_[s[1:] != s[:-1], True])[0]
    covered = last + 1
    mean = np.cumsum(b)[last] / covered
    hit = np.nonzero(mean <= target + 1e-12)[0]
    return float(covered[hit[-1]] / n) if hit.size else 0.0
