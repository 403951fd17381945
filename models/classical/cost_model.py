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

Where the trees have no data, the work prior (models.classical.work_prior) forecasts: a candidate
of a launch kind the fit pairs lacked (a PyTorch program when only Triton kernels were fitted) by
a line in the candidate-minus-anchor log ratio of estimated call time, and a pair past the fitted
range of that ratio by the trees extended along the line (docs/results/styles.md).
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
from models.classical.work_prior import WorkPrior, launch_kinds

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
        return prior.apply(mu, np.zeros(len(mu)), work_ratio(frame), launch_kinds(frame))[0]

    def _scales(self, frame: pd.DataFrame) -> np.ndarray:
        scales = np.array([self.task_scales_.get(k, self.task_scales_.get(k.split("|")[0], self.scale_))
                           for k in scale_keys(frame)], dtype=np.float64)
        prior = getattr(self, "prior_", None)
        if prior is None:
            return scales
        # the line's forecasts spread as its errors did on the fit pairs, at least as the trees' do
        return prior.apply(np.zeros(len(scales)), scales, work_ratio(frame), launch_kinds(frame))[1]

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
