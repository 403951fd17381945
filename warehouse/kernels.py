"""Tasks, kernels and their pre-GPU facts (compile features, CPU checks).

Kernels are content-addressed and immutable: adding one twice adds nothing. Features and checks
are upserts, since a re-run of the compiler or checker replaces the old answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from warehouse.db import query_frame, transaction, where_clause
from warehouse.errors import ValidationError
from warehouse.frames import (
    Frame,
    check_in,
    conform,
    dedupe_last,
    insert_frame,
    json_text,
    to_polars,
)
from warehouse.ids import kernel_id as compute_kernel_id

KERNEL_COLUMNS = (
    "kernel_id",
    "task",
    "source",
    "language",
    "generator",
    "generator_version",
    "algorithm",
    "knobs_json",
    "parent_kernel_id",
    "mutation",
)
FEATURE_COLUMNS = (
    "kernel_id", "target", "status", "n_regs", "n_spills", "shared_bytes", "n_kernels", "n_launches", "error",
)
FEATURE_STATUSES = ("compiled", "compile_failed", "rejected")
SOURCE_FEATURE_COLUMNS = ("kernel_id", "target", "status", "compile_status", "features", "error", "seconds")
SOURCE_FEATURE_STATUSES = ("ok", "partial", "failed")
# Columns of a source-features file that are not features (pipelines.forecasting.source_features)
_SOURCE_ROW_FIELDS = ("kernel_id", "task", "target", "status", "compile_status", "error", "seconds")
CHECK_COLUMNS = ("kernel_id", "check_kind", "ok", "failure_kind", "message", "seconds")

_TASK_SCHEMA = {
    "task": pl.String,
    "description": pl.String,
    "contract_version": pl.Int32,
    "source": pl.String,
    "correctness_cases": pl.String,
    "benchmark_cases": pl.String,
    "tolerances": pl.String,
}


def upsert_tasks(con: duckdb.DuckDBPyConnection, rows: Iterable[Mapping[str, Any]]) -> int:
    """Insert or replace task rows.

    Args:
        con: a writable connection.
        rows: dicts with `task` and `description`; optional `contract_version` (default 1),
            `source`, and `correctness_cases` / `benchmark_cases` / `tolerances` as JSON text
            or JSON-serialisable objects (e.g. a tuple of case dicts).
    Returns:
        Rows inserted or updated.
    Raises:
        ValidationError: a row lacks task/description or holds something not JSON-serialisable.
    """
    records = []
    for row in rows:
        name = row.get("task")
        if not name or not row.get("description"):
            raise ValidationError(
                f"tasks: every row needs 'task' and 'description' (got task={name!r})"
            )
        records.append(
            {
                "task": str(name),
                "description": str(row["description"]),
                "contract_version": int(row.get("contract_version") or 1),
                "source": row.get("source"),
                "correctness_cases": json_text(
                    row.get("correctness_cases"), f"tasks[{name}].correctness_cases"
                ),
                "benchmark_cases": json_text(
                    row.get("benchmark_cases"), f"tasks[{name}].benchmark_cases"
                ),
                "tolerances": json_text(row.get("tolerances"), f"tasks[{name}].tolerances"),
            }
        )
    frame = dedupe_last(pl.DataFrame(records, schema=_TASK_SCHEMA), ["task"])
    with transaction(con):
        return insert_frame(con, "tasks", frame, ["task"], "update", touch="updated_at")


def read_tasks(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Every task, ordered by name; JSON columns come back as text."""
    return query_frame(con, "SELECT * FROM tasks ORDER BY task")


