"""Ingest Parquet files from the GPU worker (results) and the generator (kernel batches).

Guarantees, per file: the whole file is validated before anything is written and then written in
one transaction, so a file is either fully in or not at all; a file seen before (same sha256,
any name) adds nothing; rows seen before (same measurement_id / kernel_id, same values) add
nothing. Schemas come from `warehouse.formats`, the one definition both machines share.

A results file is refused (one line naming the file, the row and the rule) when a row breaks a
rule the warehouse's own checks apply later (warehouse/checks.py): a task the `tasks` table does
not know, an ok row that does not cover every case of its task, a NaN, infinite or non-positive
time or speedup, or a speedup that is not the geometric mean of its per-case speedups; and when
a row re-measures a (batch, kernel) already in the warehouse with other values: a conflict is
reported with the first differing value, never dropped in silence. The task rules need the
`tasks` table; with it empty (a warehouse no task suite was written to) they are skipped and the
report says so (`tasks_checked`); `kernelcast ingest` writes the suite first.

`ingest_all` ingests many files one by one: good files go in, refused ones are listed.
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

from warehouse.db import execute, registered, transaction
from warehouse.errors import IngestError, ValidationError, one_line
from warehouse.fingerprint import device_identity
from warehouse.formats import (
    BATCH_SCHEMA,
    FAILURE_KINDS,
    KERNEL_BATCH_SCHEMA,
    RESULT_SCHEMA,
    measurement_id,
)
from warehouse.frames import insert_frame
from warehouse.hardware import register_hardware
from warehouse.kernels import validate_kernels

Kind = Literal["results", "kernels"]
STATUSES = ("ok", "failed")
# Every RESULT_SCHEMA column but the fingerprint (kept once per batch) lands in `measurements`.
_MEASUREMENT_COLUMNS = [f.name for f in RESULT_SCHEMA if f.name != "hardware_json"]
_LIST_COLUMNS = [f.name for f in RESULT_SCHEMA if pa.types.is_list(f.type) and f.name != "case_ids"]
# Columns result files written before the worker recorded them lack; read as null.
_OPTIONAL_RESULT_COLUMNS = ("sandbox", "kernel_host_ms", "ref_host_ms", "program_speedup", "launch_bound",
                            "autotune_json")
_TIME_LISTS = ("kernel_median_ms", "kernel_mean_ms", "ref_median_ms", "ref_mean_ms")  # ms, finite and > 0
_STDERR_LISTS = ("kernel_stderr_ms", "ref_stderr_ms")  # >= 0; inf allowed (a single timed call)
_REPS_LISTS = ("kernel_reps", "ref_reps")  # >= 1
GEOMEAN_RTOL = 1e-6
# Values a re-measurement of the same (batch, kernel) must repeat exactly.
_COMPARED = ("task", "status", "failure_kind", "speedup", "case_ids", "case_speedups", "kernel_median_ms",
             "ref_median_ms", "protocol", "harness_version", "hardware_id", "measured_at")


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
    tasks_checked: bool = True  # False: the `tasks` table was empty, task rules were not applied


@dataclass(frozen=True)
class IngestOutcome:
    """What ingesting many files did: a report per file taken, an error line per file refused."""

    reports: list[IngestReport]
    errors: list[str]

    @property
    def ok(self) -> bool:
        return not self.errors


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
            positive speedup, a failed row with one, misaligned per-case lists, a repeated
            (batch_id, kernel_id), an unknown task, an ok row missing some of its task's cases,
            a NaN/infinite/non-positive per-case time or speedup, a speedup that is not the
            geometric mean of its cases, or a row that conflicts with one ingested before
            (same batch and kernel, other values). Nothing is written.
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

    Each file is atomic and is tried even when another was refused (see `ingest_all`).

    Args:
        con: a writable connection with no open transaction.
        paths: files and/or directories (a directory contributes its `*.parquet`, sorted).
    Returns:
        One IngestReport per file, in the order ingested.
    Raises:
        IngestError: some path does not exist or some file was refused (the first one's line,
            and how many there were); every other file was ingested.
    """
    outcome = ingest_all(con, paths)
    if outcome.errors:
        more = f" ({len(outcome.errors)} files refused; the others were ingested)" if len(outcome.errors) > 1 else ""
        raise IngestError(outcome.errors[0] + more)
    return outcome.reports


