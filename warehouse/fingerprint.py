"""The one reader of a hardware fingerprint (the JSON the profiling worker writes, or a row of
the warehouse `hardware` table): which keys may hold each field, and how a value is found.
The `hardware` table (warehouse/hardware.py) and the hardware table shown to the surrogate
(models/hardware.py) both read fingerprints through here. Standard library only: the LLM job
on a GPU host builds prompts without duckdb or polars.
"""

from __future__ import annotations

import json
from typing import Any

GIB = 1024**3

# Field -> keys that may hold it, first present wins (the worker's, ours and torch's
# `get_device_properties` spellings).
ALIASES: dict[str, tuple[str, ...]] = {
    "device_name": ("device_name", "name"),
    "capability": ("capability", "compute_capability"),
    "sm_count": ("sm_count", "multi_processor_count"),
    "l2_bytes": ("l2_bytes", "l2_cache_bytes", "l2_cache_size"),
    "memory_bandwidth_gbps": ("memory_bandwidth_gbps",),
    # Max clocks describe the device; current ones depend on load at the time of the query.
    "sm_clock_mhz": ("sm_clock_mhz", "clock_mhz", "clocks_max_sm", "clocks_sm"),
    "mem_clock_mhz": ("mem_clock_mhz", "memory_clock_mhz", "clocks_max_mem", "clocks_mem"),
    "driver_version": ("driver_version", "driver"),
    "cuda_version": ("cuda_version", "cuda"),
    "torch_version": ("torch_version", "torch"),
    "triton_version": ("triton_version", "triton"),
}
TOTAL_MEMORY_KEYS = ("total_memory_bytes", "total_memory")
# Readings of the moment, not of the device: a GPU that warms up during a batch is still one device.
VOLATILE_READINGS = ("temperature_gpu", "clocks_sm", "clocks_mem", "pstate", "power_draw")


def device_identity(text: str | None) -> str:
    """A fingerprint without its volatile readings (VOLATILE_READINGS), as canonical JSON: equal
    for two rows of one device, different for two GPUs (their uuids differ). Text that is not a
    JSON object is returned as it is (the ingest refuses it with its reason).

    >>> a = '{"uuid": "u1", "nvidia_smi": {"temperature_gpu": "33", "driver_version": "580"}}'
    >>> device_identity(a) == device_identity(a.replace('"33"', '"41"')), device_identity(a) == device_identity(a.replace("u1", "u2"))
    (True, False)
    """
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return str(text)
    if not isinstance(value, dict):
        return str(text)
    smi = value.get("nvidia_smi")
    if isinstance(smi, dict):
        value = {**value, "nvidia_smi": {k: v for k, v in smi.items() if k not in VOLATILE_READINGS}}
    return json.dumps(value, sort_keys=True)


def flat(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint with its nested "nvidia_smi" object merged in (top level wins)."""
    smi = fingerprint.get("nvidia_smi")
    return {**smi, **fingerprint} if isinstance(smi, dict) else fingerprint


def first(fp: dict[str, Any], keys: tuple[str, ...]) -> Any:
    """The first present value among `keys`.

    >>> first({"name": "NVIDIA H200", "l2_cache_size": 0}, ALIASES["device_name"]), first({"l2_cache_size": 0}, ALIASES["l2_bytes"])
    ('NVIDIA H200', None)
    """
    # 0 and "" mean "unknown" in torch properties (e.g. L2_cache_size on some builds).
    for key in keys:
        if fp.get(key) not in (None, "", 0):
            return fp[key]
    return None


def field(fp: dict[str, Any], name: str) -> Any:
    """The raw value of field `name` (a key of ALIASES) in a flattened fingerprint."""
    return first(fp, ALIASES[name])


def memory_gib(fp: dict[str, Any]) -> float | None:
    """Device memory in GiB: "memory_gb" (GiB) when present, else the total bytes."""
    value = fp.get("memory_gb")
    divide = 1
    if value is None:
        value, divide = first(fp, TOTAL_MEMORY_KEYS), GIB
    try:
        return None if value is None else float(value) / divide
    except (TypeError, ValueError):
        return None
