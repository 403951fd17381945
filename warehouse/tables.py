"""Every typed read and write of the warehouse in one namespace (`from warehouse import tables`).

The functions live in small modules by table family; this module only gathers them.
"""

from __future__ import annotations

from warehouse.datasets import (
    current_dataset_version,
    dataset_measurement_ids,
    list_dataset_versions,
    make_pair_id,
    pair_measurement_ids,
    read_dataset_version,
    read_pairs,
    register_dataset_version,
    write_dataset,
    write_pairs,
)
from warehouse.forecasts import read_forecasts, write_forecasts
from warehouse.hardware import fingerprints, read_hardware
from warehouse.ingest import (
    IngestReport,
    ingest_file,
    ingest_kernels,
    ingest_path,
    ingest_paths,
    ingest_results,
)
from warehouse.kernels import (
    add_kernel_checks,
    add_kernel_features,
    add_kernels,
    read_kernels,
    read_tasks,
    upsert_tasks,
)
from warehouse.lineage import (
    measurements_for_model,
    models_for_measurement,
    read_model_lineage,
    record_model_lineage,
)
from warehouse.measurements import (
    dataset_counts,
    measurements_frame,
    pair_counts,
    speedup_bin_counts,
)

__all__ = [
    "IngestReport",
    "add_kernel_checks",
    "add_kernel_features",
    "add_kernels",
    "current_dataset_version",
    "dataset_counts",
    "dataset_measurement_ids",
    "fingerprints",
    "ingest_file",
    "ingest_kernels",
    "ingest_path",
    "ingest_paths",
    "ingest_results",
    "list_dataset_versions",
    "make_pair_id",
    "pair_measurement_ids",
    "measurements_for_model",
    "measurements_frame",
    "models_for_measurement",
    "pair_counts",
    "read_dataset_version",
    "read_forecasts",
    "read_hardware",
    "read_kernels",
    "read_model_lineage",
    "read_pairs",
    "read_tasks",
    "record_model_lineage",
    "register_dataset_version",
    "speedup_bin_counts",
    "upsert_tasks",
    "write_dataset",
    "write_forecasts",
    "write_pairs",
]
