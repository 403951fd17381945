"""The kernelcast warehouse: one DuckDB file, numbered migrations, typed reads and writes.

Public names are loaded lazily, so `import warehouse.ids` (used where only kernel ids are
needed) does not import duckdb or polars.

    con = warehouse.connect(home / "warehouse.duckdb")   # applies pending migrations
    reports = warehouse.ingest_path(con, "inbox/")         # kernels first, then results
    frame = warehouse.measurements_frame(con, hardware_id="nvidia-h200-sm90")
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    # db
    "connect": "warehouse.db",
    "apply_migrations": "warehouse.db",
    "pending_migrations": "warehouse.db",
    "load_migrations": "warehouse.db",
    "transaction": "warehouse.db",
    "table_names": "warehouse.db",
    # errors
    "WarehouseError": "warehouse.errors",
    "WarehouseLockedError": "warehouse.errors",
    "MigrationError": "warehouse.errors",
    "IngestError": "warehouse.errors",
    "ValidationError": "warehouse.errors",
    # tasks and kernels
    "upsert_tasks": "warehouse.kernels",
    "read_tasks": "warehouse.kernels",
    "add_kernels": "warehouse.kernels",
    "read_kernels": "warehouse.kernels",
    "add_kernel_features": "warehouse.kernels",
    "add_kernel_checks": "warehouse.kernels",
    "read_hardware": "warehouse.hardware",
    "fingerprints": "warehouse.hardware",
    # ingest
    "IngestReport": "warehouse.ingest",
    "ingest_results": "warehouse.ingest",
    "ingest_kernels": "warehouse.ingest",
    "ingest_file": "warehouse.ingest",
    "ingest_path": "warehouse.ingest",
    "ingest_paths": "warehouse.ingest",
    # measurements and counts
    "measurements_frame": "warehouse.measurements",
    "dataset_counts": "warehouse.measurements",
    "pair_counts": "warehouse.measurements",
    "speedup_bin_counts": "warehouse.measurements",
    # datasets
    "make_pair_id": "warehouse.datasets",
    "write_pairs": "warehouse.datasets",
    "read_pairs": "warehouse.datasets",
    "register_dataset_version": "warehouse.datasets",
    "write_dataset": "warehouse.datasets",
    "read_dataset_version": "warehouse.datasets",
    "list_dataset_versions": "warehouse.datasets",
    "current_dataset_version": "warehouse.datasets",
    "dataset_measurement_ids": "warehouse.datasets",
    "pair_measurement_ids": "warehouse.datasets",
    # forecasts
    "write_forecasts": "warehouse.forecasts",
    "read_forecasts": "warehouse.forecasts",
    # lineage
    "record_model_lineage": "warehouse.lineage",
    "read_model_lineage": "warehouse.lineage",
    "measurements_for_model": "warehouse.lineage",
    "models_for_measurement": "warehouse.lineage",
    # ids
    "kernel_id": "warehouse.ids",
    "normalise_source": "warehouse.ids",
}

__all__ = sorted(_EXPORTS)  # noqa: PLE0605 - built from the table above, one place to edit


def __getattr__(name: str) -> Any:
    """Import the defining module on first use of a public name (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'warehouse' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
