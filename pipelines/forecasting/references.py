"""The reference forecasters (models.baselines) as adapters: uniform, bin prior, oracle."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl

from models.bins import NUM_BINS, speedups_to_bins
from pipelines.forecasting.base import PairForecaster

REFERENCES = ("baseline:uniform", "baseline:bin_prior", "baseline:oracle")


class UniformForecaster(PairForecaster):
    """1/8 on every bin (Brier 0.4375)."""

    kind, model_ref, needs_kernels = "baseline", "baseline:uniform", False

    def _probs(self, pairs, kernels):
        return np.full((pairs.height, NUM_BINS), 1.0 / NUM_BINS)


class BinPriorForecaster(PairForecaster):
    """Per task, the Laplace-smoothed bin frequencies of training pairs (models.baselines.bin_prior);
    the pooled prior for a task the training pairs lack."""

    kind, model_ref, needs_kernels = "baseline", "baseline:bin_prior", False

    def __init__(self, training_pairs: pl.DataFrame, alpha: float = 1.0):
        from models.baselines import bin_prior

        if training_pairs is None or training_pairs.is_empty():
            raise ValueError("baseline:bin_prior needs training pairs (task and true_bin or speedup)")
        self.prior = bin_prior(training_pairs, alpha)

    def _probs(self, pairs, kernels):
        return np.stack([self.prior.get(t, self.prior[None]) for t in pairs["task"].cast(pl.Utf8).to_list()])


class OracleForecaster(PairForecaster):
    """One-hot on each pair's true bin (its true_bin column, else the bin of its speedup)."""

    kind, model_ref, needs_kernels = "baseline", "baseline:oracle", False

    def _probs(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
        if "true_bin" in pairs.columns:
            y = pairs["true_bin"].cast(pl.Int64).to_numpy()
        elif "speedup" in pairs.columns:
            y = speedups_to_bins(pairs["speedup"].cast(pl.Float64).to_numpy())
        else:
            raise ValueError("baseline:oracle needs the pairs' true_bin (or speedup)")
        if np.any((y < 1) | (y > NUM_BINS)):
            raise ValueError(f"baseline:oracle: a true_bin outside 1..{NUM_BINS}")
        p = np.zeros((pairs.height, NUM_BINS))
        p[np.arange(pairs.height), y - 1] = 1.0
        return p


def reference_forecaster(ref: str, training_pairs: pl.DataFrame | None = None) -> PairForecaster:
    """The reference called `ref` (one of REFERENCES).

    Raises:
        ValueError: an unknown reference, or the bin prior without training pairs.
    """
    if ref == "baseline:uniform":
        return UniformForecaster()
    if ref == "baseline:bin_prior":
        return BinPriorForecaster(training_pairs)
    if ref == "baseline:oracle":
        return OracleForecaster()
    raise ValueError(f"unknown reference forecaster {ref!r}; known: {', '.join(REFERENCES)}")
