"""The ensemble: the equal-weight mean of the fitted classical forecasters and the bin prior.

On a task none of them was trained on, each member errs its own way: the cost model's trees
extrapolate the other tasks' feature-to-speedup map, the text model the other tasks' n-grams, the
bin prior only knows how speedups spread over all tasks. Their mean is better calibrated than any
one of them there (docs/results/surrogate.md). The weights are fixed, not fitted: a weight fitted on
the calibration split would learn to trust the members on tasks they were trained on, which is
exactly what a new task does not allow.

It is composed from members that are already fitted and calibrated
(`EnsembleModel.from_members`), so it costs no fit of its own, and it is a BinClassifier like
them: logged, registered and loaded as a classical version of kind `ensemble`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import polars as pl

from models.baselines import bin_prior
from models.calibration import Calibrator
from models.classical.base import CLASSES, BinClassifier


class EnsembleModel(BinClassifier):
    """Mean of `members_` (fitted BinClassifiers) and, with `with_prior`, the per-task bin
    prior of the fit pairs (pooled for a task it never saw); no calibration of its own.

    Args:
        with_prior: include the bin prior as a member.
        prior_alpha: the prior's Laplace pseudo-count per bin.
    """

    kind = "ensemble"

    def __init__(self, with_prior: bool = True, prior_alpha: float = 1.0):
        self.with_prior = with_prior
        self.prior_alpha = prior_alpha

    @classmethod
    def from_members(cls, members: Sequence[BinClassifier], tasks: Sequence[str], true_bin: Sequence[int],
                     with_prior: bool = True, prior_alpha: float = 1.0) -> EnsembleModel:
        """An ensemble of fitted, calibrated `members`, its prior counted from the fit pairs'
        `tasks` and `true_bin` (the pairs the members were fitted on).

        Raises:
            ValueError: no member, or the tasks and bins differ in length or are empty.
        """
        if not members:
            raise ValueError("an ensemble needs at least one fitted member")
        model = cls(with_prior=with_prior, prior_alpha=prior_alpha)
        model._set_prior(np.asarray(list(tasks), dtype=object), np.asarray(true_bin, dtype=np.int64))
        model.members_ = list(members)
        return model

    def _set_prior(self, tasks: np.ndarray, y: np.ndarray) -> None:
        if len(tasks) != len(y) or len(y) == 0:
            raise ValueError(f"the prior needs fit pairs: {len(tasks)} tasks, {len(y)} bins")
        prior = bin_prior(pl.DataFrame({"task": [str(t) for t in tasks], "true_bin": y.tolist()}), self.prior_alpha)
        self.prior_ = {t: p.tolist() for t, p in prior.items() if t is not None}
        self.pooled_prior_ = prior[None].tolist()
        self.classes_ = CLASSES
        self.calibrator_ = Calibrator()  # identity: the members are calibrated, the mean is not fitted

    def _fit(self, frame: pd.DataFrame, y: np.ndarray, log2_speedup: np.ndarray | None) -> None:
        raise TypeError("an EnsembleModel is composed from fitted members (EnsembleModel.from_members)")

    def calibrate(self, frame: pd.DataFrame, true_bin: Sequence[int], objective: str = "nll"):
        """Nothing to fit: the members keep their own calibrators, the weights are fixed."""
        return self.calibrator_

    def prior_rows(self, tasks: Sequence[str]) -> np.ndarray:
        return np.asarray([self.prior_.get(str(t), self.pooled_prior_) for t in tasks], dtype=np.float64)

    def _raw_proba(self, frame: pd.DataFrame) -> np.ndarray:
        parts = [np.asarray(m.predict_proba(frame), dtype=np.float64) for m in self.members_]
        if self.with_prior:
            parts.append(self.prior_rows(frame["task"].astype(str).tolist()))
        p = np.mean(parts, axis=0)
        return p / p.sum(axis=1, keepdims=True)

    def member_kinds(self) -> list[str]:
        return [m.kind for m in self.members_] + (["bin_prior"] if self.with_prior else [])
