"""Moving polars/Arrow frames into tables: column checks, key de-duplication, one INSERT.

Typed writes in the other modules describe their table's columns and keys; this module does the
mechanics once so every write behaves the same (missing optional columns become NULL, extra
columns are ignored, required ones must be present and non-null).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import duckdb
import polars as pl
import pyarrow as pa

from warehouse.db import execute, registered
from warehouse.errors import ValidationError

Frame = pl.DataFrame | pa.Table
Conflict = Literal["nothing", "update", "error"]


def to_polars(frame: Frame, what: str) -> pl.DataFrame:
    """A polars view of a polars frame or Arrow table.

    Args:
        frame: the rows.
        what: the table name, for error messages.
    Returns:
        A polars DataFrame.
    Raises:
        ValidationError: neither polars nor Arrow.
    """
    if isinstance(frame, pl.DataFrame):
        return frame
    if isinstance(frame, pa.Table):
        return pl.from_arrow(frame)  # type: ignore[return-value]
    raise ValidationError(
        f"{what}: expected a polars DataFrame or pyarrow Table, got {type(frame).__name__}"
    )


def conform(
    frame: pl.DataFrame, columns: Sequence[str], required: Iterable[str], what: str
) -> pl.DataFrame:
    """Select `columns` in order, adding absent optional ones as NULL.

    Args:
        frame: the input rows.
        columns: every column the table takes from callers.
        required: columns that must be present and hold no nulls.
        what: the table name, for error messages.
    Returns:
        The frame restricted to `columns`.
    Raises:
        ValidationError: a required column is missing or has nulls.
    """
    for name in required:
        if name not in frame.columns:
            raise ValidationError(f"{what}: missing required column {name!r}")
        n_null = frame.get_column(name).null_count()
        if n_null:
            raise ValidationError(f"{what}: column {name!r} has {n_null} null value(s)")
    extra = [pl.lit(None).alias(c) for c in columns if c not in frame.columns]
    return frame.with_columns(extra).select(columns) if extra else frame.select(columns)


def dedupe_last(frame: pl.DataFrame, key: Sequence[str]) -> pl.DataFrame:
    """Keep the last row per key, so an upsert of one batch never touches a row twice."""
    return frame.unique(subset=list(key), keep="last", maintain_order=True)


def insert_frame(
    con: duckdb.DuckDBPyConnection,
    table: str,
    frame: pl.DataFrame,
    key: Sequence[str],
    conflict: Conflict,
    touch: str | None = None,
) -> int:
    """INSERT the frame's columns into `table`.

    Args:
        con: an open connection (the caller owns any transaction).
        table: target table.
        frame: rows whose column names match the table's.
        key: primary-key columns.
        conflict: "nothing" skips existing keys, "update" overwrites the other columns,
            "error" lets a duplicate key raise.
        touch: a timestamp column to set to now() on update (e.g. "updated_at").
    Returns:
        Rows inserted or updated.
    """
    if frame.height == 0:
        return 0
    cols = frame.columns
    col_list = ", ".join(cols)
    sql = f"INSERT INTO {table} ({col_list}) SELECT {col_list} FROM _incoming"
    if conflict == "nothing":
        sql += f" ON CONFLICT ({', '.join(key)}) DO NOTHING"
    elif conflict == "update":
        sets = [f"{c} = excluded.{c}" for c in cols if c not in key]
        if touch:
            sets.append(f"{touch} = now()")
        action = f"DO UPDATE SET {', '.join(sets)}" if sets else "DO NOTHING"
        sql += f" ON CONFLICT ({', '.join(key)}) {action}"
    with registered(con, "_incoming", frame.to_arrow()):
        return int(execute(con, sql)[0][0])


def json_text(value: Any, what: str) -> str | None:
    """A JSON column value: str is checked to parse, other values are dumped with sorted keys.

    Args:
        value: None, a JSON string, or a JSON-serialisable object.
        what: column description, for error messages.
    Returns:
        JSON text or None.
    Raises:
        ValidationError: the string is not JSON, or the object cannot be serialised.
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError as exc:
            raise ValidationError(f"{what}: not valid JSON ({exc.msg})") from exc
        return value
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"{what}: cannot be stored as JSON ({exc})") from exc


def check_in(
    frame: pl.DataFrame,
    column: str,
    allowed: Iterable[str | int],
    what: str,
    nullable: bool = False,
) -> None:
    """Raise if `column` holds a value outside `allowed` (nulls allowed only if `nullable`)."""
    allowed = set(allowed)
    for value in frame.get_column(column).unique().to_list():
        if value is None and nullable:
            continue
        if value not in allowed:
            raise ValidationError(
                f"{what}: {column}={value!r} is not one of {sorted(allowed, key=str)}"
            )


def check_positive_finite(frame: pl.DataFrame, column: str, what: str) -> None:
    """Raise if a non-null value of `column` is NaN, infinite or <= 0."""
    for value in frame.get_column(column).drop_nulls().to_list():
        if not math.isfinite(value) or value <= 0:
            raise ValidationError(f"{what}: {column}={value!r} must be finite and > 0")