def validate_kernels(frame: pl.DataFrame, what: str = "kernels") -> pl.DataFrame:
    """Check kernel rows and return them conformed to the table's columns.

    Args:
        frame: rows with at least kernel_id, task, source.
        what: where the rows come from, for error messages.
    Returns:
        The rows with every kernel column, one per kernel_id.
    Raises:
        ValidationError: a required column is missing/null, a kernel_id is not the hash of its
            normalised source, or knobs_json is not JSON.
    """
    frame = conform(frame, KERNEL_COLUMNS, ("kernel_id", "task", "source"), what)
    for kid, source in zip(
        frame.get_column("kernel_id").to_list(), frame.get_column("source").to_list(), strict=True
    ):
        expected = compute_kernel_id(source)
        if kid != expected:
            raise ValidationError(
                f"{what}: kernel_id {kid[:16]}... does not match its source (sha256 of normalised source is {expected[:16]}...)"
            )
    for knobs in frame.get_column("knobs_json").drop_nulls().to_list():
        json_text(knobs, f"{what}.knobs_json")
    return frame.unique(subset=["kernel_id"], keep="first", maintain_order=True)


def add_kernels(
    con: duckdb.DuckDBPyConnection, frame: Frame, *, in_transaction: bool = False
) -> int:
    """Add kernels; ones already present (same kernel_id) are left as they are.

    Args:
        con: a writable connection.
        frame: polars or Arrow rows with kernel_id, task, source and optional lineage columns
            (language, generator, generator_version, algorithm, knobs_json, parent_kernel_id,
            mutation).
        in_transaction: the caller already opened a transaction on `con`.
    Returns:
        Kernels newly added.
    Raises:
        ValidationError: see `validate_kernels`; nothing is written.
    """
    rows = validate_kernels(to_polars(frame, "kernels"))
    if in_transaction:
        return insert_frame(con, "kernels", rows, ["kernel_id"], "nothing")
    with transaction(con):
        return insert_frame(con, "kernels", rows, ["kernel_id"], "nothing")


def read_kernels(
    con: duckdb.DuckDBPyConnection,
    task: str | None = None,
    kernel_ids: Sequence[str] | None = None,
    with_source: bool = True,
) -> pl.DataFrame:
    """Kernels, optionally of one task or a list of ids.

    Args:
        con: an open connection.
        task: only this task.
        kernel_ids: only these ids.
        with_source: include the `source` column (large).
    Returns:
        One row per kernel, ordered by task, kernel_id.
    """
    cols = "*" if with_source else "* EXCLUDE (source)"
    where, params = where_clause({"task = ?": task,
                                  "list_contains(?, kernel_id)": None if kernel_ids is None else list(kernel_ids)})
    return query_frame(con, f"SELECT {cols} FROM kernels{where} ORDER BY task, kernel_id", params)


def add_kernel_features(con: duckdb.DuckDBPyConnection, frame: Frame) -> int:
    """Insert or replace compile features per (kernel_id, target).

    Args:
        con: a writable connection.
        frame: kernel_id, target, status ('compiled' | 'compile_failed' | 'rejected'), and
            optional n_regs, n_spills, shared_bytes, n_kernels, n_launches, error.
    Returns:
        Rows inserted or updated.
    Raises:
        ValidationError: missing columns or an unknown status; nothing is written.
    """
    rows = conform(
        to_polars(frame, "kernel_features"),
        FEATURE_COLUMNS,
        ("kernel_id", "target", "status"),
        "kernel_features",
    )
    check_in(rows, "status", FEATURE_STATUSES, "kernel_features")
    rows = dedupe_last(rows, ["kernel_id", "target"])
    with transaction(con):
        return insert_frame(
            con, "kernel_features", rows, ["kernel_id", "target"], "update", touch="updated_at"
        )


def add_kernel_checks(con: duckdb.DuckDBPyConnection, frame: Frame) -> int:
    """Insert or replace check results per (kernel_id, check_kind).

    Args:
        con: a writable connection.
        frame: kernel_id, check_kind, ok, and optional failure_kind, message, seconds.
    Returns:
        Rows inserted or updated.
    Raises:
        ValidationError: missing columns; nothing is written.
    """
    rows = conform(
        to_polars(frame, "kernel_checks"),
        CHECK_COLUMNS,
        ("kernel_id", "check_kind", "ok"),
        "kernel_checks",
    )
    rows = dedupe_last(rows, ["kernel_id", "check_kind"])
    with transaction(con):
        return insert_frame(
            con, "kernel_checks", rows, ["kernel_id", "check_kind"], "update", touch="checked_at"
        )


