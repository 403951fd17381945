"""Model lineage: registered model version -> dataset version -> measurements -> kernels, and back.

MLflow holds the model; this table holds the link to the data, so one SQL join answers
"what did this model learn from" and "which models learned from this measurement".

A row names the dataset version the version's fit used (its MLflow tag
`trained_dataset_version`), never the version of the run that registered it. A version trained
elsewhere (an adapter from a GPU host) may have learned from a version this warehouse no longer
holds: its row is kept, `read_model_lineage` shows `dataset_held = false`, and
`measurements_for_model` says so instead of answering with another version's measurements.
"""

from __future__ import annotations

import duckdb
import polars as pl

from warehouse.db import execute, query_frame, transaction
from warehouse.errors import ValidationError, WarehouseError


def record_model_lineage(
    con: duckdb.DuckDBPyConnection,
    model_name: str,
    model_version: str | int,
    dataset_version: str,
    mlflow_run_id: str | None = None,
    base_model: str | None = None,
    git_commit: str | None = None,
    dagster_run_id: str | None = None,
    require_held: bool = True,
) -> None:
    """Record (or replace) the data lineage of one registered model version.

    Args:
        con: a writable connection.
        model_name: MLflow registered model name.
        model_version: MLflow model version (stored as text).
        dataset_version: the registered dataset version it was trained on.
        mlflow_run_id: the training run.
        base_model: HF id or path of the base model.
        git_commit: code version.
        dagster_run_id: the orchestrating run.
        require_held: refuse a dataset version this warehouse does not hold (the default);
            False records it anyway, for a version trained elsewhere (read back as not held).
    Raises:
        ValidationError: the dataset version is not registered (and require_held), or is
            empty; nothing is written.
    """
    if not dataset_version:
        raise ValidationError(f"model {model_name}/{model_version}: no dataset version given")
    with transaction(con):
        if require_held and not execute(
            con, "SELECT 1 FROM dataset_versions WHERE dataset_version = ?", [dataset_version]
        ):
            raise ValidationError(
                f"model {model_name}/{model_version}: dataset version {dataset_version!r} is not registered"
            )
        execute(
            con,
            """
            INSERT INTO model_lineage (model_name, model_version, mlflow_run_id, dataset_version, base_model,
                                       git_commit, dagster_run_id)
            VALUES (?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (model_name, model_version) DO UPDATE SET
                mlflow_run_id = excluded.mlflow_run_id, dataset_version = excluded.dataset_version,
                base_model = excluded.base_model, git_commit = excluded.git_commit,
                dagster_run_id = excluded.dagster_run_id, created_at = now()
            """,
            [
                model_name,
                str(model_version),
                mlflow_run_id,
                dataset_version,
                base_model,
                git_commit,
                dagster_run_id,
            ],
        )


_LINEAGE_ROWS = """
    SELECT l.*, d.dataset_version IS NOT NULL AS dataset_held
    FROM model_lineage l LEFT JOIN dataset_versions d USING (dataset_version)
"""
_LINEAGE_ORDER = " ORDER BY l.model_name, try_cast(l.model_version AS BIGINT) NULLS LAST, l.model_version"


def read_model_lineage(
    con: duckdb.DuckDBPyConnection, model_name: str | None = None
) -> pl.DataFrame:
    """Lineage rows, optionally of one model name, ordered by name and version, with
    `dataset_held` (whether this warehouse holds the dataset version the fit used)."""
    if model_name is None:
        return query_frame(con, _LINEAGE_ROWS + _LINEAGE_ORDER)
    return query_frame(con, _LINEAGE_ROWS + " WHERE l.model_name = ?" + _LINEAGE_ORDER, [model_name])


def lineage_of(con: duckdb.DuckDBPyConnection, model_name: str, model_version: str | int) -> dict | None:
    """One version's lineage row (as `read_model_lineage`) plus `note`, a sentence for reports;
    None when no row is recorded."""
    rows = query_frame(con, _LINEAGE_ROWS + " WHERE l.model_name = ? AND l.model_version = ?",
                       [model_name, str(model_version)]).to_dicts()
    if not rows:
        return None
    row = rows[0]
    row["note"] = (f"trained on dataset version {row['dataset_version']}" if row["dataset_held"] else
                   f"trained on dataset version {row['dataset_version']}, which this warehouse no longer holds")
    return row


def measurements_for_model(
    con: duckdb.DuckDBPyConnection, model_name: str, model_version: str | int
) -> pl.DataFrame:
    """Every measurement (with its kernel's lineage) behind a registered model version.

    Args:
        con: an open connection.
        model_name: MLflow registered model name.
        model_version: its version.
    Returns:
        Columns model_name, model_version, dataset_version, measurement_id, kernel_id, task,
        hardware_id, batch_id, status, failure_kind, speedup, measured_at, generator,
        algorithm, parent_kernel_id, mutation; ordered by measurement_id.
    Raises:
        WarehouseError: no lineage recorded for that model version, or its dataset version is
            not held here (the message says which).
    """
    version = str(model_version)
    row = lineage_of(con, model_name, version)
    if row is None:
        raise WarehouseError(f"no lineage recorded for model {model_name} version {version}")
    if not row["dataset_held"]:
        raise WarehouseError(f"model {model_name} version {version} was {row['note']}")
    return query_frame(
        con,
        """
        SELECT l.model_name, l.model_version, l.dataset_version, m.measurement_id, m.kernel_id, m.task,
               m.hardware_id, m.batch_id, m.status, m.failure_kind, m.speedup, m.measured_at,
               k.generator, k.algorithm, k.parent_kernel_id, k.mutation
        FROM model_lineage l
        JOIN dataset_measurements d USING (dataset_version)
        JOIN measurements m USING (measurement_id)
        LEFT JOIN kernels k ON k.kernel_id = m.kernel_id
        WHERE l.model_name = ? AND l.model_version = ?
        ORDER BY m.measurement_id
        """,
        [model_name, version],
    )


def kernels_for_model(con: duckdb.DuckDBPyConnection, model_name: str, model_version: str | int) -> list[str]:
    """The kernel ids a registered version learned from (its dataset version's measurements),
    sorted; raises as `measurements_for_model`."""
    frame = measurements_for_model(con, model_name, model_version)
    return sorted(set(frame["kernel_id"].to_list())) if frame.height else []


def models_for_measurement(con: duckdb.DuckDBPyConnection, measurement_id: str) -> pl.DataFrame:
    """Every registered model version whose training data included a measurement.

    Args:
        con: an open connection.
        measurement_id: the measurement.
    Returns:
        Columns model_name, model_version, dataset_version, mlflow_run_id, base_model, created_at;
        empty when no model used it.
    """
    return query_frame(
        con,
        """
        SELECT l.model_name, l.model_version, l.dataset_version, l.mlflow_run_id, l.base_model, l.created_at
        FROM dataset_measurements d JOIN model_lineage l USING (dataset_version)
        WHERE d.measurement_id = ?
        ORDER BY l.model_name, try_cast(l.model_version AS BIGINT) NULLS LAST, l.model_version
        """,
        [measurement_id],
    )
