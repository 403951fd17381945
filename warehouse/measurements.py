"""Reads over measurements: the joined frame curation works from, and the counts users see.

Bins are not computed here (the bin scheme is `models.bins`, a layer above); functions that
report bins take the bin function as an argument.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import duckdb
import polars as pl

from warehouse.db import execute, query_frame, where_clause

BinFunction = Callable[[Sequence[float]], Sequence[int]]


def _where(hardware_id: str | None, task: str | None, prefix: str = "m.") -> tuple[str, list[Any]]:
    return where_clause({f"{prefix}hardware_id = ?": hardware_id, f"{prefix}task = ?": task})


def measurements_frame(
    con: duckdb.DuckDBPyConnection, hardware_id: str | None = None, task: str | None = None
) -> pl.DataFrame:
    """Every measurement row with its kernel's lineage columns.

    Args:
        con: an open connection.
        hardware_id: only this device type.
        task: only this task.
    Returns:
        The `measurements` columns plus generator, algorithm, parent_kernel_id, mutation (null
        when the kernel was never ingested), ordered by task, hardware_id, kernel_id, measured_at.
    """
    where, params = _where(hardware_id, task)
    sql = f"""
        SELECT m.*, k.generator, k.algorithm, k.parent_kernel_id, k.mutation
        FROM measurements m LEFT JOIN kernels k USING (kernel_id){where}
        ORDER BY m.task, m.hardware_id, m.kernel_id, m.measured_at, m.measurement_id
    """
    return query_frame(con, sql, params)


def kernel_hardware(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """One row per (kernel_id, hardware_id) with a measurement of the kernel on the hardware, any status."""
    return query_frame(con, "SELECT DISTINCT kernel_id, hardware_id FROM measurements ORDER BY kernel_id, hardware_id", [])


def _records(
    con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | None = None
) -> list[dict[str, Any]]:
    return query_frame(con, sql, params).to_dicts()


def dataset_counts(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """Counts for `kernelcast dataset`: totals, per task, per hardware, per status, and the
    latest dataset version's pairs per split and bin.

    Args:
        con: an open connection.
    Returns:
        A JSON-serialisable dict with keys totals, by_task, by_hardware, by_status,
        latest_dataset (None when no dataset version is registered).
    """
    totals = _records(
        con,
        """
        SELECT
            (SELECT count(*) FROM tasks) AS tasks,
            (SELECT count(*) FROM kernels) AS kernels,
            (SELECT count(*) FROM hardware) AS hardware,
            (SELECT count(*) FROM batches) AS batches,
            (SELECT count(*) FROM measurements) AS measurements,
            (SELECT count(*) FROM measurements WHERE status = 'ok') AS ok,
            (SELECT count(*) FROM measurements WHERE status = 'failed') AS failed,
            (SELECT count(*) FROM measurements WHERE needs_recheck) AS needs_recheck,
            (SELECT count(*) FROM dataset_versions) AS dataset_versions,
            (SELECT count(*) FROM pairs) AS pairs,
            (SELECT count(*) FROM forecasts) AS forecasts
        """,
    )[0]
    by_task = _records(
        con,
        """
        WITH k AS (SELECT task, count(*) AS kernels FROM kernels GROUP BY task),
             m AS (SELECT task, count(*) AS measurements,
                          count(*) FILTER (WHERE status = 'ok') AS ok,
                          count(*) FILTER (WHERE status = 'failed') AS failed
                   FROM measurements GROUP BY task)
        SELECT coalesce(k.task, m.task) AS task, coalesce(k.kernels, 0) AS kernels,
               coalesce(m.measurements, 0) AS measurements, coalesce(m.ok, 0) AS ok,
               coalesce(m.failed, 0) AS failed
        FROM k FULL OUTER JOIN m ON k.task = m.task ORDER BY task
        """,
    )
    by_hardware = _records(
        con,
        """
        SELECT hardware_id, count(*) AS measurements,
               count(*) FILTER (WHERE status = 'ok') AS ok,
               count(*) FILTER (WHERE status = 'failed') AS failed,
               count(DISTINCT kernel_id) AS kernels
        FROM measurements GROUP BY hardware_id ORDER BY hardware_id
        """,
    )
    by_status = _records(
        con,
        """
        SELECT status, failure_kind, count(*) AS measurements
        FROM measurements GROUP BY status, failure_kind ORDER BY status DESC, failure_kind NULLS FIRST
        """,
    )
    latest = execute(
        con,
        "SELECT dataset_version FROM dataset_versions ORDER BY created_at DESC, dataset_version DESC LIMIT 1",
    )
    latest_dataset = None
    if latest:
        version = latest[0][0]
        latest_dataset = {"dataset_version": version, "pairs": pair_counts(con, version).to_dicts()}
    return {
        "totals": totals,
        "by_task": by_task,
        "by_hardware": by_hardware,
        "by_status": by_status,
        "latest_dataset": latest_dataset,
    }


def pair_counts(con: duckdb.DuckDBPyConnection, dataset_version: str) -> pl.DataFrame:
    """Pairs of one dataset version per split, pair type and true bin.

    Args:
        con: an open connection.
        dataset_version: the version.
    Returns:
        Columns split, pair_type, true_bin, pairs; ordered.
    """
    return query_frame(
        con,
        """
        SELECT split, pair_type, true_bin, count(*) AS pairs FROM pairs WHERE dataset_version = ?
        GROUP BY ALL ORDER BY split, pair_type, true_bin
        """,
        [dataset_version],
    )


def speedup_bin_counts(
    con: duckdb.DuckDBPyConnection,
    to_bins: BinFunction,
    hardware_id: str | None = None,
    task: str | None = None,
) -> pl.DataFrame:
    """Correct measurements per task, hardware and bin of their speedup over the reference.

    Args:
        con: an open connection.
        to_bins: vectorised bin function, e.g. `models.bins.speedups_to_bins`.
        hardware_id: only this device type.
        task: only this task.
    Returns:
        Columns task, hardware_id, bin, measurements (bins with no measurement are absent).
    """
    where, params = _where(hardware_id, task, prefix="")
    where = (where + " AND " if where else " WHERE ") + "status = 'ok'"
    frame = query_frame(con, f"SELECT task, hardware_id, speedup FROM measurements{where}", params)
    bins = [int(b) for b in to_bins(frame.get_column("speedup").to_list())] if frame.height else []
    return (
        frame.with_columns(pl.Series("bin", bins, dtype=pl.Int64))
        .group_by("task", "hardware_id", "bin")
        .agg(pl.len().cast(pl.Int64).alias("measurements"))
        .sort("task", "hardware_id", "bin")
    )
