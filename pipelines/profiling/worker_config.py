"""What a worker run is given: its settings (`WorkerConfig`, one field per command-line flag) and
its batch of kernels (`read_batch`), and the error that stops a run (`WorkerError`).

A module of its own because the command line, the event loop, the measuring service and the
orchestration all read the settings without needing the loop. Standard library and pyarrow only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from pipelines.profiling.results import PROTOCOLS
from pipelines.profiling.sandbox_policy import (
    one_line,
)


class WorkerError(RuntimeError):
    """The run cannot go on (no GPU, the measuring child keeps failing to start, bad batch)."""


@dataclass
class WorkerConfig:
    """Run settings; the CLI flags map one to one."""

    device: str = "cuda"  # "cuda" | "cpu" (Triton interpreter, correctness cases)
    protocol: str = "kernelcast"  # "kernelcast" | "paper" | "gpumode" (see timing.py, docs/protocols.md)
    compile_workers: int = max(1, min(14, (os.cpu_count() or 2) - 2))  # leave cores to parent + timer
    timeout_s: float = 120.0  # per compile job; per measuring phase (a case's check or timing)
    max_reps: int | None = None  # cap on timed calls per case (None: 1000 on GPU, 5 on CPU)
    time_budget_s: float | None = None  # stop cleanly before this much wall time has passed
    limit: int | None = None  # measure at most this many new kernels in this run
    # Re-time a task's reference after this long (drift): a reference's timing drifts by tenths of
    # a percent over minutes, while re-timing every minute took a few percent of the measuring
    # child's time (docs/results/harness.md).
    ref_refresh_s: float = 180.0
    recycle_after: int = 500  # restart the measuring child after this many kernels (modules pile up)
    startup_timeout_s: float = 300.0  # for a child to import torch/triton and init CUDA
    lookahead: int | None = None  # compiled kernels waiting for the timer at most (None: 4 or 8 x workers)
    phased: bool | None = None  # alternate compile and measure phases (None: on for cuda with device inputs)
    # "device" | "meta": what compile children run launchers on (compile_child.COMPILE_INPUTS); None:
    # meta on cuda, device on cpu (Triton's interpreter needs values, so meta buys nothing there)
    compile_inputs: str | None = None
    log_dir: str | None = None  # keep children's stderr logs here (default: a temp dir, deleted)
    progress_every_s: float = 5.0
    min_reps: int | None = None  # timing overrides (GPU only); None keeps timing.TimingSettings
    max_case_s: float | None = None
    rse_target: float | None = None  # stop a case's timed loop once its relative CI is below this
    # reference timings kept across runs (refcache.py): a file path, "off" = none, None =
    # $KERNELCAST_REF_CACHE or ~/.cache/kernelcast/reference-timings.json
    ref_cache: str | None = None
    timed_variants: int | None = None  # input variants timed calls draw from (verify.timed_draws)
    timed_samples: int | None = None  # outputs of timed calls verified per case
    call_times: bool = False  # gpumode: every timed call of both loops into the children's logs (needs log_dir)
    # "task": tasks take turns in runs of 64 kernels, torch.compile ones last (queue_order.py: the
    # input caches do not thrash, a budget-stopped run still covers every task); "given": the batch's order
    order: str = "task"
    # the measuring child's input cache (GiB); None: 30% of the GPU's memory (at least 24 GiB), 24 on the CPU
    input_cache_gib: float | None = None

    def validate(self) -> None:
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"--device must be cuda or cpu, got {self.device!r}")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")
        if self.compile_inputs not in (None, "device", "meta"):
            raise ValueError(f"--compile-inputs must be device or meta, got {self.compile_inputs!r}")
        if self.order not in ("task", "given"):
            raise ValueError(f"--order must be task or given, got {self.order!r}")
        if self.compile_workers < 1 or self.timeout_s <= 0:
            raise ValueError("--compile-workers must be >= 1 and --timeout-s > 0")


def read_batch(path: str | Path) -> list[dict]:
    """The kernels of a batch file (kernel_id, task, source; other columns ignored), deduplicated."""
    try:
        table = pq.read_table(path, columns=["kernel_id", "task", "source"])
    except FileNotFoundError:
        raise WorkerError(f"batch file not found: {path}") from None
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a bad file
        raise WorkerError(f"cannot read batch {path}: {one_line(e)}") from None
    seen: set[str] = set()
    kernels = []
    for row in table.to_pylist():
        if not row["kernel_id"] or row["kernel_id"] in seen:
            continue
        seen.add(row["kernel_id"])
        kernels.append(row)
    return kernels
