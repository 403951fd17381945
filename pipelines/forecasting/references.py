"""The reference forecasters as adapters of the forecasting interface: uniform, bin prior, oracle.

The probabilities are models.baselines' (the one implementation of the references); these
classes only read what each needs and answer as every adapter does. The evaluation gives them
pairs frames (the bin prior its training pairs, the oracle each pair's true_bin); the budgeted
search gives them its kernel records (`predict_kernels`), the bin prior a prior per task and the
oracle the measured table, and there they read no frame: a bare GPU host's live search runs
them without polars (it is imported only by the frame paths).
`reference_forecasts` writes the three's rows for a set of pairs at once (the forecasts step's
single-step rows, pipelines.forecasting.plan).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from models import baselines
from models.bins import speedup_to_bin, speedups_to_bins
from pipelines.forecasting.base import PairForecaster

if TYPE_CHECKING:  # see the module docstring
    import polars as pl

REFERENCES = baselines.REFERENCES


class UniformForecaster(PairForecaster):
    """1/8 on every bin (Brier 0.4375)."""

    kind, model_ref, needs_kernels, source = "baseline", "baseline:uniform", False, "reference"
    name = "uniform"  # what the search resolves and prints

    def _probs(self, pairs, kernels):
        return baselines.uniform_probs(pairs.height)

    def predict_kernels(self, anchor, candidates, hardware_id):
        return baselines.uniform_probs(len(candidates))


class BinPriorForecaster(PairForecaster):
    """Per task, a prior over the bins: of training pairs (`from_pairs`, the Laplace-smoothed
    frequencies of models.baselines.bin_prior) or given (the search's, of its measured table);
    the pooled prior (key None) for a task it lacks.

    Args:
        prior: task (None: pooled) -> its eight probabilities, used as given.
    """

    kind, model_ref, needs_kernels, source = "baseline", "baseline:bin_prior", False, "reference"
    name = "bin-prior"

    def __init__(self, prior: Mapping[str | None, Any]):
        self.prior = {k: np.asarray(v, dtype=np.float64) for k, v in prior.items()}

    @classmethod
    def from_pairs(cls, training_pairs: pl.DataFrame | None, alpha: float = 1.0) -> BinPriorForecaster:
        """The prior of `training_pairs` (task and true_bin or speedup).

        Raises:
            ValueError: no training pairs (one line).
        """
        if training_pairs is None or training_pairs.is_empty():
            raise ValueError("baseline:bin_prior needs training pairs (task and true_bin or speedup)")
        return cls(baselines.bin_prior(training_pairs, alpha))

    def _probs(self, pairs, kernels):
        import polars as pl

        return baselines.prior_probs(self.prior, pairs["task"].cast(pl.Utf8).to_list())

    def predict_kernels(self, anchor, candidates, hardware_id):
        # the pair's task, as single_anchor_pairs gives it: the candidate's, else the anchor's
        return baselines.prior_probs(self.prior, [c.get("task") or anchor.get("task") or "" for c in candidates])


class OracleForecaster(PairForecaster):
    """One-hot on each pair's true bin: with `measured`, the bin of S = speedup(candidate) /
    speedup(anchor) read off the measured outcomes (the search's oracle); without, the pairs'
    true_bin column, else the bin of their speedup column (the evaluation's).

    From measured outcomes: the anchor's speedup is 1 for a task reference (generator
    'reference'); a failed candidate gets bin 1 (nothing is slower than a kernel that does not
    work); a candidate or anchor that was not measured gets the uniform distribution.

    Args:
        measured: kernel id -> its measured outcome (`get(kernel_id)`, None when unknown; an
            outcome has `ok`, `speedup` and `status`): pipelines.search.table.MeasuredTable.
    """

    kind, model_ref, source = "baseline", "baseline:oracle", "reference"
    name = "oracle"

    def __init__(self, measured: Any = None):
        self.measured = measured
        self.needs_kernels = measured is not None  # the records' kernel ids are looked up

    def _anchor_speedup(self, anchor: Mapping[str, Any]) -> float | None:
        if anchor.get("generator") == "reference":
            return 1.0
        outcome = self.measured.get(anchor["kernel_id"])
        return outcome.speedup if outcome is not None and outcome.ok else None

    def _measured_probs(self, anchor: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]]) -> np.ndarray:
        out = baselines.uniform_probs(len(candidates))
        base = self._anchor_speedup(anchor)
        if base is None:
            return out
        known: dict[int, int] = {}  # candidate position -> its true bin
        for i, cand in enumerate(candidates):
            outcome = self.measured.get(cand["kernel_id"])
            if outcome is not None and outcome.status != "unmeasured":
                known[i] = speedup_to_bin(outcome.speedup / base) if outcome.ok else 1
        if known:
            out[list(known)] = baselines.one_hot(list(known.values()))
        return out

    def predict_kernels(self, anchor, candidates, hardware_id):
        if self.measured is None:
            return super().predict_kernels(anchor, candidates, hardware_id)
        return self._measured_probs(anchor, candidates)

    def _probs(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
        import polars as pl

        if self.measured is not None:
            anchors, cands = pairs["anchor_kernel_id"].to_list(), pairs["candidate_kernel_id"].to_list()
            return np.concatenate([self._measured_probs(kernels[a], [kernels[c]]) for a, c in zip(anchors, cands)])
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
        return BinPriorForecaster.from_pairs(training_pairs)
    if ref == "baseline:oracle":
        return OracleForecaster()
    raise ValueError(f"unknown reference forecaster {ref!r}; known: {', '.join(REFERENCES)}")


def reference_forecasts(eval_pairs: pl.DataFrame, training_pairs: pl.DataFrame) -> pl.DataFrame:
    """Forecasts of uniform, training-set bin prior and oracle on every eval pair (+ discovery pairs)."""
    import polars as pl

    frames = [
        baselines.uniform_forecasts(eval_pairs).with_columns(pl.lit("baseline:uniform").alias("model_ref")),
        baselines.bin_prior_forecasts(eval_pairs, training_pairs).with_columns(pl.lit("baseline:bin_prior").alias("model_ref")),
        baselines.oracle_forecasts(eval_pairs).with_columns(pl.lit("baseline:oracle").alias("model_ref")),
    ]
    return pl.concat(frames, how="diagonal_relaxed")
