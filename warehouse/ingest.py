"""Ingest Parquet files from the GPU worker (results) and the generator (kernel batches).

Guarantees, per file: the whole file is validated before anything is written and then written in
one transaction, so a file is either fully in or not at all; a file seen before (same sha256,
any name) adds nothing; rows seen before (same measurement_id / kernel_id) add nothing.
Schemas come from `pipelines.profiling.formats`, the one definition both machines share.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.profiling.formats import (
    BATCH_SCHEMA,
    FAILURE_KINDS,
    KERNEL_BATCH_SCHEMA,
    RESULT_SCHEMA,
    measurement_id,
)
from warehouse.db import execute, registered, transaction
from warehouse.errors import IngestError, ValidationError, one_line
from warehouse.frames import insert_frame
from warehouse.hardware import register_hardware
from warehouse.kernels import validate_kernels

Kind = Literal["results", "kernels"]
STATUSES = ("ok", "failed")
# Every RESULT_SCHEMA column but the fingerprint (kept once per batch) lands in `measurements`.
_MEASUREMENT_COLUMNS = [f.name for f in RESULT_SCHEMA if f.name != "hardware_json"]
_LIST_COLUMNS = [f.name for f in RESULT_SCHEMA if pa.types.is_list(f.type) and f.name != "case_ids"]


@dataclass(frozen=True)
class IngestReport:
    """What the ingest of one file did."""

    path: str
    kind: str  # "results" | "kernels"
    rows: int  # rows in the file
    added: int  # rows new to the warehouse
    skipped: int  # rows already present (or the whole file, when seen before)
    duplicate_file: bool = False  # the same bytes were ingested before, under any name
    unknown_kernels: int = 0  # distinct result kernels not (yet) in `kernels`


def ingest_results(con: duckdb.DuckDBPyConnection, path: str | Path) -> IngestReport:
    """Ingest one RESULT_SCHEMA Parquet file.

    Args:
        con: a writable connection with no open transaction.
        path: the file.
    Returns:
        The IngestReport.
    Raises:
        IngestError: unreadable file, missing or wrong-typed column, more than one hardware
            fingerprint in a batch, unknown status or failure kind, an ok row without a finite
            positive speedup, a failed row with one, misaligned per-case lists, or a repeated
            (batch_id, kernel_id). Nothing is written.
    """
    return _ingest(con, Path(path), expect="results")


def ingest_kernels(con: duckdb.DuckDBPyConnection, path: str | Path) -> IngestReport:
    """Ingest one kernel batch (BATCH_SCHEMA, or KERNEL_BATCH_SCHEMA with lineage).

    Args:
        con: a writable connection with no open transaction.
        path: the file.
    Returns:
        The IngestReport.
    Raises:
        IngestError: unreadable file, missing or wrong-typed column, null id/task/source,
            a kernel_id that is not the hash of its source, invalid knobs_json. Nothing is written.
    """
    return _ingest(con, Path(path), expect="kernels")


def ingest_file(con: duckdb.DuckDBPyConnection, path: str | Path) -> IngestReport:
    """Ingest one results or kernels file, its kind read from its schema.

    Args:
        con: a writable connection with no open transaction.
        path: the file.
    Returns:
        The IngestReport.
    Raises:
        IngestError: as `ingest_results` / `ingest_kernels`; nothing is written.
    """
    return _ingest(con, Path(path), expect=None)


def ingest_path(con: duckdb.DuckDBPyConnection, path: str | Path) -> list[IngestReport]:
    """Ingest a results or kernels file (kind read from its schema), or a directory of them.

    A directory ingests its `*.parquet` files by name, kernel files before result files so
    sources exist before their measurements (what `kernelcast ingest F...` relies on).

    Args:
        con: a writable connection with no open transaction.
        path: a file or a directory.
    Returns:
        One IngestReport per file, in the order ingested (one item for a file).
    Raises:
        IngestError: the first file refused; files before it stay ingested (each is atomic).
    """
    return ingest_paths(con, [path])


def ingest_paths(con: duckdb.DuckDBPyConnection, paths: Iterable[str | Path]) -> list[IngestReport]:
    """Ingest many files and directories: every kernel file first, then every result file.

    Args:
        con: a writable connection with no open transaction.
        paths: files and/or directories (a directory contributes its `*.parquet`, sorted).
    Returns:
        One IngestReport per file, in the order ingested.
    Raises:
        IngestError: the first file refused (or a path that does not exist).
    """
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(sorted(p.glob("*.parquet")))
        elif p.exists():
            files.append(p)
        else:
            raise IngestError(f"{p}: no such file or directory")
    kinds = {f: detect_kind(_read_schema(f), f) for f in files}
    ordered = sorted(
        files, key=lambda f: 0 if kinds[f] == "kernels" else 1
    )  # stable: keeps name order
    return [_ingest(con, f, expect=kinds[f]) for f in ordered]


def detect_kind(schema: pa.Schema, path: str | Path = "file") -> Kind:
    """'results' for a RESULT_SCHEMA-like file, 'kernels' for a kernel batch.

    Args:
        schema: the file's Arrow schema.
        path: for the error message.
    Returns:
        The kind.
    Raises:
        IngestError: neither.
    """
    names = set(schema.names)
    if {"batch_id", "status"} & names:
        return "results"
    if "source" in names:
        return "kernels"
    raise IngestError(
        f"{path}: neither a results file (batch_id, status, ...) nor a kernel batch (kernel_id, task, source)"
    )


# --------------------------------------------------------------------------- reading & schema


def _read_schema(path: Path) -> pa.Schema:
    try:
        return pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise IngestError(f"{path}: not a readable Parquet file ({one_line(exc)})") from exc


def _read(path: Path) -> tuple[str, pa.Table]:
    """(sha256 of the bytes, the table), both from one read so they describe the same bytes."""
    if not path.is_file():
        raise IngestError(f"{path}: no such file")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as exc:
        raise IngestError(f"{path}: not a readable Parquet file ({one_line(exc)})") from exc
    return digest, table


def _compatible(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Types that cast losslessly in intent: polars writes large_string/large_list, other
    writers may use other integer widths or a non-"UTC" spelling of UTC."""
    if actual.equals(expected):
        return True
    if pa.types.is_string(expected):
        return (
            pa.types.is_string(actual)
            or pa.types.is_large_string(actual)
            or pa.types.is_string_view(actual)
        )
    if pa.types.is_list(expected):
        return (pa.types.is_list(actual) or pa.types.is_large_list(actual)) and _compatible(
            actual.value_type, expected.value_type
        )
    if pa.types.is_timestamp(expected):
        return pa.types.is_timestamp(actual) and actual.tz is not None
    if pa.types.is_integer(expected):
        return pa.types.is_integer(actual)
    if pa.types.is_floating(expected):
        return pa.types.is_floating(actual)
    return False


