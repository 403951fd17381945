"""Builders of in-process warehouse inputs (kernel batches, result files) shared by the
test_warehouse*.py modules, plus checks that the builders match the shared schemas."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from warehouse.formats import KERNEL_BATCH_SCHEMA, RESULT_SCHEMA, hardware_id
from warehouse.ids import kernel_id

H200 = {
    "device_name": "NVIDIA H200",
    "capability": [9, 0],
    "sm_count": 132,
    "total_memory": 150 * 1024**3,
    "l2_bytes": 60 * 1024**2,
    "sm_clock_mhz": 1980,
    "mem_clock_mhz": 3201,
    "driver_version": "570.86",
    "cuda_version": "12.8",
    "torch_version": "2.13.0",
    "triton_version": "3.6.0",
}
H200_ID = hardware_id("NVIDIA H200", (9, 0))
A100 = {**H200, "device_name": "NVIDIA A100-SXM4-80GB", "capability": [8, 0], "sm_count": 108}
A100_ID = hardware_id("NVIDIA A100-SXM4-80GB", (8, 0))


def kernel_source(i: int, task: str = "softmax") -> str:
    """A distinct, valid kernel module per i."""
    return f'"""{task} variant {i}"""\nimport torch\n\n\ndef custom_kernel(data):\n    return data * {i}\n'


def kernel_row(
    i: int, task: str = "softmax", parent: int | None = None, generator: str = "kernelcast-space"
) -> dict[str, Any]:
    """One KERNEL_BATCH_SCHEMA row."""
    source = kernel_source(i, task)
    return {
        "kernel_id": kernel_id(source),
        "task": task,
        "source": source,
        "language": "triton",
        "generator": generator,
        "generator_version": "1",
        "algorithm": "online" if i % 2 else "two_pass",
        "knobs_json": json.dumps({"BLOCK": 64 * (i + 1)}),
        "parent_kernel_id": kernel_id(kernel_source(parent, task)) if parent is not None else None,
        "mutation": f"BLOCK:{64 * (parent + 1)}->{64 * (i + 1)}" if parent is not None else None,
    }


def kernel_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Kernel rows as a KERNEL_BATCH_SCHEMA table."""
    return pa.Table.from_pylist(rows, schema=KERNEL_BATCH_SCHEMA)


def result_row(
    kid: str,
    *,
    batch_id: str = "batch-1",
    task: str = "softmax",
    status: str = "ok",
    speedup: float | None = 1.5,
    failure_kind: str | None = None,
    fingerprint: dict[str, Any] | None = None,
    hw_id: str = H200_ID,
    cases: int = 2,
) -> dict[str, Any]:
    """One RESULT_SCHEMA row; a failed row gets no timings and no speedup by default."""
    fingerprint = H200 if fingerprint is None else fingerprint
    ok = status == "ok"
    s = speedup if ok else None
    per_case = [s] * cases if ok and s is not None else None
    return {
        "batch_id": batch_id,
        "kernel_id": kid,
        "task": task,
        "status": status,
        "failure_kind": failure_kind if not ok or failure_kind else None,
        "error": None if ok else "boom",
        "case_ids": [f"n={2**k}" for k in range(cases)],
        "kernel_median_ms": [1.0] * cases if ok else None,
        "kernel_mean_ms": [1.01] * cases if ok else None,
        "kernel_stderr_ms": [0.01] * cases if ok else None,
        "kernel_reps": [100] * cases if ok else None,
        "ref_median_ms": [1.5] * cases if ok else None,
        "ref_mean_ms": [1.51] * cases if ok else None,
        "ref_stderr_ms": [0.01] * cases if ok else None,
        "ref_reps": [100] * cases if ok else None,
        "case_speedups": per_case,
        "speedup": s,
        "needs_recheck": bool(s and s > 10),
        "protocol": "kernelcast",
        "harness_version": "kernelcast-harness-1",
        "hardware_id": hw_id,
        "hardware_json": json.dumps(fingerprint, sort_keys=True),
        "measured_at": datetime(2026, 11, 1, 12, 0, tzinfo=UTC),
        "compile_s": 1.0,
        "check_s": 0.5,
        "time_s": 2.0,
    }


def results_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Result rows as a RESULT_SCHEMA table."""
    return pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)


def write(table: pa.Table, path: Path) -> Path:
    """Write a Parquet file as the worker does (zstd)."""
    pq.write_table(table, path, compression="zstd")
    return path


def test_factories_match_the_shared_schemas() -> None:
    rows = [kernel_row(0), kernel_row(1, parent=0)]
    kernels = kernel_table(rows)
    assert kernels.schema.equals(KERNEL_BATCH_SCHEMA)
    assert rows[1]["parent_kernel_id"] == rows[0]["kernel_id"]
    results = results_table(
        [
            result_row(rows[0]["kernel_id"]),
            result_row(rows[1]["kernel_id"], status="failed", failure_kind="incorrect"),
        ]
    )
    assert results.schema.equals(RESULT_SCHEMA)
    assert results.column("speedup").to_pylist() == [1.5, None]
    assert H200_ID == "nvidia-h200-sm90"
