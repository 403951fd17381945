"""Forecasts of a model or baseline on pairs: one row per (pair_id, model_ref, repeat).

A parse failure is a row too (parse_ok false, p null): it is an outcome the metrics count, never
a dropped row. Writing the same key again replaces the row (a re-run of the same model).
"""

from __future__ import annotations

import json

import duckdb
import polars as pl

from warehouse.bin_edges import P_COLS
from warehouse.db import execute, query_frame, transaction, where_clause
from warehouse.errors import ValidationError
from warehouse.frames import Frame, check_in, conform, dedupe_last, insert_frame, to_polars

FORECAST_COLUMNS = (
    "pair_id",
    "model_ref",
    "repeat",
    "predicted_bin",
    "argmax_bin",
    *P_COLS,
    "raw_sum",
    "parse_ok",
    "parse_error",
    "tokens",
    "latency_s",
)
_KEY = ("pair_id", "model_ref", "repeat")
# Renormalised probabilities may be off by rounding; anything worse is a caller bug.
_P_SLACK = 1e-6


def _expand_p(rows: pl.DataFrame) -> pl.DataFrame:
    """A `p` list column of length 8 becomes p1..p8 (when p1..p8 are not given)."""
    if "p" not in rows.columns or "p1" in rows.columns:
        return rows
    lengths = rows.get_column("p").drop_nulls().list.len().unique().to_list()
    if any(n != 8 for n in lengths):
        raise ValidationError(
            f"forecasts: column 'p' must hold 8 probabilities, got lengths {sorted(lengths)}"
        )
    return rows.with_columns(
        [
            pl.col("p").list.get(i, null_on_oob=True).cast(pl.Float64).alias(name)
            for i, name in enumerate(P_COLS)
        ]
    ).drop("p")


def write_forecasts(con: duckdb.DuckDBPyConnection, frame: Frame, *more: Frame,
                    listing: tuple[str, dict] | None = None) -> int:
    """Insert or replace forecasts: every frame is validated before any row is written, and all
    are written in one transaction (forecasts of several models land together or not at all),
    with `listing` = (dataset version, its forecaster listing) when given (`write_forecast_listing`).

    Args:
        con: a writable connection.
        frame, *more: pair_id, model_ref, parse_ok, optional repeat (default 0), predicted_bin,
            argmax_bin, p1..p8 (or a list column `p` of 8), raw_sum, parse_error, tokens,
            latency_s.
    Returns:
        Rows inserted or updated.
    Raises:
        ValidationError: missing key columns, a bin outside 1..8, a parsed row without all
            eight probabilities or with one outside [0, 1]; nothing is written.
    """
    rows = dedupe_last(pl.concat([_validated(f) for f in (frame, *more)], how="vertical_relaxed"), _KEY)
    if listing is not None:
        _check_listing(listing[1])
    with transaction(con):
        written = insert_frame(con, "forecasts", rows, _KEY, "update", touch="created_at")
        if listing is not None:
            _insert_listing(con, *listing)
        return written


def _validated(frame: Frame) -> pl.DataFrame:
    """One frame as FORECAST_COLUMNS rows, or ValidationError."""
    rows = _expand_p(to_polars(frame, "forecasts"))
    if "repeat" not in rows.columns:
        rows = rows.with_columns(pl.lit(0, dtype=pl.Int32).alias("repeat"))
    rows = conform(
        rows, FORECAST_COLUMNS, ("pair_id", "model_ref", "repeat", "parse_ok"), "forecasts"
    )
    check_in(rows, "predicted_bin", range(1, 9), "forecasts", nullable=True)
    check_in(rows, "argmax_bin", range(1, 9), "forecasts", nullable=True)
    parsed = rows.filter(pl.col("parse_ok"))
    for name in P_COLS:
        col = parsed.get_column(name).cast(pl.Float64)
        if col.null_count():
            raise ValidationError(f"forecasts: a parsed forecast has no {name}")
        if col.len() and (
            (col < -_P_SLACK).any() or (col > 1 + _P_SLACK).any() or col.is_nan().any()
        ):
            raise ValidationError(f"forecasts: {name} outside [0, 1] in a parsed forecast")
    return rows


def read_forecasts(
    con: duckdb.DuckDBPyConnection,
    model_ref: str | None = None,
    dataset_version: str | None = None,
    with_pairs: bool = False,
) -> pl.DataFrame:
    """Forecasts, optionally of one model and/or one dataset version's pairs.

    Args:
        con: an open connection.
        model_ref: only this model reference.
        dataset_version: only forecasts of this version's pairs.
        with_pairs: add the pair's dataset_version, task, hardware_id, anchor/candidate
            kernel ids, speedup, true_bin, pair_type and split (what evaluation needs).
    Returns:
        Rows ordered by model_ref, pair_id, repeat.
    """
    pair_cols = (
        ", p.dataset_version, p.task, p.hardware_id, p.anchor_kernel_id, p.candidate_kernel_id, "
        "p.speedup, p.true_bin, p.pair_type, p.split"
        if with_pairs
        else ""
    )
    join = " JOIN pairs p USING (pair_id)" if (with_pairs or dataset_version is not None) else ""
    where, params = where_clause({"f.model_ref = ?": model_ref, "p.dataset_version = ?": dataset_version})
    sql = f"SELECT f.*{pair_cols} FROM forecasts f{join}{where}"
    return query_frame(con, sql + " ORDER BY f.model_ref, f.pair_id, f.repeat", params)


def write_forecast_listing(con: duckdb.DuckDBPyConnection, dataset_version: str, listing: dict) -> None:
    """Store what the forecasts of `dataset_version` are (forecasters, pairs of each split, why a
    split is empty), replacing an earlier listing of the version."""
    _check_listing(listing)
    _insert_listing(con, dataset_version, listing)


def _check_listing(listing: dict) -> None:
    if not isinstance(listing, dict) or "pairs" not in listing or "forecasters" not in listing:
        raise ValidationError("a forecaster listing needs 'pairs' and 'forecasters'")


def _insert_listing(con: duckdb.DuckDBPyConnection, dataset_version: str, listing: dict) -> None:
    execute(con, "INSERT OR REPLACE INTO forecast_listings (dataset_version, listing, written_at) VALUES (?, ?, now())",
            [dataset_version, json.dumps(listing)])


def read_forecast_listing(con: duckdb.DuckDBPyConnection, dataset_version: str) -> dict:
    """The listing the forecasts asset stored for `dataset_version`.

    Raises:
        ValidationError: none is stored for the version (one line: materialise `forecasts`).
    """
    rows = execute(con, "SELECT listing FROM forecast_listings WHERE dataset_version = ?", [dataset_version])
    if not rows:
        raise ValidationError(f"no forecaster listing of dataset version {dataset_version} in the warehouse: "
                              "materialise `forecasts`")
    return json.loads(rows[0][0])
