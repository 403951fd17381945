"""The cost model's work prior: what it forecasts where its trees have no data.

Only numpy and pandas, so the portable twin (models.classical.portable) applies it on a GPU host
without scikit-learn.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def launch_kinds(frame: pd.DataFrame) -> np.ndarray:
    """Per pair, what the candidate's traced call launches: 'triton' (Triton kernels, with or
    without torch ops), 'torch' (torch ops only: a PyTorch program) or 'unknown' (no trace)."""
    launches = pd.to_numeric(frame.get("c_trace_launches", pd.Series(np.nan, index=frame.index)),
                             errors="coerce").to_numpy(dtype=np.float64)
    return np.where(launches > 0, "triton", np.where(launches == 0, "torch", "unknown"))


class WorkPrior:
    """What the cost model forecasts where its trees have no data, from the candidate-minus-anchor
    log ratio of estimated call time (models.classical.features.work_ratio of `work:time_log2`):
    a line of log2 S in that ratio, least squares over the fit pairs.

    Why: trees do not extrapolate. Fitted on kernels of one way of writing (Triton kernels, nearly
    all faster than the reference), they forecast for a PyTorch program that launches ten times the
    reference's kernels and moves twice its bytes what they learned of Triton kernels. Two uses:
    - past the fit pairs' range of the ratio, the trees' forecast goes on along the line's slope
      (more estimated work than any fitted pair, a lower forecast); inside it, the trees alone;
    - a candidate whose kind of launches (`launch_kinds`: Triton kernels, or torch ops only) fewer
      than MIN_PAIRS fit pairs had is forecast by the line alone, with the spread of the line's
      errors on the fit pairs (`scale`, at least the trees' calibrated one).
    Pairs of kinds the trees saw, inside the range, are the trees' alone, so a forecaster's figures
    on the pairs it was made for do not move; pairs without a trace are left to the trees.

    Attributes:
        slope, intercept: the line (slope None: no line, no offset, nothing novel).
        low, high: the fit pairs' range of the ratio.
        scale: the mean absolute error of the line on the fit pairs (a Laplace scale).
        kinds: fit pairs per launch kind.
    """

    MIN_PAIRS = 20  # fewer pairs with a known ratio: no line; fewer of a launch kind: novel

    def __init__(self, slope: float | None, intercept: float = 0.0, low: float = 0.0, high: float = 0.0,
                 scale: float = 0.0, kinds: dict[str, int] | None = None):
        self.slope, self.intercept, self.low, self.high, self.scale = slope, intercept, low, high, scale
        self.kinds = dict(kinds or {})

    @classmethod
    def fit(cls, ratio: np.ndarray, log2_speedup: np.ndarray, kinds: np.ndarray | None = None) -> WorkPrior:
        """The line, range and spread over the pairs whose ratio is known (models.classical.features.
        work_ratio), and the fit pairs' launch kinds.

        >>> t = np.linspace(-4.0, 1.0, 30)
        >>> p = WorkPrior.fit(t, -t, np.array(["triton"] * 30))
        >>> round(p.slope, 3), p.low, p.high, p.kinds
        (-1.0, -4.0, 1.0, {'triton': 30})
        >>> [round(float(v), 6) + 0.0 for v in p.predict(np.array([0.0, 3.0, -6.0, np.nan]))]
        [0.0, -2.0, 2.0, 0.0]
        >>> p.novel(np.array(["triton", "torch", "unknown"])).tolist()
        [False, True, False]
        """
        y = np.asarray(log2_speedup, dtype=np.float64)
        x = np.asarray(ratio, dtype=np.float64)
        known = np.isfinite(x) & np.isfinite(y)
        if known.sum() < cls.MIN_PAIRS or np.ptp(x[known]) == 0:
            return cls(None)
        slope, intercept = np.polyfit(x[known], y[known], 1)
        scale = float(np.mean(np.abs(y[known] - (intercept + slope * x[known]))))
        counts = pd.Series(kinds).value_counts().to_dict() if kinds is not None else {}
        return cls(float(slope), float(intercept), float(x[known].min()), float(x[known].max()), scale,
                   {str(k): int(v) for k, v in counts.items()})

    def predict(self, ratio: np.ndarray) -> np.ndarray:
        """The offset of each pair: the slope times how far its ratio lies past the range (0 inside
        it or unknown)."""
        x = np.asarray(ratio, dtype=np.float64)
        if self.slope is None:
            return np.zeros(len(x))
        return self.slope * np.where(np.isfinite(x), x - np.clip(x, self.low, self.high), 0.0)

    def line(self, ratio: np.ndarray) -> np.ndarray:
        """The line at each pair's ratio (NaN where it is unknown or there is no line)."""
        x = np.asarray(ratio, dtype=np.float64)
        if self.slope is None:
            return np.full(len(x), np.nan)
        return self.intercept + self.slope * x

    def novel(self, kinds: np.ndarray) -> np.ndarray:
        """Per pair: a known launch kind fewer than MIN_PAIRS fit pairs had (never where there is
        no line)."""
        kinds = np.asarray(kinds)
        if self.slope is None:
            return np.zeros(len(kinds), dtype=bool)
        return np.array([k != "unknown" and self.kinds.get(str(k), 0) < self.MIN_PAIRS for k in kinds], dtype=bool)

    def to_dict(self) -> dict:
        """The prior as JSON-ready values (`from_dict` reads them back)."""
        return {"slope": self.slope, "intercept": self.intercept, "low": self.low, "high": self.high,
                "scale": self.scale, "kinds": self.kinds}

    @classmethod
    def from_dict(cls, d: dict) -> WorkPrior:
        slope = d.get("slope")
        return cls(None if slope is None else float(slope), float(d.get("intercept", 0.0)), float(d.get("low", 0.0)),
                   float(d.get("high", 0.0)), float(d.get("scale", 0.0)),
                   {str(k): int(v) for k, v in (d.get("kinds") or {}).items()})

    def apply(self, mu: np.ndarray, scales: np.ndarray, ratio: np.ndarray, kinds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The trees' forecasts `mu` and spreads `scales` with the prior applied: the line (and the
        wider of the two spreads) for a novel candidate, the trees plus the offset past the range
        for the others."""
        line = self.line(ratio)
        novel = self.novel(kinds) & np.isfinite(line)
        return (np.where(novel, line, np.asarray(mu) + self.predict(ratio)),
                np.where(novel, np.maximum(scales, self.scale), scales))
