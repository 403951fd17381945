"""scripts/commit_measurements.py: a session's results go under data/ with the kernels they
measured plus every ancestor the committed data lacks, or nothing is written."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import commit_measurements  # noqa: E402  (scripts/ is not a package)


def _kernels(ids_parents: dict[str, str | None]) -> pl.DataFrame:
    return pl.DataFrame({"kernel_id": list(ids_parents), "parent_kernel_id": list(ids_parents.values()),
                         "source": [f"# {k}" for k in ids_parents]}, schema_overrides={"parent_kernel_id": pl.String})


def _results(path: Path, ids: list[str]) -> Path:
    pl.DataFrame({"kernel_id": ids, "status": ["ok"] * len(ids), "speedup": [1.5] * len(ids)}).write_parquet(path)
    return path


@pytest.fixture
def layout(tmp_path):
    dest = tmp_path / "data"
    dest.mkdir()
    _kernels({"a": None}).write_parquet(dest / "kernels-old.parquet")  # already committed
    pool = tmp_path / "pool.parquet"
    _kernels({"a": None, "b": "a", "c": "b", "d": None, "e": "zz"}).write_parquet(pool)
    return dest, pool, tmp_path


def test_measured_kernels_come_with_their_uncommitted_ancestors(layout):
    dest, pool, tmp = layout
    run = _results(tmp / "results-r1.parquet", ["c", "d"])
    assert commit_measurements.main([str(run), "--name", "s9", "--kernels", str(pool), "--dest", str(dest)]) == 0
    kernels = pl.read_parquet(dest / "kernels-s9.parquet")
    assert sorted(kernels["kernel_id"]) == ["b", "c", "d"]  # b: c's parent; a: already committed
    assert pl.read_parquet(dest / "results-s9-r1.parquet")["kernel_id"].to_list() == ["c", "d"]
    with pytest.raises(SystemExit, match="exists"):  # never overwrites committed data
        commit_measurements.main([str(run), "--name", "s9", "--kernels", str(pool), "--dest", str(dest)])


def test_a_kernel_or_ancestor_found_nowhere_writes_nothing(layout):
    dest, pool, tmp = layout
    before = sorted(p.name for p in dest.iterdir())
    for ids in (["x"], ["e"]):  # x: unknown kernel; e: its parent zz is unknown
        run = _results(tmp / "results-r2.parquet", ids)
        with pytest.raises(SystemExit, match="found in no kernels file"):
            commit_measurements.main([str(run), "--name", "s10", "--kernels", str(pool), "--dest", str(dest)])
        assert sorted(p.name for p in dest.iterdir()) == before