def _conform(table: pa.Table, schema: pa.Schema, optional: Iterable[str], path: Path) -> pa.Table:
    """The table with exactly `schema`'s columns and types; absent optional columns are null."""
    optional = set(optional)
    columns = []
    for f in schema:
        if f.name not in table.column_names:
            if f.name in optional:
                columns.append(pa.nulls(table.num_rows, f.type))
                continue
            raise IngestError(f"{path}: missing column {f.name!r} ({f.type})")
        col = table.column(f.name)
        if not _compatible(col.type, f.type):
            raise IngestError(f"{path}: column {f.name!r} is {col.type}, expected {f.type}")
        if not f.nullable and col.null_count:
            raise IngestError(f"{path}: column {f.name!r} has {col.null_count} null value(s)")
        try:
            columns.append(col.cast(f.type))
        except pa.ArrowException as exc:
            raise IngestError(
                f"{path}: column {f.name!r} does not fit {f.type} ({one_line(exc)})"
            ) from exc
    return pa.Table.from_arrays(columns, schema=schema)


# --------------------------------------------------------------------------- validation


def _first_bad(frame: pl.DataFrame, mask: pl.Expr) -> dict | None:
    bad = frame.with_row_index("_row").filter(mask)
    return bad.row(0, named=True) if bad.height else None


