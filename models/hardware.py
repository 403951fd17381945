"""The hardware table shown to the surrogate: what the device is, never how fast a kernel ran.

Reads a fingerprint as the profiling worker writes it (torch device properties plus a nested
`nvidia_smi` block) or a row of the warehouse `hardware` table; several key spellings are
accepted for each field (warehouse/fingerprint.py, the one reader). Only the whitelisted fields below reach the
prompt, so a fingerprint carrying anything else (timings included) cannot leak into it.

Memory bandwidth is rarely in a fingerprint (torch does not report it), so a small table of
datasheet values fills it for known devices; an unknown device says "unknown".

>>> print(hardware_table({"name": "NVIDIA H200", "compute_capability": [9, 0], "sm_count": 132}))
| property | value |
|---|---|
| device | NVIDIA H200 |
| compute capability | 9.0 (sm_90) |
| SM count | 132 |
| memory bandwidth | 4.8 TB/s (datasheet) |
"""

from __future__ import annotations

import re
from typing import Any

from warehouse import fingerprint as fingerprint_reader

_MIB = 1024**2

# Datasheet peak DRAM bandwidth, GB/s; first matching pattern wins, so variants come first.
# \b keeps "GH200" from matching H200.
KNOWN_BANDWIDTH_GBPS: tuple[tuple[str, float], ...] = (
    (r"\bB200\b", 8000.0),
    (r"\bH200\b", 4800.0),
    (r"\bH100\b.*\bNVL\b", 3900.0),
    (r"\bH100\b.*\bPCIe\b", 2000.0),
    (r"\bH100\b", 3350.0),  # SXM5 (torch: "NVIDIA H100 80GB HBM3")
    (r"\bA100\b.*80GB.*\bPCIe\b|\bA100\b.*\bPCIe\b.*80GB", 1935.0),
    (r"\bA100\b.*80GB", 2039.0),  # SXM4 (torch: "NVIDIA A100-SXM4-80GB")
    (r"\bA100\b", 1555.0),  # 40 GB
    (r"\bL40S\b", 864.0),
    (r"\bL4\b", 300.0),
    (r"\bA10G?\b", 600.0),
    (r"\bV100\b", 900.0),
    (r"\bT4\b", 320.0),
    (r"\bRTX 4090\b", 1008.0),
)

def _float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def capability_text(value: Any) -> str | None:
    """ "9.0 (sm_90)" from [9, 0], "9.0" or "sm_90".

    >>> capability_text([8, 0]), capability_text("sm_90"), capability_text(None)
    ('8.0 (sm_80)', '9.0 (sm_90)', None)
    """
    if value is None:
        return None
    if isinstance(value, (list, tuple)) and len(value) == 2:
        major, minor = int(value[0]), int(value[1])
    else:
        text = str(value).strip()
        match = re.fullmatch(r"sm_(\d+)(\d)", text) or re.fullmatch(r"(\d+)\.(\d+)", text)
        if not match:
            return text
        major, minor = int(match.group(1)), int(match.group(2))
    return f"{major}.{minor} (sm_{major}{minor})"


def datasheet_bandwidth_gbps(device_name: str | None) -> float | None:
    """Peak DRAM bandwidth of a known device, GB/s; None when unknown.

    >>> datasheet_bandwidth_gbps("NVIDIA H100 80GB HBM3"), datasheet_bandwidth_gbps("NVIDIA GH200 480GB")
    (3350.0, None)
    """
    if not device_name:
        return None
    for pattern, gbps in KNOWN_BANDWIDTH_GBPS:
        if re.search(pattern, device_name):
            return gbps
    return None


def hardware_fields(fingerprint: dict[str, Any]) -> list[tuple[str, str]]:
    """(property, value) rows of the hardware table, absent fields left out.

    Args:
        fingerprint: a profiling fingerprint or a warehouse hardware row.
    Returns:
        Rows in a fixed order: device (always), compute capability, SM count, memory, memory
        bandwidth, L2 cache, SM clock, memory clock.
    """
    fp = fingerprint_reader.flat(fingerprint or {})
    rows: list[tuple[str, str]] = []
    device = fingerprint_reader.field(fp, "device_name")
    rows.append(("device", str(device) if device is not None else "unknown"))
    capability = capability_text(fingerprint_reader.field(fp, "capability"))
    if capability:
        rows.append(("compute capability", capability))
    sms = _float(fingerprint_reader.field(fp, "sm_count"))
    if sms:
        rows.append(("SM count", str(int(sms))))
    mem = fingerprint_reader.memory_gib(fp)
    if mem:
        rows.append(("memory", f"{mem:.1f} GiB"))
    bandwidth = _float(fingerprint_reader.field(fp, "memory_bandwidth_gbps"))
    source = "reported"
    if bandwidth is None:
        bandwidth, source = datasheet_bandwidth_gbps(str(device) if device else None), "datasheet"
    rows.append(
        ("memory bandwidth", f"{bandwidth / 1000:.3g} TB/s ({source})" if bandwidth else "unknown")
    )
    l2 = _float(fingerprint_reader.field(fp, "l2_bytes"))
    if l2:
        rows.append(("L2 cache", f"{l2 / _MIB:.0f} MiB"))
    for label, key in (("SM clock", "sm_clock_mhz"), ("memory clock", "mem_clock_mhz")):
        mhz = _float(fingerprint_reader.field(fp, key))
        if mhz:
            rows.append((label, f"{mhz:.0f} MHz"))
    return rows


def hardware_table(fingerprint: dict[str, Any]) -> str:
    """The hardware as a two-column markdown table for the prompt.

    Args:
        fingerprint: a profiling fingerprint or a warehouse hardware row (see module doc).
    Returns:
        A markdown table; device and bandwidth say "unknown" when nothing is known.
    """
    rows = hardware_fields(fingerprint)
    lines = ["| property | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines)
