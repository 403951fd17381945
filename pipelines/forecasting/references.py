"""The reference forecasters as adapters of the forecasting interface: uniform, bin prior, oracle.

The probabilities are models.baselines' (the one implementation of the references); these
classes only read what each needs from the pairs frame and answer as every adapter does.
`reference_forecasts` writes the three's rows for a set of pairs at once (the forecasts step's
single-step rows, pipelines.forecasting.plan).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl

from models import baselines
from models.bins import speedups_to_bins
from pipelines.forecasting.base import PairForecaster

REFERENCES = baselines.REFERENCES


class UniformForecaster(PairForecaster):
    """1/8 on every bin (Brier 0.4375)."""

    kind, model_ref, needs_kernels, source = "baseline", "baseline:uniform", False, "reference"

    def _probs(self, pairs, kernels):
        return baselines.uniform_probs(pairs.height)


class BinPriorForecaster(PairForecaster):
    """Per task, the Laplace-smoothed bin frequencies of training pairs (models.baselines.bin_prior);
    the pooled prior for a task the training pairs lack."""

    kind, model_ref, needs_kernels, source = "baseline", "baseline:bin_prior", False, "reference"

    def __init__(self, training_pairs: pl.DataFrame, alpha: float = 1.0):
        if training_pairs is None or training_pairs.is_empty():
            raise ValueError("baseline:bin_prior needs training pairs (task and true_bin or speedup)")
        self.prior = baselines.bin_prior(training_pairs, alpha)

    def _probs(self, pairs, kernels):
        return baselines.prior_probs(self.prior, pairs["task"].cast(pl.Utf8).to_list())


class OracleForecaster(PairForecaster):
    """One-hot on each pair's true bin (its true_bin column, else the bin of its speedup)."""

    kind, model_ref, needs_kernels, source = "baseline", "baseline:oracle", False, "reference"

    def _probs(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
        if "true_bin" in pairs.columns:
            y = pairs["true_bin"].cast(pl.Int64).to_numpy()
        elif "speedup" in pairs.columns:
            y = speedups_to_bins(pairs["speedup"].cast(pl.Float64).to_numpy())
        else:
            raise ValueError("baseline:oracle needs the pairs' true_bin (or speedup)")
        try:
            return baselines.one_hot(y)
        except ValueError as exc:
            raise ValueError(f"baseline:oracle: {exc}") from None


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


def reference_forecasts(eval_pairs: pl.DataFrame, training_pairs: pl.DataFrame) -> pl.DataFrame:
    """Forecasts of uniform, training-set bin prior and oracle on every eval pair (+ discovery pairs)."""
    frames = [
        baselines.uniform_forecasts(eval_pairs).with_columns(pl.lit("baseline:uniform").alias("model_ref")),
        baselines.bin_prior_forecasts(eval_pairs, training_pairs).with_columns(pl.lit("baseline:bin_prior").alias("model_ref")),
        baselines.oracle_forecasts(eval_pairs).with_columns(pl.lit("baseline:oracle").alias("model_ref")),
    ]
    return pl.concat(frames, how="diagonal_relaxed")
