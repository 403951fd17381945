"""The eight speedup bins of the forecasting method (their edges: warehouse/bin_edges.py).

S is the speedup of a candidate over an anchor (S > 1: the candidate is faster).
Bins are right-closed, as the table the surrogate is shown:

    bin  name                  S
    1    severe slowdown       S <= 0.25
    2    significant slowdown  0.25 < S <= 0.5
    3    moderate slowdown     0.5 < S <= 2^-0.5
    4    minor slowdown        2^-0.5 < S <= 1
    5    minor speedup         1 < S <= 2^0.5
    6    significant speedup   2^0.5 < S <= 2
    7    high speedup          2 < S <= 4
    8    extreme speedup       S > 4

The paper's public code labels data with clamp(floor(2*log2 S) + 4, 1, 8), which sits half
an octave off its own table; it is offered as the named scheme "paper-formula" only to
re-label imported paper data.

>>> speedup_to_bin(1.0), speedup_to_bin(1.0000001), speedup_to_bin(4.0), speedup_to_bin(4.01)
(4, 5, 7, 8)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from warehouse.bin_edges import BIN_UPPER_EDGES, NUM_BINS, checked_speedups, table_bins

Scheme = Literal["table", "paper-formula"]

BIN_NAMES: tuple[str, ...] = (
    "severe slowdown",
    "significant slowdown",
    "moderate slowdown",
    "minor slowdown",
    "minor speedup",
    "significant speedup",
    "high speedup",
    "extreme speedup",
)

# Representative log2-speedup of each bin, for expected values and ranking.
BIN_LOG2_VALUES: tuple[float, ...] = (-2.5, -1.5, -0.75, -0.25, 0.25, 0.75, 1.5, 2.5)

# Human-readable ranges, as shown to the model.
BIN_RANGES: tuple[str, ...] = (
    "S <= 0.25",
    "0.25 < S <= 0.5",
    "0.5 < S <= 0.7071",
    "0.7071 < S <= 1",
    "1 < S <= 1.4142",
    "1.4142 < S <= 2",
    "2 < S <= 4",
    "S > 4",
)


def _validate(s: float) -> float:
    s = float(s)
    if math.isnan(s) or math.isinf(s):
        raise ValueError(f"speedup must be finite, got {s}")
    if s <= 0:
        raise ValueError(f"speedup must be positive, got {s}")
    return s


def speedup_to_bin(s: float, scheme: Scheme = "table") -> int:
    """Bin (1..8) of one speedup S.

    Args:
        s: speedup, finite and > 0.
        scheme: "table" (default, the pinned right-closed table) or "paper-formula".
    Returns:
        The bin number, 1..8.
    Raises:
        ValueError: S <= 0, NaN or infinite, or an unknown scheme.
    """
    s = _validate(s)
    if scheme == "table":
        for i, edge in enumerate(BIN_UPPER_EDGES):
            if s <= edge:
                return i + 1
        return NUM_BINS
    if scheme == "paper-formula":
        return int(min(max(math.floor(2 * math.log2(s)) + 4, 1), NUM_BINS))
    raise ValueError(f"unknown bin scheme {scheme!r}; use 'table' or 'paper-formula'")


def speedups_to_bins(s: Sequence[float] | np.ndarray, scheme: Scheme = "table") -> np.ndarray:
    """Vectorised `speedup_to_bin`; raises on any invalid value."""
    arr = checked_speedups(s)
    if scheme == "table":
        return table_bins(arr)
    if scheme == "paper-formula":
        return np.clip(np.floor(2 * np.log2(arr)) + 4, 1, NUM_BINS).astype(np.int64)
    raise ValueError(f"unknown bin scheme {scheme!r}; use 'table' or 'paper-formula'")


def expected_log2_speedup(p: Sequence[float] | np.ndarray) -> np.ndarray | float:
    """Expected log2-speedup sum_b p_b * r_b of distribution(s) p, shape (8,) or (n, 8)."""
    arr = np.asarray(p, dtype=np.float64)
    return arr @ np.asarray(BIN_LOG2_VALUES)
