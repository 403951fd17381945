"""A gradient-boosted cost model of kernel pairs (what TVM's Ansor / TenSet do with XGBoost).

It regresses log2 S (candidate over anchor) on the features of both kernels
(models.classical.features: task, family, knobs, sm_90 compile features, source counts, and
candidate-minus-anchor differences) with scikit-learn's HistGradientBoostingRegressor, then
turns the point forecast mu into an eight-bin distribution: log2 S ~ Laplace(mu, b_task), the
probability of each bin the Laplace mass between its edges.

Why a regression and not an 8-class classifier: the bins are ordered, so a forecast of
"about 1.9x" should put mass on bins 6 and 7, not spread it over unrelated classes; measured on
the H200 eval set, the regression with a Laplace spread scored a lower Brier than a boosted
classifier with temperature scaling (docs/results/surrogate.md), fits in seconds instead of a
minute (one model, not eight one-vs-rest ensembles), and does not inherit the training pool's
skew towards fast kernels as a class prior.

The spread b_task is the calibration: one scale per task, fitted on the calibration split by
minimising the Brier score, shrunk towards the pooled scale (a task with few calibration
pairs stays near it). Tasks unseen at calibration use the pooled scale.

Generator metadata (algorithm, knobs, generator) is an optional extra: with `metadata_dropout`
= f, a deterministic fraction f of the fit pairs has it withheld on both sides, so the trees
learn to forecast from the source-derived features alone as well as with it, and calibration
sees every calibration pair twice, with and without it, fitting a spread per task for each
(`task` and `task|bare`: a forecast from the source alone is less sharp). f = 1 ignores the
metadata altogether. Why 1 by default: measured by pipelines.surrogates.classical on the
committed H200 data (default profile, 788 eval pairs), a fit without dropout scores eval Brier
0.259 with metadata but 0.386 when refit without it (0.694 when it is merely withheld at
forecast time); with the source constants and jit-function names of models.classical.features
and the committed trace features (data/features/sm_90/source-features-*.parquet), f = 1 scores
0.268 on every pair (metadata or not) and f = 0.5 scores 0.249 with metadata but 0.290 from the
source alone, which is what a user's file gives.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.ensemble import HistGradientBoostingRegressor

from models.classical.base import BinClassifier
from models.classical.features import (
    FeatureSpace,
    dropout_rows,
    scale_keys,
    withhold_metadata,
    work_ratio,
)
from models.classical.spread import fit_scales, laplace_bins

DEFAULT_SCALE = 0.3  # before calibration: about the pooled value seen on H200 data


class CostModel(BinClassifier):
    """Boosted regression of log2 S with a per-task Laplace spread.

    Args:
        max_iter: boosting rounds.
        learning_rate: shrinkage per round.
        max_leaf_nodes: leaves per tree (deep trees: families x knobs interact).
        min_samples_leaf: smallest leaf.
        random_state: seed.
        metadata_dropout: fraction of fit pairs whose generator metadata is withheld (0: none,
            1: all; see the module docstring).
    """

    kind = "cost_model"

    def __init__(self, max_iter: int = 400, learning_rate: float = 0.05, max_leaf_nodes: int = 31,
                 min_samples_leaf: int = 20, random_state: int = 0, metadata_dropout: float = 1.0,
                 work_prior: bool = True):
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.max_leaf_nodes = max_leaf_nodes
        self.min_samples_leaf = min_samples_leaf
        self.random_state = random_state
        self.metadata_dropout = metadata_dropout
        self.work_prior = work_prior

    def _fit(self, frame: pd.DataFrame, y: np.ndarray, log2_speedup: np.ndarray | None) -> None:
        if log2_speedup is None:
            raise ValueError("the cost model regresses on log2 speedup: pass log2_speedup")
        frame = withhold_metadata(frame, dropout_rows(frame, self.metadata_dropout, self.random_state))
        self.space_ = FeatureSpace().fit(frame)
        self.prior_ = WorkPrior.fit(work_ratio(frame), log2_speedup, launch_kinds(frame)) if self.work_prior else None
        self.regressor_ = HistGradientBoostingRegressor(
            categorical_features="from_dtype", max_iter=self.max_iter, learning_rate=self.learning_rate,
            max_leaf_nodes=self.max_leaf_nodes, min_samples_leaf=self.min_samples_leaf,
            early_stopping=False, random_state=self.random_state,
        ).fit(self.space_.transform(frame), log2_speedup)  # the prior's offset is 0 on every fit pair (inside its range)
        self.scale_ = DEFAULT_SCALE
        self.task_scales_: dict[str, float] = {}

    def predict_log2(self, frame: pd.DataFrame) -> np.ndarray:
        """The point forecast of log2 S per pair: the trees, plus the work prior past its range;
        the prior's line alone for a candidate of a kind the trees never saw (WorkPrior)."""
        table = self.space_.transform(frame)
        mu = self.regressor_.predict(table)
        prior = getattr(self, "prior_", None)  # models pickled before the prior have none
        if prior is None:
            return mu
        ratio = work_ratio(frame)
        line = prior.line(ratio)
        return np.where(prior.novel(launch_kinds(frame)) & np.isfinite(line), line, mu + prior.predict(ratio))

    def _scales(self, frame: pd.DataFrame) -> np.ndarray:
        scales = np.array([self.task_scales_.get(k, self.task_scales_.get(k.split("|")[0], self.scale_))
                           for k in scale_keys(frame)], dtype=np.float64)
        prior = getattr(self, "prior_", None)
        if prior is None:
            return scales
        # the line's forecasts spread as its errors did on the fit pairs, at least as the trees' do
        novel = prior.novel(launch_kinds(frame)) & np.isfinite(prior.line(work_ratio(frame)))
        return np.where(novel, np.maximum(scales, prior.scale), scales)

    def calibrate(self, frame: pd.DataFrame, true_bin, objective: str = "nll"):
        """Calibrate on the calibration pairs, and (with metadata dropout) on the same pairs
        with the metadata withheld, so both kinds of forecast are calibrated."""
        if self.metadata_dropout > 0:
            y = np.asarray(true_bin, dtype=np.int64)
            frame = pd.concat([frame, withhold_metadata(frame)], ignore_index=True)
            true_bin = np.concatenate([y, y])
        return super().calibrate(frame, true_bin, objective)

    def _raw_proba(self, frame: pd.DataFrame) -> np.ndarray:
        return laplace_bins(self.predict_log2(frame), self._scales(frame))

    def _calibrate_extra(self, frame: pd.DataFrame, y: np.ndarray) -> None:
        """Fit the pooled and per-task Laplace scales on the calibration pairs (Brier)."""
        if len(y) == 0:
            return
        self.scale_, self.task_scales_ = fit_scales(self.predict_log2(frame), y, scale_keys(frame))


def launch_kinds(frame: pd.DataFrame) -> np.ndarray:
    """Per pair, what the candidate's traced call launches: 'triton' (Triton kernels, with or
    without torch ops), 'torch' (torch ops only: a PyTorch program) or 'unknown' (no trace)."""
    launches = pd.to_numeric(frame.get("c_trace_launches", pd.Series(np.nan, index=frame.index)),
                             errors="coerce").to_numpy(dtype=np.float64)
    return np.where(launches > 0, "triton", np.where(launches == 0, "torch", "unknown"))


class WorkPrior:
    """What the cost model forecasts where its trees have no data, from the candidate-minus-anchor
    log ratio of estimated call time (`d:work:time_log2`, models.classical.features.work_features):
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
