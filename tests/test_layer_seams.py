"""Seams where a lower floor takes from its caller what it may not import (tests/test_import_structure.py)."""

import numpy as np
import pytest

from models.bins import BIN_UPPER_EDGES, speedups_to_bins
from models.classical.portable import PortableCostModel
from warehouse import bin_edges


def test_a_portable_cost_model_that_compiles_needs_a_compiler_from_its_caller():
    with pytest.raises(ValueError, match="needs a compiler"):
        PortableCostModel.from_cost_model(object(), compile_workers=2)


def test_models_bins_and_the_workers_benchmarks_share_one_set_of_edges():
    assert BIN_UPPER_EDGES is bin_edges.BIN_UPPER_EDGES
    s = np.array([0.1, 0.25, 0.3, 1.0, 1.2, 2.0, 4.0, 9.0])
    assert (speedups_to_bins(s) == bin_edges.table_bins(bin_edges.checked_speedups(s))).all()
    with pytest.raises(ValueError, match="finite and positive"):
        bin_edges.checked_speedups([1.0, 0.0])