def _fail_row(path: Path, row: dict, problem: str) -> IngestError:
    return IngestError(
        f"{path}: row {row['_row']} (kernel {str(row['kernel_id'])[:12]}): {problem}"
    )


def _validate_results(con: duckdb.DuckDBPyConnection, frame: pl.DataFrame, path: Path) -> None:
    """Every rule of a result file; raises IngestError on the first broken one."""
    status, kind, speedup = pl.col("status"), pl.col("failure_kind"), pl.col("speedup")
    if row := _first_bad(frame, ~status.is_in(STATUSES)):
        raise _fail_row(path, row, f"status {row['status']!r} is not one of {list(STATUSES)}")
    if row := _first_bad(frame, kind.is_not_null() & ~kind.is_in(FAILURE_KINDS)):
        raise _fail_row(path, row, f"unknown failure kind {row['failure_kind']!r}")
    if row := _first_bad(frame, (status == "failed") & kind.is_null()):
        raise _fail_row(path, row, "status failed without a failure_kind")
    if row := _first_bad(frame, (status == "ok") & kind.is_not_null()):
        raise _fail_row(path, row, f"status ok with failure_kind {row['failure_kind']!r}")
    if row := _first_bad(frame, (status == "ok") & speedup.is_null()):
        raise _fail_row(path, row, "status ok with null speedup")
    if row := _first_bad(frame, (status == "ok") & (~speedup.is_finite() | (speedup <= 0))):
        raise _fail_row(path, row, f"speedup {row['speedup']!r} must be finite and > 0")
    if row := _first_bad(frame, (status == "failed") & speedup.is_not_null()):
        raise _fail_row(path, row, "failed row carries a speedup (no speedup without correctness)")
    n_cases = pl.col("case_ids").list.len()
    for name in _LIST_COLUMNS:
        col = pl.col(name)
        misaligned = col.is_not_null() & (n_cases.is_null() | (col.list.len() != n_cases))
        if row := _first_bad(frame, misaligned):
            raise _fail_row(path, row, f"{name} is not aligned with case_ids")
    if row := _first_bad(frame, pl.struct("batch_id", "kernel_id").is_duplicated()):
        raise _fail_row(path, row, f"appears twice in batch {row['batch_id']}")

    per_batch = frame.group_by("batch_id").agg(
        pl.col("hardware_json").n_unique().alias("n_fp"),
        pl.col("hardware_id").n_unique().alias("n_hw"),
        pl.col("hardware_json").first(),
        pl.col("hardware_id").first(),
    )
    for b in per_batch.iter_rows(named=True):
        if b["n_fp"] > 1 or b["n_hw"] > 1:
            raise IngestError(
                f"{path}: batch {b['batch_id']} mixes hardware fingerprints; one batch is one device"
            )
        fingerprint = _fingerprint(b["hardware_json"], path)
        if fingerprint.get("hardware_id") not in (None, b["hardware_id"]):
            raise IngestError(
                f"{path}: batch {b['batch_id']} says hardware_id {b['hardware_id']!r} but its "
                f"fingerprint says {fingerprint['hardware_id']!r}"
            )
        known = execute(
            con,
            "SELECT hardware_id, hardware_json FROM batches WHERE batch_id = ?",
            [b["batch_id"]],
        )
        if known and (known[0][0] != b["hardware_id"] or json.loads(known[0][1]) != fingerprint):
            raise IngestError(
                f"{path}: batch {b['batch_id']} was ingested before with another hardware fingerprint"
            )


