"""The hardware fingerprint stored with every result row (hardware_json) and its id.

Read inside the measuring process: torch's device properties, plus nvidia-smi where it
answers (clocks, driver, power limit; seconds at most, never required).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

from warehouse.formats import hardware_id

_SMI_FIELDS = (
    "driver_version",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "clocks.max.mem",
    "power.limit",
    "temperature.gpu",
    "pstate",
)


def _versions() -> dict:
    out = {"python": platform.python_version()}
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda
    except Exception:  # noqa: BLE001 - a fingerprint never fails a run
        pass
    try:
        import triton

        out["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        pass
    return out


def nvidia_smi(index: int = 0, timeout_s: float = 10.0) -> dict:
    """Clocks (MHz), driver, power limit (W), temperature (C) of GPU `index`; {} if unreadable."""
    cmd = ["nvidia-smi", f"--id={index}", f"--query-gpu={','.join(_SMI_FIELDS)}", "--format=csv,noheader,nounits"]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=True)
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [v.strip() for v in res.stdout.strip().splitlines()[0].split(",")] if res.stdout.strip() else []
    return {k.replace(".", "_"): v for k, v in zip(_SMI_FIELDS, values) if v and "N/A" not in v}


def physical_gpu_index(device_index: int = 0) -> int:
    """nvidia-smi's index of torch's device `device_index`: under CUDA_VISIBLE_DEVICES=1 (one
    worker per GPU on a multi-GPU host) torch's device 0 is the host's GPU 1.

    >>> os.environ["CUDA_VISIBLE_DEVICES"] = "1"; physical_gpu_index(0)
    1
    >>> os.environ["CUDA_VISIBLE_DEVICES"] = "GPU-abc"; physical_gpu_index(0)
    0
    >>> del os.environ["CUDA_VISIBLE_DEVICES"]
    """
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if device_index < len(visible) and visible[device_index].isdigit():
        return int(visible[device_index])
    return device_index  # unset, or UUIDs: nvidia-smi's order is the best guess


def cuda_fingerprint(device_index: int = 0) -> dict:
    """Everything we know about the CUDA device: name, capability, SMs, memory, L2, clocks, versions."""
    import torch

    p = torch.cuda.get_device_properties(device_index)
    fp = {
        "kind": "cuda",
        "name": p.name,
        "compute_capability": [p.major, p.minor],
        "sm_count": p.multi_processor_count,
        "total_memory_bytes": int(p.total_memory),
        "l2_cache_bytes": int(getattr(p, "L2_cache_size", 0)),
        "uuid": str(getattr(p, "uuid", "")),
        **_versions(),
    }
    fp["nvidia_smi"] = nvidia_smi(physical_gpu_index(device_index))
    fp["hardware_id"] = hardware_id(p.name, (p.major, p.minor))
    return fp


def cpu_fingerprint() -> dict:
    """The CPU host: results measured in the Triton interpreter, marked hardware_id 'cpu'."""
    return {
        "kind": "cpu",
        "name": platform.processor() or platform.machine(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "platform": sys.platform,
        "interpreter": os.environ.get("TRITON_INTERPRET") == "1",
        **_versions(),
        "hardware_id": hardware_id("cpu", None),
    }


def fingerprint_json(fp: dict) -> str:
    return json.dumps(fp, sort_keys=True)


def host_hardware_id(measure_device: str) -> str | None:
    """The partition this host can measure: its CUDA GPU's type, 'cpu' for interpreter runs."""
    return "cpu" if measure_device == "cpu" else cuda_hardware_id()


def gpu_count(configured: int | None, measure_device: str) -> int:
    """Measuring steps to fan out to: the configured count, else every CUDA device (1 on CPU)."""
    if configured is not None:
        return max(1, configured)
    if measure_device == "cpu":
        return 1
    import torch  # here only: the worker's parent imports this module and stays torch-free

    return max(1, torch.cuda.device_count())


def forecast_gpus(profiling) -> int:
    """Forecasting steps of the downstream run (one per GPU, as for measuring; 1 without CUDA):
    the plan's shard count and the run's process count, from one place."""
    return gpu_count(profiling.gpus, "cuda")


def cuda_hardware_id() -> str | None:
    """The hardware id of this host's GPU, or None without CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        from warehouse.formats import hardware_id

        return hardware_id(torch.cuda.get_device_name(), torch.cuda.get_device_capability())
    except Exception:  # no driver, broken install: no local measuring, not a crash
        return None
