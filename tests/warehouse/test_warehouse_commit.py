"""warehouse.commit: a GPU run's results go under data/ with the kernels they
measured plus every ancestor the committed data lacks, after the warehouse's own ingest has
accepted them, or nothing is written."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from warehouse import commit

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "data" / "measurements" / "h200"


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.rglob("*") if p.is_file())


@pytest.fixture
def committed_run(tmp_path):
    """A destination holding the first committed kernel file, and 30 measured kernels of run2
    (their kernels, with lineage, in the run1 kernel file) as a new run's results."""
    dest = tmp_path / "data" / "h200"
    dest.mkdir(parents=True)
    shutil.copy(H200 / "kernels-2026-11-29-harness1.parquet", dest)
    results = pl.read_parquet(H200 / "results-2026-11-29-harness2-run-2.parquet")
    pool = pl.read_parquet(H200 / "kernels-2026-11-29-harness2.parquet")
    lineage = set(pool.filter(pl.col("parent_kernel_id").is_not_null())["kernel_id"].to_list())
    picked = results.filter(pl.col("kernel_id").is_in(sorted(lineage))).head(30)
    run = tmp_path / "results-x1.parquet"
    picked.write_parquet(run)
    return dest, run, H200 / "kernels-2026-11-29-harness2.parquet", picked


def test_results_land_with_every_ancestor_the_committed_data_lacks(committed_run):
    dest, run, pool_path, picked = committed_run
    argv = [str(run), "--name", "s9", "--kernels", str(pool_path), "--dest", str(dest)]
    assert commit.main(argv) == 0
    kernels = pl.read_parquet(dest / "kernels-s9.parquet")
    committed = set(pl.read_parquet(dest / "kernels-2026-11-29-harness1.parquet")["kernel_id"])
    ids = set(kernels["kernel_id"])
    assert set(picked["kernel_id"]) <= ids and not ids & committed
    parents = {p for p in kernels["parent_kernel_id"].to_list() if p}
    assert parents <= ids | committed  # lineage closed: no orphan parent
    assert pl.read_parquet(dest / "results-s9-x1.parquet").height == picked.height
    assert not list(dest.parent.glob(".commit-*"))
    with pytest.raises(SystemExit, match="exists"):  # never overwrites committed data
        commit.main(argv)


def test_a_file_the_warehouse_would_refuse_writes_nothing(committed_run, tmp_path):
    dest, run, pool_path, picked = committed_run
    before = _listing(dest)
    bad = tmp_path / "results-bad.parquet"
    picked.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(-1.0).otherwise(pl.col("speedup"))
                        .alias("speedup")).write_parquet(bad)
    with pytest.raises(SystemExit, match="^error: .*speedup"):
        commit.main([str(bad), "--name", "s10", "--kernels", str(pool_path), "--dest", str(dest)])
    with pytest.raises(SystemExit, match="^error: "):  # a missing file: one line
        commit.main([str(tmp_path / "nope.parquet"), "--name", "s10", "--kernels", str(pool_path),
                                  "--dest", str(dest)])
    assert _listing(dest) == before


def test_ancestors_are_followed_transitively_and_a_missing_one_is_an_error():
    pool = pl.DataFrame({"kernel_id": ["a", "b", "c", "d", "e"], "parent_kernel_id": [None, "a", "b", None, "zz"]},
                        schema_overrides={"parent_kernel_id": pl.String})
    took = commit.with_ancestors({"c", "d"}, pool, have={"a"})
    assert sorted(took["kernel_id"]) == ["b", "c", "d"]  # b: c's parent; a: already committed
    for needed in ({"x"}, {"e"}):  # x: unknown kernel; e: its parent zz is unknown
        with pytest.raises(SystemExit, match="found in no kernels file"):
            commit.with_ancestors(needed, pool, have=set())


def test_every_committed_parquet_file_is_zstd():
    """GPU measurements and bench files under data/ are committed as zstd Parquet."""
    import pyarrow.parquet as pq

    files = sorted((REPO / "data").rglob("*.parquet"))
    assert len(files) > 50
    other = []
    for path in files:
        meta = pq.ParquetFile(path).metadata
        codecs = {meta.row_group(i).column(j).compression for i in range(meta.num_row_groups) for j in range(meta.num_columns)}
        if codecs - {"ZSTD"}:
            other.append(f"{path.relative_to(REPO)}: {sorted(codecs)}")
    assert not other, other
