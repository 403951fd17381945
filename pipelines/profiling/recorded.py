"""Results already measured, served as the measurements of a batch (the `recorded` profiler).

A folder of result files (RESULT_SCHEMA, e.g. the committed data/measurements/<hardware>/ files
or a test's) stands in for the GPU: each kernel of the batch with rows of the hardware there
gets every one of those rows, each under its own batch id and fingerprint, so the ingest
stores them exactly as when they were measured. Kernels without a recorded row stay unmeasured.
pyarrow only, like the worker.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from warehouse.formats import RESULT_SCHEMA


def recorded_results(batch: Path, folder: Path, hardware_id: str, out: Path) -> int:
    """The rows of `folder`'s result files for the batch's kernels on `hardware_id`, written to
    `out` (Parquet, zstd) when there are any; returns how many kernels they cover.

    Raises:
        FileNotFoundError: `folder` is not a folder.
    """
    if not folder.is_dir():
        raise FileNotFoundError(f"no recorded results folder {folder}")
    wanted = pq.read_table(batch, columns=["kernel_id"]).column("kernel_id").unique()
    tables = []
    for path in sorted(folder.rglob("*.parquet")):
        if "hardware_id" not in pq.read_schema(path).names:  # a kernels file
            continue
        table = pq.read_table(path)
        keep = pc.and_(pc.equal(table["hardware_id"], hardware_id), pc.is_in(table["kernel_id"], value_set=wanted))
        tables.append(_conformed(table.filter(keep)))
    rows = pa.concat_tables(tables) if tables else RESULT_SCHEMA.empty_table()
    if rows.num_rows:
        pq.write_table(rows, out, compression="zstd")
    return len(rows.column("kernel_id").unique())


def _conformed(table: pa.Table) -> pa.Table:
    """RESULT_SCHEMA's columns in its order (an older file's missing optional column as nulls)."""
    columns = [table[f.name].cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
               for f in RESULT_SCHEMA]
    return pa.Table.from_arrays(columns, schema=RESULT_SCHEMA)