def read_kernel_features(
    con: duckdb.DuckDBPyConnection, target: str = "sm_90", kernel_ids: Iterable[str] | None = None
) -> pl.DataFrame:
    """Compile features of one target (kernel_id, status, n_regs, n_spills, shared_bytes,
    n_kernels, n_launches), optionally for some kernels only."""
    sql = ("SELECT kernel_id, status, n_regs, n_spills, shared_bytes, n_kernels, n_launches "
           "FROM kernel_features WHERE target = ?")
    params: list[Any] = [target]
    if kernel_ids is not None:
        sql += " AND list_contains(?, kernel_id)"
        params.append(list(kernel_ids))
    return query_frame(con, sql + " ORDER BY kernel_id", params)


def ingest_compile_features(con: duckdb.DuckDBPyConnection, path: str | Path) -> int:
    """Upsert a compile-features file (data/features/<target>/*.parquet) for known kernels.

    The file holds one row per kernel and target as `add_kernel_features` takes them;
    'skipped' and 'error' rows (nothing compiled, or our side failed) and rows of kernels the
    warehouse does not know are left out. Re-ingesting the same file changes nothing.

    A source-features file (it has a `compile_status` column) goes to `kernel_source_features`
    instead (`_ingest_source_frame`: 'error' rows and unknown kernels left out).

    Returns:
        Rows inserted or updated.
    Raises:
        ValidationError: the file is unreadable or lacks a required column (one line).
    """
    try:
        frame = pl.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one line
        raise ValidationError(f"{path}: unreadable compile-features file ({type(exc).__name__}: {exc})") from None
    missing = [c for c in ("kernel_id", "target", "status") if c not in frame.columns]
    if missing:
        raise ValidationError(f"{path}: compile-features file lacks column(s) {', '.join(missing)}")
    if "compile_status" in frame.columns:  # a source-features file (data/features/<target>/source-*)
        return _ingest_source_frame(con, frame)
    known = query_frame(con, "SELECT kernel_id FROM kernels", [])["kernel_id"].to_list()
    rows = frame.filter(pl.col("status").is_in(list(FEATURE_STATUSES)) & pl.col("kernel_id").is_in(known))
    current = query_frame(con, "SELECT kernel_id, target, status, n_regs, n_spills, shared_bytes, n_kernels, "
                               "n_launches, error FROM kernel_features", [])
    cols = [c for c in FEATURE_COLUMNS if c in rows.columns]
    rows = rows.select([pl.col(c).cast(current.schema[c]) for c in cols])
    fresh = rows.join(current.select(cols), on=cols, how="anti", nulls_equal=True)
    return add_kernel_features(con, fresh) if fresh.height else 0


def add_kernel_source_features(con: duckdb.DuckDBPyConnection, frame: Frame) -> int:
    """Insert or replace source features per (kernel_id, target).

    Args:
        con: a writable connection.
        frame: kernel_id, target, status ('ok' | 'partial' | 'failed'), features (a JSON object
            of numbers, as text or a mapping), optional compile_status, error, seconds.
    Returns:
        Rows inserted or updated.
    Raises:
        ValidationError: missing columns, an unknown status or features that are not a JSON
            object of numbers; nothing is written.
    """
    rows = conform(to_polars(frame, "kernel_source_features"), SOURCE_FEATURE_COLUMNS,
                   ("kernel_id", "target", "status", "features"), "kernel_source_features")
    check_in(rows, "status", SOURCE_FEATURE_STATUSES, "kernel_source_features")
    texts = []
    for kid, raw in zip(rows["kernel_id"].to_list(), rows["features"].to_list(), strict=True):
        feats = json.loads(raw) if isinstance(raw, str) else raw
        if not isinstance(feats, Mapping) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in feats.values()):
            raise ValidationError(f"kernel_source_features: features of {str(kid)[:16]}... are not a JSON object of numbers")
        texts.append(json.dumps(dict(sorted(feats.items()))))
    rows = dedupe_last(rows.with_columns(pl.Series("features", texts, dtype=pl.String)), ["kernel_id", "target"])
    with transaction(con):
        return insert_frame(con, "kernel_source_features", rows, ["kernel_id", "target"], "update", touch="updated_at")


