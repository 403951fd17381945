"""Reference forecasters: the floor and the ceiling every surrogate is read against.

Each takes a pairs frame (columns pair_id, task, speedup, and optionally hardware_id,
anchor_kernel_id, candidate_kernel_id, pair_type) and returns a forecasts frame in the
format `pipelines.evaluation.evaluate` reads: pair_id, task, hardware_id, anchor_kernel_id,
candidate_kernel_id, pair_type, true_speedup, repeat, parse_ok, predicted_bin, p1..p8,
model.

- uniform: 1/8 everywhere (Brier 0.4375); predicted_bin = argmax = bin 1 by convention of
  the first maximum (its accuracy is the share of true bin 1).
- bin prior: per task, the bin frequencies of the TRAINING pairs, Laplace-smoothed
  ((count_b + alpha) / (n + 8 alpha), alpha = 1), so no bin gets probability 0 and a task
  with little data stays near uniform. A task absent from training falls back to the prior
  pooled over all training pairs (also smoothed).
- oracle: one-hot on the true bin (Brier 0, accuracy 1). It is the oracle of the BIN, not
  of the ranking: candidates sharing the top bin tie and are ordered by kernel id, so its
  recovered speedup can stay below the utility oracle's 1.0.

This module is the one implementation of these references. The arithmetic (`uniform_probs`,
`one_hot`, `bin_prior_of`, `prior_probs`) takes numpy arrays and plain lists and needs only numpy
at import, because the references' search path (pipelines.forecasting.references,
`predict_kernels`) runs on bare GPU hosts without polars; the frame functions below and those
adapters call it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from models.bins import NUM_BINS, speedups_to_bins
from warehouse.bin_edges import P_COLS

if TYPE_CHECKING:  # polars loads with the frame functions only (see the module docstring)
    import polars as pl

REFERENCES = ("baseline:uniform", "baseline:bin_prior", "baseline:oracle")
_KEEP = ("pair_id", "task", "hardware_id", "anchor_kernel_id", "candidate_kernel_id", "pair_type")


def uniform_probs(n: int) -> np.ndarray:
    """(n, 8) rows of 1/8.

    >>> uniform_probs(2).sum(axis=1).tolist()
    [1.0, 1.0]
    """
    return np.full((n, NUM_BINS), 1.0 / NUM_BINS)


def one_hot(bins: Sequence[int] | np.ndarray) -> np.ndarray:
    """(n, 8) rows with all mass on bins[i] (1..8).

    Raises:
        ValueError: a bin outside 1..8.

    >>> one_hot([7])[0].tolist()
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    """
    y = np.asarray(bins, dtype=np.int64).reshape(-1)
    if np.any((y < 1) | (y > NUM_BINS)):
        raise ValueError(f"a true bin outside 1..{NUM_BINS}")
    p = np.zeros((y.size, NUM_BINS))
    p[np.arange(y.size), y - 1] = 1.0
    return p


def bin_prior_of(bins: Sequence[int] | np.ndarray, tasks: Sequence[str | None],
                 alpha: float = 1.0) -> dict[str | None, np.ndarray]:
    """Laplace-smoothed bin frequencies per task; key None = pooled over every observation.

    Args:
        bins: the observed bins (1..8).
        tasks: the task of each observation; None counts in the pooled prior only.
        alpha: pseudo-count per bin.
    Returns:
        {task: (8,) probabilities, None: (8,) pooled probabilities}, each
        (count_b + alpha) / (n + 8 alpha).

    >>> pr = bin_prior_of([5, 5], ["t", "t"])
    >>> pr["t"][4], pr[None][0]  # (2 + 1) / (2 + 8), (0 + 1) / 10
    (np.float64(0.3), np.float64(0.1))
    """
    y = np.asarray(bins, dtype=np.int64).reshape(-1)
    of = np.asarray(list(tasks), dtype=object)
    if of.size != y.size:
        raise ValueError(f"bin prior: {y.size} bins but {of.size} tasks")

    def smoothed(sel: np.ndarray) -> np.ndarray:
        counts = np.bincount(y[sel] - 1, minlength=NUM_BINS).astype(np.float64)
        return (counts + alpha) / (counts.sum() + NUM_BINS * alpha)

    out: dict[str | None, np.ndarray] = {None: smoothed(np.ones(y.size, dtype=bool))}
    for t in sorted({t for t in of.tolist() if t is not None}):
        out[t] = smoothed(of == t)
    return out


def prior_probs(prior: Mapping[str | None, np.ndarray], tasks: Sequence[str | None]) -> np.ndarray:
    """(n, 8): row i the prior of tasks[i], the pooled prior (key None) for a task it lacks.

    Raises:
        ValueError: a task the prior lacks and no pooled prior.
    """
    rows = [prior.get(t, prior.get(None)) for t in tasks]
    if any(r is None for r in rows):
        raise ValueError("bin prior has no pooled distribution")
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), NUM_BINS)


def _frame(pairs: pl.DataFrame, p: np.ndarray, model: str) -> pl.DataFrame:
    """Forecasts frame of pairs with probabilities p (n, 8)."""
    import polars as pl

    if "speedup" not in pairs.columns:
        raise ValueError("pairs frame is missing column: speedup")
    base = pairs.select([c for c in _KEEP if c in pairs.columns]).with_columns(
        pairs["speedup"].cast(pl.Float64).alias("true_speedup"),
        pl.lit(0, dtype=pl.Int64).alias("repeat"),
        pl.lit(True).alias("parse_ok"),
        pl.Series("predicted_bin", (np.argmax(p, axis=1) + 1).astype(np.int64)),
        pl.lit(model).alias("model"),
    )
    probs = pl.DataFrame({c: p[:, i] for i, c in enumerate(P_COLS)}, schema={c: pl.Float64 for c in P_COLS})
    return pl.concat([base, probs], how="horizontal")


def uniform_forecasts(pairs: pl.DataFrame) -> pl.DataFrame:
    """1/8 on every bin.

    >>> import polars as pl
    >>> f = uniform_forecasts(pl.DataFrame({"pair_id": ["a"], "task": ["t"], "speedup": [2.0]}))
    >>> f["p3"].to_list(), f["predicted_bin"].to_list()
    ([0.125], [1])
    """
    return _frame(pairs, uniform_probs(pairs.height), "uniform")


def oracle_forecasts(pairs: pl.DataFrame) -> pl.DataFrame:
    """All mass on the true bin.

    >>> import polars as pl
    >>> oracle_forecasts(pl.DataFrame({"pair_id": ["a"], "task": ["t"], "speedup": [3.0]}))["predicted_bin"].to_list()
    [7]
    """
    import polars as pl

    if "speedup" not in pairs.columns:
        raise ValueError("pairs frame is missing column: speedup")
    return _frame(pairs, one_hot(speedups_to_bins(pairs["speedup"].cast(pl.Float64).to_numpy())), "oracle")


def bin_prior(training_pairs: pl.DataFrame, alpha: float = 1.0) -> dict[str | None, np.ndarray]:
    """Laplace-smoothed bin frequencies per task of the training pairs; key None = pooled.

    Args:
        training_pairs: frame with task and speedup (or true_bin).
        alpha: pseudo-count per bin.
    Returns:
        {task: (8,) probabilities, None: (8,) pooled probabilities}.

    >>> import polars as pl
    >>> pr = bin_prior(pl.DataFrame({"task": ["t", "t"], "speedup": [1.2, 1.3]}))
    >>> pr["t"][4], pr["t"][0]  # (2 + 1) / (2 + 8), (0 + 1) / 10
    (np.float64(0.3), np.float64(0.1))
    """
    import polars as pl

    if "true_bin" in training_pairs.columns:
        y = training_pairs["true_bin"].cast(pl.Int64).to_numpy()
    else:
        y = speedups_to_bins(training_pairs["speedup"].cast(pl.Float64).to_numpy())
    return bin_prior_of(y, training_pairs["task"].cast(pl.Utf8).to_list(), alpha)


def bin_prior_forecasts(pairs: pl.DataFrame, training_pairs: pl.DataFrame, alpha: float = 1.0) -> pl.DataFrame:
    """Per-task training bin prior for every pair (pooled prior for unseen tasks).

    Args:
        pairs: the pairs to forecast (e.g. the eval set).
        training_pairs: the training pool; only its task and bins are read.
        alpha: Laplace pseudo-count.
    Returns:
        A forecasts frame, model "bin_prior".
    """
    import polars as pl

    prior = bin_prior(training_pairs, alpha)
    return _frame(pairs, prior_probs(prior, pairs["task"].cast(pl.Utf8).to_list()), "bin_prior")