def _fingerprint(text: str, path: Path) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise IngestError(f"{path}: hardware_json is not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise IngestError(f"{path}: hardware_json must be a JSON object")
    return value


# --------------------------------------------------------------------------- writing


def _seen(con: duckdb.DuckDBPyConnection, digest: str) -> tuple[str, int] | None:
    rows = execute(con, "SELECT kind, rows FROM ingested_files WHERE file_sha256 = ?", [digest])
    return (rows[0][0], int(rows[0][1])) if rows else None


def _record_file(
    con: duckdb.DuckDBPyConnection, digest: str, path: Path, kind: Kind, rows: int, added: int
) -> None:
    execute(
        con,
        "INSERT INTO ingested_files (file_sha256, path, kind, rows, added) VALUES (?, ?, ?, ?, ?)",
        [digest, str(path.resolve()), kind, rows, added],
    )


def _ingest(con: duckdb.DuckDBPyConnection, path: Path, expect: Kind | None) -> IngestReport:
    digest, table = _read(path)
    kind = detect_kind(table.schema, path)
    if expect is not None and kind != expect:
        raise IngestError(f"{path}: looks like a {kind} file, expected {expect}")
    seen = _seen(con, digest)
    if seen is not None:
        return IngestReport(str(path), seen[0], seen[1], 0, seen[1], duplicate_file=True)
    if kind == "results":
        return _ingest_results(con, path, digest, table)
    return _ingest_kernels(con, path, digest, table)


def _ingest_results(
    con: duckdb.DuckDBPyConnection, path: Path, digest: str, table: pa.Table
) -> IngestReport:
    table = _conform(table, RESULT_SCHEMA, (), path)
    frame: pl.DataFrame = pl.from_arrow(table)  # type: ignore[assignment]
    _validate_results(con, frame, path)

    ids = [
        measurement_id(b, k)
        for b, k in zip(frame["batch_id"].to_list(), frame["kernel_id"].to_list(), strict=True)
    ]
    rows = frame.select(_MEASUREMENT_COLUMNS).with_columns(
        pl.Series("measurement_id", ids, dtype=pl.String),
        pl.lit(str(path.resolve())).alias("source_file"),
    )
    batches = (
        frame.group_by("batch_id", maintain_order=True)
        .agg(
            pl.col("hardware_id").first(),
            pl.col("hardware_json").first(),
            pl.col("protocol").first(),
            pl.col("harness_version").first(),
        )
        .with_columns(pl.lit(str(path.resolve())).alias("source_file"))
    )
    try:
        with transaction(con):
            for b in batches.iter_rows(named=True):
                register_hardware(con, b["hardware_id"], json.loads(b["hardware_json"]))
            insert_frame(con, "batches", batches, ["batch_id"], "nothing")
            added = insert_frame(con, "measurements", rows, ["measurement_id"], "nothing")
            with registered(
                con, "_ids", pa.table({"kernel_id": frame["kernel_id"].unique().to_arrow()})
            ):
                unknown = execute(
                    con,
                    "SELECT count(*) FROM _ids WHERE kernel_id NOT IN (SELECT kernel_id FROM kernels)",
                )[0][0]
            _record_file(con, digest, path, "results", frame.height, added)
    except duckdb.Error as exc:
        raise IngestError(f"{path}: refused by the warehouse ({one_line(exc)})") from exc
    return IngestReport(
        str(path),
        "results",
        frame.height,
        added,
        frame.height - added,
        unknown_kernels=int(unknown),
    )


def _ingest_kernels(
    con: duckdb.DuckDBPyConnection, path: Path, digest: str, table: pa.Table
) -> IngestReport:
    optional = [f.name for f in KERNEL_BATCH_SCHEMA if f.name not in BATCH_SCHEMA.names]
    table = _conform(table, KERNEL_BATCH_SCHEMA, optional, path)
    try:
        rows = validate_kernels(pl.from_arrow(table), what=str(path))  # type: ignore[arg-type]
    except ValidationError as exc:
        raise IngestError(str(exc)) from exc
    try:
        with transaction(con):
            added = insert_frame(con, "kernels", rows, ["kernel_id"], "nothing")
            _record_file(con, digest, path, "kernels", table.num_rows, added)
    except duckdb.Error as exc:
        raise IngestError(f"{path}: refused by the warehouse ({one_line(exc)})") from exc
    return IngestReport(str(path), "kernels", table.num_rows, added, table.num_rows - added)
