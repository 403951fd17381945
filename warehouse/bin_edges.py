"""The edges of the eight speedup bins, on the bottom floor: `models.bins` (the bin scheme every
forecaster, curation step and report uses) and the benchmarks a GPU host runs
(benchmarks/profiling.py, numpy only) both read them from here, so there is one
definition and the worker needs no model code. Import bins from `models.bins` elsewhere; the
probability columns (`P_COLS`) from here, on every floor."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

NUM_BINS = 8
# The columns of a forecast's bin probabilities, p1..p8, in every frame, file and table that holds
# one: the one definition, imported by every floor from here.
P_COLS: tuple[str, ...] = tuple(f"p{b}" for b in range(1, NUM_BINS + 1))

# Upper edges of bins 1..7 (bin 8 is open above). Right-closed: S == edge falls in the lower bin.
BIN_UPPER_EDGES: tuple[float, ...] = (0.25, 0.5, 2**-0.5, 1.0, 2**0.5, 2.0, 4.0)


def checked_speedups(s: Sequence[float] | np.ndarray) -> np.ndarray:
    """The speedups as a float64 array; raises ValueError on any value that is not finite and > 0."""
    arr = np.asarray(s, dtype=np.float64)
    if arr.size and (not np.all(np.isfinite(arr)) or np.any(arr <= 0)):
        bad = arr[~np.isfinite(arr) | (arr <= 0)][0]
        raise ValueError(f"speedup must be finite and positive, got {bad}")
    return arr


def table_bins(arr: np.ndarray) -> np.ndarray:
    """Bins 1..8 of checked speedups under the right-closed table.

    >>> table_bins(np.array([0.25, 1.0, 1.0000001, 4.0, 4.01])).tolist()
    [1, 4, 5, 7, 8]
    """
    # searchsorted(side="left") gives the count of edges strictly below s: right-closed bins.
    return np.searchsorted(np.asarray(BIN_UPPER_EDGES), arr, side="left").astype(np.int64) + 1
