"""The library split's detail: per forecaster Brier, Spearman and accuracy; the best forecaster
per task and per source."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from benchmarks.library_split import library_report
from warehouse.bin_edges import P_COLS


def _rows(model_ref: str, probs: np.ndarray, bins: list[int], speedups: list[float], tasks: list[str]) -> pl.DataFrame:
    return pl.DataFrame({"model_ref": model_ref, "candidate_kernel_id": [f"k{i}" for i in range(len(bins))],
                         "task": tasks, "true_bin": bins, "speedup": speedups,
                         **{c: probs[:, i] for i, c in enumerate(P_COLS)}})


def test_the_best_forecaster_is_broken_down_by_task_and_source():
    bins, speedups, tasks = [1, 8, 5], [0.2, 6.0, 1.2], ["a", "a", "b"]
    sharp = _rows("models:/m/1", np.eye(8)[[0, 7, 4]], bins, speedups, tasks)
    flat = _rows("baseline:uniform", np.full((3, 8), 1 / 8), bins, speedups, tasks)
    wrong = _rows("models:/m/2", np.eye(8)[[7, 0, 4]], bins, speedups, tasks)
    kernels = pl.DataFrame({"kernel_id": ["k0", "k1", "k2"], "generator": ["library:x/a", "library:x/a", "library:y/b"]})
    report = library_report(pl.concat([sharp, flat, wrong]), kernels)
    assert report["best"] == "models:/m/1"
    assert report["forecasters"]["models:/m/1"] == {"n": 3, "brier": 0.0, "spearman": pytest.approx(1.0), "accuracy": 1.0}
    assert report["forecasters"]["models:/m/2"]["spearman"] < 0 and report["forecasters"]["models:/m/2"]["brier"] == pytest.approx(2 / 3)
    assert np.isnan(report["forecasters"]["baseline:uniform"]["spearman"])  # a constant forecast ranks nothing
    assert report["per_task"] == {"a": 0.0, "b": 0.0} and set(report["per_source"]) == {"library:x/a", "library:y/b"}


def test_a_home_without_rows_or_with_a_corrupt_file_is_one_line(tmp_path, capsys):
    from benchmarks.library_split import ROWS, main

    assert main(["--home", str(tmp_path)]) == 1
    (tmp_path / "reports" / "ds-x").mkdir(parents=True)
    (tmp_path / "reports" / "ds-x" / ROWS).write_bytes(b"junk")
    assert main(["--home", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[1].startswith("cannot read the library split")
