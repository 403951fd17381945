"""Put a GPU run's result files under data/measurements/<hardware>/, with the kernels they
measured and every ancestor of those kernels that the committed data does not hold yet, so the
warehouse keeps full parent-child lineage (kernel_candidates' parents_exist check).

The committed data is every hardware's folder beside the destination: a second GPU type that
measured rewrites of kernels already committed for the first (the H100 partition's rewrites of
H200 kernels) brings its measured kernels only, since every partition's ingest reads the kernel
files of all of them.

    python3 -m warehouse.commit --name 2026-11-29-s3 --kernels .gpu-batches/main/kernels.parquet \
        [--kernels MORE_KERNELS.parquet ...] RESULTS.parquet [RESULTS.parquet ...]

Writes results-<name>-<stem>.parquet per result file (zstd; `results-s3a1.parquet` becomes
results-<name>-s3a1.parquet) and one kernels-<name>.parquet. Refuses to overwrite. Before
anything lands in the destination, every measured kernel and every ancestor must be found in
--kernels or in the committed kernel files, and the new files must pass the warehouse's own
ingest (into a throwaway in-memory DuckDB, after the committed files); any problem is one line
and nothing is written.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import polars as pl

from warehouse.db import connect
from warehouse.errors import WarehouseError
from warehouse.ingest import ingest_paths


def committed_kernel_files(dest: Path) -> list[Path]:
    """The kernel files of the destination and of every other hardware folder beside it."""
    return sorted({*dest.glob("kernels-*.parquet"), *dest.parent.glob("*/kernels-*.parquet")})


def committed_kernel_ids(dest: Path) -> set[str]:
    ids: set[str] = set()
    for path in committed_kernel_files(dest):
        ids.update(pl.read_parquet(path, columns=["kernel_id"])["kernel_id"].to_list())
    return ids


def with_ancestors(needed: set[str], pool: pl.DataFrame, have: set[str]) -> pl.DataFrame:
    """Rows of `pool` for `needed` and, transitively, their parents, minus what `have` holds."""
    parent = dict(zip(pool["kernel_id"].to_list(), pool["parent_kernel_id"].to_list(), strict=True))
    take: set[str] = set()
    frontier = set(needed) - have
    while frontier:
        missing = frontier - parent.keys()
        if missing:
            raise SystemExit(f"error: {len(missing)} kernels found in no kernels file, e.g. {sorted(missing)[0]}")
        take |= frontier
        frontier = {parent[k] for k in frontier if parent[k]} - take - have
    return pool.filter(pl.col("kernel_id").is_in(sorted(take)))


def check_ingest(committed_kernels: list[Path], new_files: list[Path]) -> None:
    """Ingest the committed kernel files, then the new files, into an in-memory warehouse:
    the checks `kernelcast ingest` will make, before anything is committed."""
    try:
        with connect(":memory:") as con:
            ingest_paths(con, [*committed_kernels, *new_files])
    except WarehouseError as e:
        raise SystemExit(f"error: {e}".splitlines()[0]) from e


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--name", required=True, help="file name part, e.g. 2026-11-29-s3")
    ap.add_argument("--kernels", action="append", type=Path, required=True,
                    help="kernel files of the batches (with sources and parents); repeatable")
    ap.add_argument("--dest", type=Path, default=Path("data/measurements/h200"))
    args = ap.parse_args(argv)

    try:
        results = {p: pl.read_parquet(p) for p in args.results}
        pool = pl.concat([pl.read_parquet(p) for p in args.kernels], how="diagonal_relaxed").unique("kernel_id", keep="first")
        measured = set().union(*(set(r["kernel_id"].to_list()) for r in results.values()))
    except (OSError, pl.exceptions.PolarsError) as e:
        raise SystemExit(f"error: {type(e).__name__}: {e}".splitlines()[0]) from e
    outputs = {p: args.dest / f"results-{args.name}-{p.stem.removeprefix('results-')}.parquet" for p in results}
    kernels_out = args.dest / f"kernels-{args.name}.parquet"
    taken = [o for o in [*outputs.values(), kernels_out] if o.exists()]
    if taken:
        raise SystemExit(f"error: {taken[0]} exists; choose another --name")
    kernels = with_ancestors(measured, pool, committed_kernel_ids(args.dest))

    args.dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dest.parent, prefix=".commit-") as tmp:
        staged = {out: Path(tmp) / out.name for out in [kernels_out, *outputs.values()]}
        kernels.write_parquet(staged[kernels_out], compression="zstd")
        for path, frame in results.items():
            frame.write_parquet(staged[outputs[path]], compression="zstd")
        check_ingest(committed_kernel_files(args.dest), list(staged.values()))
        for out, path in staged.items():  # same file system: each file lands whole
            os.replace(path, out)
    n_rows = sum(r.height for r in results.values())
    print(f"{n_rows} result rows in {len(results)} files; {kernels.height} kernels "
          f"({kernels.height - len(measured & set(kernels['kernel_id'].to_list()))} unmeasured ancestors) -> {kernels_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
