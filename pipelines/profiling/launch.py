"""Run the GPU worker as a child process (the pipeline never runs untrusted kernels itself)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)


def run_worker(batch: Path, out: Path, *, device: str = "cuda", timeout_s: float = 120.0,
               compile_workers: int = 8, time_budget_s: float | None = None) -> int:
    """`python -m pipelines.profiling.worker` on a batch file; returns its exit code.

    The worker writes `out` incrementally and resumes on a rerun, so a failed call loses at most
    the kernel in flight.
    """
    cmd = [sys.executable, "-m", "pipelines.profiling.worker", "--batch", str(batch), "--out", str(out),
           "--device", device, "--timeout-s", str(timeout_s), "--compile-workers", str(compile_workers)]
    if time_budget_s:
        cmd += ["--time-budget-s", str(time_budget_s)]
    log.info("running %s", " ".join(cmd))
    return subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2], check=False).returncode


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
