"""Hardware rows from the fingerprint JSON that every result row carries.

The profiling worker (pipelines/profiling/hardware.py) writes the fingerprint; we read the keys
below (through warehouse/fingerprint.py, the one reader) and keep the whole JSON. A nested "nvidia_smi" object is merged in (top level wins).
Aliases cover the worker's names, ours and torch's `get_device_properties` names; the first
present, non-empty, non-zero value wins. Absent keys leave the column NULL.

    device_name      "device_name" | "name"
    capability       "capability" | "compute_capability": [9, 0], "9.0" or "sm_90"
    sm_count         "sm_count" | "multi_processor_count"
    memory_gb        "memory_gb" (GiB) | "total_memory_bytes" | "total_memory" (bytes)
    l2_bytes         "l2_bytes" | "l2_cache_bytes" | "l2_cache_size"
    bandwidth        "memory_bandwidth_gbps"
    clocks (MHz)     "sm_clock_mhz" | "clock_mhz" | "clocks_max_sm" | "clocks_sm",
                     "mem_clock_mhz" | "memory_clock_mhz" | "clocks_max_mem" | "clocks_mem"
    versions         "driver_version" | "driver", "cuda_version" | "cuda",
                     "torch_version" | "torch", "triton_version" | "triton"
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import duckdb
import polars as pl

from warehouse import fingerprint as fingerprint_reader
from warehouse.db import execute, query_frame

_INT_COLUMNS = ("sm_count", "l2_bytes")
_FLOAT_COLUMNS = ("memory_bandwidth_gbps", "sm_clock_mhz", "mem_clock_mhz")


def _capability(value: Any) -> str | None:
    """[9, 0] / (9, 0) / "9.0" / "sm_90" -> "9.0"."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return f"{int(value[0])}.{int(value[1])}"
    text = str(value)
    if text.startswith("sm_") and text[3:].isdigit() and len(text) >= 5:
        return f"{text[3:-1]}.{text[-1]}"
    return text


def _number(value: Any, kind: type) -> Any:
    try:
        return kind(value) if value is not None else None
    except (TypeError, ValueError):
        return None  # a fingerprint field we cannot read stays in fingerprint_json only


def hardware_row(hardware_id: str, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """Columns of the `hardware` table from one fingerprint.

    Args:
        hardware_id: the partition key, e.g. "nvidia-h200-sm90".
        fingerprint: the decoded hardware_json object.
    Returns:
        A dict with every hardware column except first_seen.
    """
    fp = fingerprint_reader.flat(fingerprint)
    row: dict[str, Any] = {"hardware_id": hardware_id}
    for column in fingerprint_reader.ALIASES:
        row[column] = fingerprint_reader.field(fp, column)
    row["capability"] = _capability(row["capability"])
    for column in _INT_COLUMNS:
        row[column] = _number(row[column], int)
    for column in _FLOAT_COLUMNS:
        row[column] = _number(row[column], float)
    for column in (
        "device_name",
        "driver_version",
        "cuda_version",
        "torch_version",
        "triton_version",
    ):
        row[column] = None if row[column] is None else str(row[column])
    row["memory_gb"] = fingerprint_reader.memory_gib(fp)
    row["fingerprint_json"] = json.dumps(fingerprint, sort_keys=True)
    return row


def register_hardware(
    con: duckdb.DuckDBPyConnection, hardware_id: str, fingerprint: dict[str, Any]
) -> bool:
    """Add a hardware row unless the id is known (the first fingerprint is kept).

    Args:
        con: a writable connection (the caller owns the transaction).
        hardware_id: the partition key.
        fingerprint: the decoded hardware_json object.
    Returns:
        True when the row was new.
    """
    row = hardware_row(hardware_id, fingerprint)
    cols = list(row)
    sql = (
        f"INSERT INTO hardware ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)}) "
        "ON CONFLICT (hardware_id) DO NOTHING"
    )
    return bool(execute(con, sql, [row[c] for c in cols])[0][0])


def read_hardware(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Every known device type, ordered by hardware_id."""
    return query_frame(con, "SELECT * FROM hardware ORDER BY hardware_id")


def fingerprints(con: duckdb.DuckDBPyConnection, hardware_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """hardware_id -> its stored row over its fingerprint JSON (a non-null column wins; the
    first_seen timestamp left out, so the result is plain JSON), for the ids the table holds."""
    wanted = list(hardware_ids)
    rows = query_frame(con, "SELECT * FROM hardware WHERE list_contains(?, hardware_id)", [wanted]).to_dicts()
    out = {}
    for row in rows:
        fp = json.loads(row.pop("fingerprint_json", None) or "{}")
        out[row["hardware_id"]] = {**fp, **{k: v for k, v in row.items() if v is not None and not hasattr(v, "isoformat")}}
    return out
