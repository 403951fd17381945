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

    When a measuring service runs on this GPU's queue (`kernelcast serve-measure`), the batch
    goes to it instead (start-up and reference timings already paid); without one, or when it
    goes away, the one-shot worker runs; when it refuses the batch or is too slow, the exit
    code is 1 (a worker beside it would share the GPU). The worker writes `out` incrementally and
    resumes on a rerun, so a failed call loses at most the kernel in flight.
    """
    served = _via_service(Path(batch), Path(out), device, time_budget_s)
    if served is not None:
        return served
    cmd = [sys.executable, "-m", "pipelines.profiling.worker", "--batch", str(batch), "--out", str(out),
           "--device", device, "--timeout-s", str(timeout_s), "--compile-workers", str(compile_workers)]
    if time_budget_s:
        cmd += ["--time-budget-s", str(time_budget_s)]
    log.info("running %s", " ".join(cmd))
    return subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2], check=False).returncode


def _via_service(batch: Path, out: Path, device: str, time_budget_s: float | None) -> int | None:
    """The batch's unmeasured kernels through the running measuring service into `out`; 0, or
    None when no service took them (the caller runs the worker)."""
    from pipelines.profiling import service_queue as sq

    if not sq.running(device=device):
        return None
    from pipelines.profiling.results import ResultStore
    from pipelines.profiling.worker_config import WorkerError, read_batch

    try:
        kernels = read_batch(batch)
        store = ResultStore(out, "kernelcast")
    except (WorkerError, ValueError) as e:
        log.warning("measuring service not used: %s", e)
        return None
    todo = [k for k in kernels if k["kernel_id"] not in store.done_ids()]
    try:
        # No fixed limit from the caller: an hour, and 30 s a kernel beyond it (the worker's own timeouts apply).
        rows = sq.submit(todo, device=device, protocol="kernelcast",
                         timeout_s=time_budget_s or 3600.0 + 30.0 * len(todo)) if todo else []
    except sq.ServiceUnavailable as e:  # it went away: the GPU is free for a worker
        store.close()
        log.warning("%s; running the worker instead", e)
        return None
    except sq.ServiceError as e:  # it holds the GPU (another protocol, slow): a worker beside it would share it
        store.close()
        log.error("the measuring service did not measure %s: %s", batch, e)
        return 1
    for row in rows:
        store.append({**row, "batch_id": store.batch_id})
    store.finalize()
    log.info("measured %d kernels of %s through the measuring service", len(rows), batch)
    return 0