def _expand(paths: Iterable[str | Path]) -> tuple[list[Path], list[str]]:
    files, errors = [], []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(sorted(p.glob("*.parquet")))
        elif p.exists():
            files.append(p)
        else:
            errors.append(f"{p}: no such file or directory")
    return files, errors


def ingest_all(con: duckdb.DuckDBPyConnection, paths: Iterable[str | Path]) -> IngestOutcome:
    """Ingest files and directories one file at a time: good files in, refused files listed.

    Kernel files go before result files, so sources exist before their measurements.

    Args:
        con: a writable connection with no open transaction.
        paths: files and/or directories (a directory contributes its `*.parquet`, sorted).
    Returns:
        The IngestOutcome: a report per ingested file, one line per refused file or missing path.
    """
    files, errors = _expand(paths)
    kinds: dict[Path, Kind] = {}
    for f in files:
        try:
            kinds[f] = detect_kind(_read_schema(f), f)
        except IngestError as exc:
            errors.append(str(exc))
    ordered = sorted(kinds, key=lambda f: 0 if kinds[f] == "kernels" else 1)  # stable: keeps name order
    reports = []
    for f in ordered:
        try:
            reports.append(_ingest(con, f, expect=kinds[f]))
        except IngestError as exc:
            errors.append(str(exc))
    return IngestOutcome(reports, errors)


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
    _validate_values(frame, path)

    identity = pl.col("hardware_json").map_elements(device_identity, return_dtype=pl.String)
    per_batch = frame.group_by("batch_id").agg(
        identity.n_unique().alias("n_fp"),
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


def _list_bad(name: str, rule: pl.Expr) -> pl.Expr:
    """Rows whose list column `name` holds a value breaking `rule` (nulls inside count as bad)."""
    col = pl.col(name)
    return col.is_not_null() & col.list.eval(~rule.fill_null(False)).list.any().fill_null(True)


def _validate_values(frame: pl.DataFrame, path: Path) -> None:
    """Per-case times, repetitions and speedups a measurement can have."""
    e = pl.element()
    for name in _TIME_LISTS + ("case_speedups",):
        if row := _first_bad(frame, _list_bad(name, e.is_finite() & (e > 0))):
            raise _fail_row(path, row, f"{name} holds a NaN, infinite or non-positive value: {row[name]}")
    for name in _STDERR_LISTS:
        if row := _first_bad(frame, _list_bad(name, e.is_not_nan() & (e >= 0))):
            raise _fail_row(path, row, f"{name} holds a NaN or negative value: {row[name]}")
    for name in _REPS_LISTS:
        if row := _first_bad(frame, _list_bad(name, e >= 1)):
            raise _fail_row(path, row, f"{name} holds a count below 1: {row[name]}")
    for name in ("case_ids", "case_speedups") + _TIME_LISTS:
        empty = pl.col(name).is_null() | (pl.col(name).list.len() == 0)
        if row := _first_bad(frame, (pl.col("status") == "ok") & empty):
            raise _fail_row(path, row, f"status ok without {name}")
    geo = pl.col("case_speedups").list.eval(e.log()).list.mean().exp()
    off = (pl.col("status") == "ok") & ((geo - pl.col("speedup")).abs() > GEOMEAN_RTOL * pl.col("speedup"))
    if row := _first_bad(frame, off):
        raise _fail_row(path, row, f"speedup {row['speedup']!r} is not the geometric mean of case_speedups")


def _known_tasks(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[int, int]]:
    """task -> (benchmark cases, correctness cases) from the `tasks` table (empty: none written)."""
    rows = execute(con, "SELECT task, json_array_length(benchmark_cases), json_array_length(correctness_cases) "
                        "FROM tasks")
    return {t: (int(b or 0), int(c or 0)) for t, b, c in rows}


def _validate_tasks(frame: pl.DataFrame, tasks: dict[str, tuple[int, int]], path: Path) -> None:
    """Known tasks, and ok rows that cover every case of theirs (benchmark cases on a GPU; the
    correctness cases are what a CPU worker times), as checks.ok_without_every_case asks."""
    known = pl.col("task").is_in(list(tasks))
    if row := _first_bad(frame, ~known):
        raise _fail_row(path, row, f"unknown task {row['task']!r} (not in the warehouse's tasks table)")
    want = pl.col("task").replace_strict({t: b for t, (b, _) in tasks.items()}, return_dtype=pl.Int64)
    want_cpu = pl.col("task").replace_strict({t: c for t, (_, c) in tasks.items()}, return_dtype=pl.Int64)
    expected = pl.when(pl.col("hardware_id") == "cpu").then(want_cpu).otherwise(want)
    short = (pl.col("status") == "ok") & (pl.col("case_ids").list.len() != expected)
    if row := _first_bad(frame.with_columns(expected.alias("_expected")), short):
        raise _fail_row(path, row, f"status ok with {len(row['case_ids'])} cases, but task {row['task']!r} has "
                                   f"{row['_expected']} (no speedup without every case)")


def _conflicts(con: duckdb.DuckDBPyConnection, rows: pl.DataFrame, path: Path) -> None:
    """Refuse rows that re-measure a (batch, kernel) already here with other values."""
    keyed = rows.select(["measurement_id", "batch_id", "kernel_id", *_COMPARED])
    with registered(con, "_incoming_rows", keyed.to_arrow()):
        differs = " OR ".join(f"m.{c} IS DISTINCT FROM i.{c}" for c in _COMPARED)
        found = execute(
            con,
            "SELECT i.batch_id, i.kernel_id, "
            + ", ".join(f"m.{c}::VARCHAR, i.{c}::VARCHAR" for c in _COMPARED)
            + f" FROM _incoming_rows i JOIN measurements m USING (measurement_id) WHERE {differs}",
        )
    if not found:
        return
    batch, kernel, *values = found[0]
    pairs = list(zip(values[0::2], values[1::2], strict=True))
    col, (old, new) = next((c, p) for c, p in zip(_COMPARED, pairs, strict=True) if p[0] != p[1])
    raise IngestError(
        f"{path}: {len(found)} row(s) re-measure a (batch, kernel) already in the warehouse with other values; "
        f"e.g. kernel {str(kernel)[:12]} in batch {batch}: {col} {old} before, {new} now. Nothing written: "
        "give the new measurement its own batch id"
    )


# Readings of the device that change from minute to minute (a resumed run on the same GPU is a
# degree warmer): not part of which device it is.
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
    table = _conform(table, RESULT_SCHEMA, _OPTIONAL_RESULT_COLUMNS, path)
    frame: pl.DataFrame = pl.from_arrow(table)  # type: ignore[assignment]
    _validate_results(con, frame, path)
    tasks = _known_tasks(con)
    if tasks:
        _validate_tasks(frame, tasks, path)

    ids = [
        measurement_id(b, k)
        for b, k in zip(frame["batch_id"].to_list(), frame["kernel_id"].to_list(), strict=True)
    ]
    rows = frame.select(_MEASUREMENT_COLUMNS).with_columns(
        pl.Series("measurement_id", ids, dtype=pl.String),
        pl.lit(str(path.resolve())).alias("source_file"),
    )
    _conflicts(con, rows, path)
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
        tasks_checked=bool(tasks),
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
