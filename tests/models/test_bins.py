import math

import numpy as np
import pytest

from models.bins import (
    BIN_LOG2_VALUES,
    BIN_UPPER_EDGES,
    expected_log2_speedup,
    speedup_to_bin,
    speedups_to_bins,
)

EDGES = [(0.25, 1), (0.5, 2), (2**-0.5, 3), (1.0, 4), (2**0.5, 5), (2.0, 6), (4.0, 7)]


@pytest.mark.parametrize("edge,lower_bin", EDGES)
def test_edges_are_right_closed(edge, lower_bin):
    assert speedup_to_bin(edge) == lower_bin
    assert speedup_to_bin(math.nextafter(edge, 0)) == lower_bin
    assert speedup_to_bin(math.nextafter(edge, math.inf)) == lower_bin + 1
    assert speedups_to_bins([math.nextafter(edge, 0), edge, math.nextafter(edge, math.inf)]).tolist() == [
        lower_bin,
        lower_bin,
        lower_bin + 1,
    ]


@pytest.mark.parametrize("s,b", [(1e-9, 1), (0.1, 1), (0.3, 2), (0.6, 3), (0.9, 4), (1.2, 5), (1.7, 6), (3.0, 7), (1e9, 8)])
def test_interior_values(s, b):
    assert speedup_to_bin(s) == b
    assert speedups_to_bins([s])[0] == b


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), -float("inf")])
def test_invalid_speedups_raise(bad):
    with pytest.raises(ValueError):
        speedup_to_bin(bad)
    with pytest.raises(ValueError):
        speedups_to_bins([1.0, bad])


def test_paper_formula_is_half_octave_shifted():
    # floor(2*log2 S)+4: S=1 -> 4 in both; S=1.2 -> floor(0.526)+4 = 4 vs table 5.
    assert speedup_to_bin(1.0, "paper-formula") == 4
    assert speedup_to_bin(1.2, "paper-formula") == 4
    assert speedup_to_bin(1.5, "paper-formula") == 5
    assert speedup_to_bin(0.01, "paper-formula") == 1
    assert speedup_to_bin(100.0, "paper-formula") == 8
    assert speedups_to_bins([1.2, 1.5], "paper-formula").tolist() == [4, 5]
    with pytest.raises(ValueError):
        speedup_to_bin(1.0, "nope")


def test_representative_values_lie_inside_their_bins():
    for b, r in enumerate(BIN_LOG2_VALUES, start=1):
        assert speedup_to_bin(2**r) == b
    assert len(BIN_UPPER_EDGES) == 7


def test_expected_log2_speedup():
    assert expected_log2_speedup(np.eye(8)[0]) == -2.5
    assert expected_log2_speedup(np.full(8, 1 / 8)) == pytest.approx(0.0)
    assert expected_log2_speedup(np.eye(8)).tolist() == list(BIN_LOG2_VALUES)
