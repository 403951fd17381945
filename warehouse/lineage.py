"""Model lineage: registered model version -> dataset version -> measurements -> kernels, and back.

MLflow holds the model; this table holds the link to the data, so one SQL join answers
"what did this model learn from" and "which models learned from this measurement".
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
    Raises:
        ValidationError: the dataset version is not registered; nothing is written.
    """
    with transaction(con):
        if not execute(
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


def read_model_lineage(
    con: duckdb.DuckDBPyConnection, model_name: str | None = None
) -> pl.DataFrame:
    """Lineage rows, optionally of one model name, ordered by name and version."""
    if model_name is None:
        return query_frame(
            con,
            "SELECT * FROM model_lineage ORDER BY model_name, try_cast(model_version AS BIGINT) NULLS LAST, model_version",
        )
    return query_frame(
        con,
        "SELECT * FROM model_lineage WHERE model_name = ? ORDER BY try_cast(model_version AS BIGINT) NULLS LAST, model_version",
        [model_name],
    )


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
        WarehouseError: no lineage recorded for that model version.
    """
    version = str(model_version)
    if not execute(
        con,
        "SELECT 1 FROM model_lineage WHERE model_name = ? AND model_version = ?",
        [model_name, version],
    ):
        raise WarehouseError(f"no lineage recorded for model {model_name} version {version}")
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