def read_kernel_source_features(con: duckdb.DuckDBPyConnection, target: str = "sm_90",
                                kernel_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Source features of one target: per kernel a dict of kernel_id, status, compile_status,
    error and every known feature by name (unknown ones absent), ordered by kernel id."""
    sql = "SELECT kernel_id, status, compile_status, error, features FROM kernel_source_features WHERE target = ?"
    params: list[Any] = [target]
    if kernel_ids is not None:
        sql += " AND list_contains(?, kernel_id)"
        params.append(list(kernel_ids))
    out = []
    for row in query_frame(con, sql + " ORDER BY kernel_id", params).to_dicts():
        feats = json.loads(row.pop("features"))
        out.append({**row, **feats})
    return out


def forecast_features(con: duckdb.DuckDBPyConnection, kernel_ids: Iterable[str] | None = None,
                      target: str = "sm_90") -> dict[str, dict[str, Any]]:
    """kernel_id -> what a forecaster may know of the kernel beyond its source: the compile
    features of `kernel_features` (compiled rows) overlaid with the source features of
    `kernel_source_features` (ok or partial rows; failed ones add nothing). Kernels with
    neither are absent; `kernel_ids` None means every kernel."""
    ids = None if kernel_ids is None else list(kernel_ids)
    out: dict[str, dict[str, Any]] = {}
    for r in read_kernel_features(con, target, ids).to_dicts():
        if r["status"] == "compiled":
            out[r["kernel_id"]] = {k: v for k, v in r.items() if k not in ("kernel_id", "status")}
    for r in read_kernel_source_features(con, target, ids):
        if r["status"] in ("ok", "partial"):
            feats = {k: v for k, v in r.items() if k not in ("kernel_id", "status", "compile_status", "error")}
            out.setdefault(r["kernel_id"], {}).update(feats)
    return out


def _ingest_source_frame(con: duckdb.DuckDBPyConnection, frame: pl.DataFrame) -> int:
    known = set(query_frame(con, "SELECT kernel_id FROM kernels", [])["kernel_id"].to_list())
    names = [c for c in frame.columns if c not in _SOURCE_ROW_FIELDS]
    rows = []
    for r in frame.filter(pl.col("status").is_in(list(SOURCE_FEATURE_STATUSES))).to_dicts():
        if r["kernel_id"] not in known:
            continue
        feats = {n: float(r[n]) for n in names if isinstance(r[n], (int, float)) and not isinstance(r[n], bool)}
        rows.append({"kernel_id": r["kernel_id"], "target": r["target"], "status": r["status"],
                     "compile_status": r.get("compile_status"), "features": json.dumps(dict(sorted(feats.items()))),
                     "error": r.get("error"), "seconds": r.get("seconds")})
    if not rows:
        return 0
    fresh = pl.DataFrame(rows, schema={"kernel_id": pl.String, "target": pl.String, "status": pl.String,
                                       "compile_status": pl.String, "features": pl.String, "error": pl.String,
                                       "seconds": pl.Float64})
    current = query_frame(con, "SELECT kernel_id, target, status, compile_status, features, error "
                               "FROM kernel_source_features", [])
    cols = ["kernel_id", "target", "status", "compile_status", "features", "error"]
    fresh = fresh.join(current.select(cols), on=cols, how="anti", nulls_equal=True)
    return add_kernel_source_features(con, fresh) if fresh.height else 0
