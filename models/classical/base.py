"""What every classical forecaster shares: the eight-bin output, calibration, the search hook.

A classical forecaster is a scikit-learn estimator over a pair frame
(`models.classical.features.pair_frame`): `predict_proba(frame)` gives an (n, 8) distribution
over the bins of models/bins.py, calibrated by the `Calibrator` fitted on the calibration split,
and `predict_kernels(anchor, candidates, hardware_id)` is the same call from kernel records, the
hook the budgeted search uses. It is pickled inside an MLflow sklearn model, so it must stay a
plain picklable object (no open files, no lambdas).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, ClassifierMixin

from models.bins import NUM_BINS
from models.calibration import Calibrator
from models.classical.features import pair_frame

CLASSES = np.arange(1, NUM_BINS + 1)


class BinClassifier(ClassifierMixin, BaseEstimator):
    """Base class of the scikit-learn estimators (pair frame in, bins out; the product's forecaster
    around one is pipelines.forecasting.classical.ClassicalForecaster): subclasses implement
    `_fit(frame, true_bin, log2_speedup)` and `_raw_proba(frame)`; calibration, class
    bookkeeping and the kernel hook live here."""

    kind = "classical"

    def fit(self, frame: pd.DataFrame, true_bin: Sequence[int], log2_speedup: Sequence[float] | None = None):
        """Fit on training pairs.

        Args:
            frame: pair frame of the fit pairs.
            true_bin: their true bins (1..8).
            log2_speedup: their log2 S (models that regress on it need it).
        Returns:
            self.
        """
        y = np.asarray(true_bin, dtype=np.int64)
        if len(y) != len(frame):
            raise ValueError(f"{len(frame)} pairs but {len(y)} labels")
        if len(y) == 0:
            raise ValueError("no training pairs")
        self.classes_ = CLASSES
        self.calibrator_ = Calibrator()
        self._fit(frame, y, None if log2_speedup is None else np.asarray(log2_speedup, dtype=np.float64))
        return self

    def calibrate(self, frame: pd.DataFrame, true_bin: Sequence[int], objective: str = "nll") -> Calibrator:
        """Fit the calibrator on calibration pairs (never eval pairs) and keep it."""
        self._calibrate_extra(frame, np.asarray(true_bin, dtype=np.int64))
        from models.calibration import fit_calibrator

        self.calibrator_ = fit_calibrator(self._raw_proba(frame), true_bin, objective=objective, biases=False)
        return self.calibrator_

    def predict_proba(self, frame: pd.DataFrame) -> np.ndarray:
        """Calibrated (n, 8) probabilities of bins 1..8."""
        if len(frame) == 0:
            return np.zeros((0, NUM_BINS))
        return self.calibrator_.apply(self._raw_proba(frame))

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        """The most probable bin per pair (first maximum)."""
        return np.argmax(self.predict_proba(frame), axis=1) + 1

    def predict_kernels(
        self, anchor: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]], hardware_id: str
    ) -> np.ndarray:
        """(n, 8) forecasts of each candidate against one anchor (the search's hook)."""
        frame = pair_frame([anchor] * len(candidates), list(candidates))
        return self.predict_proba(frame)

    # ---- to implement ---------------------------------------------------------------------
    def _fit(self, frame: pd.DataFrame, y: np.ndarray, log2_speedup: np.ndarray | None) -> None:
        raise NotImplementedError

    def _raw_proba(self, frame: pd.DataFrame) -> np.ndarray:
        raise NotImplementedError

    def _calibrate_extra(self, frame: pd.DataFrame, y: np.ndarray) -> None:
        """Model-specific calibration before the temperature (default: none)."""


def full_proba(proba: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """An estimator's predict_proba over its seen classes, spread onto all eight bins (a bin
    absent from training gets probability 0, which the calibrator's floor keeps finite)."""
    out = np.zeros((proba.shape[0], NUM_BINS))
    out[:, np.asarray(classes, dtype=np.int64) - 1] = proba
    return out
