"""The profiling worker: a batch of kernels in, one result row per kernel out.

    python3 -m pipelines.profiling.worker --batch B.parquet --out O.parquet [--device cuda|cpu]
        [--protocol kernelcast|paper|gpumode] [--compile-workers N] [--timeout-s S] [--max-reps R]
        [--time-budget-s T] [--limit K] [--log-dir D] [--summary-json S] [--no-phased]
        [--compile-inputs meta|device] [--order task|given] [--input-cache-gib G]

Pipeline (one parent, many children; the parent never runs kernel code):

    batch --> compile pool (N children, a Triton cache folder per kernel) --> measuring child --> rows
              import + compile for the benchmark       check every case, then time
              shapes without launching (GPU)            kernel and reference in one process
                                                             |  outputs (files)   ^ verdicts
                                                             v                    |
                                                          verifier child (no kernel code)

* Every child that imports kernels runs in the sandbox (sandbox.py / jail.py: own uid as root,
  allow-listed environment, private directory, no network, PID namespace, limits, Landlock);
  the layers the measuring child had go into the row's `sandbox` column, and the worker logs
  one line naming any layer this host cannot provide.
* Verdicts come from the verifier (verify.py), which regenerates each input and computes the
  reference in its own process; the parent holds every job to the verifier's plan and builds
  the row from what it saw itself (audit.py): its own book of reference timings, speedups it
  computes, wall-clock windows no timed phase may exceed. A kernel that patches the harness,
  torch or the timer, or whose claims the parent cannot confirm, is recorded as `tampered`.

* Compile children import the kernel and, on a GPU, run its launcher on every benchmark input
  with Triton launches suppressed: the exact specialisations land in the shared cache while
  the GPU stays free for the timing child. A syntax/import/Triton compile error is
  `compile_failed` here; a child that dies is `crashed`, one that hangs is `timeout`.
* One measuring child owns the GPU: correctness on every benchmark case (and the small
  correctness cases), then timing (cuda_timing.py: L2 flush, launch cover, CUDA events per call,
  adaptive reps). The reference is timed 3 times per task and case when first needed and
  once more every --ref-refresh-s seconds (clock and thermal drift); each row carries the
  median of the last 5 reference timings, the newest at most that old.
* On a GPU host with 4+ cores the measuring children keep two cores to themselves and the
  compile children run on the rest at lower priority, so compiles never delay the launches
  being timed.
* --compile-inputs meta (the default on a GPU): compile children run the launchers on
  shape-only meta tensors, so they put no work and no memory on the GPU and the compile pool
  runs while kernels are timed (unphased); a launcher that cannot run on meta tensors is
  compiled by the measuring child in its warm-up calls instead. It measures more correct
  kernels per GPU-hour than --compile-inputs device (real GPU inputs, phased: compiles and
  timing alternate), with the same repeatability (docs/operating.md, "Measuring on a GPU host").
* A child that crashes, hangs (no progress for --timeout-s) or hits a sticky CUDA error is
  killed and replaced; the kernel gets its failure kind and the batch goes on.
* Kernels are measured in runs of 64 of one task, tasks taking turns, torch.compile kernels last
  (queue_order.py, --order): the input caches of the measuring child and the verifier then
  generate a task's inputs once per run, not once per kernel.
* Rows are appended to <out>.partial.jsonl as they finish; the final Parquet is written at the
  end, or at --time-budget-s, or on Ctrl-C/SIGTERM. Rerunning with the same --out resumes.
* --device cpu: children run Triton's interpreter; correctness and timing (perf_counter, few
  reps) use the task's correctness cases; rows get hardware_id 'cpu'. For tests and CI.

This module is the door: `run_batch` and the command line. The event loop is worker_loop.py, a
run's settings and batch worker_config.py, what it reports run_summary.py.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pipelines.profiling.results import PROTOCOLS, ResultStore
from pipelines.profiling.run_summary import Progress, RunSummary
from pipelines.profiling.worker_config import WorkerConfig, WorkerError, read_batch
from pipelines.profiling.worker_loop import _Run

log = logging.getLogger(__name__)


def run_batch(
    batch_path: str | Path,
    out_path: str | Path,
    config: WorkerConfig | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> RunSummary:
    """Measure every kernel of `batch_path` not yet in `out_path`; write `out_path` (RESULT_SCHEMA).

    Args:
        batch_path: Parquet with kernel_id, task, source (BATCH_SCHEMA; extra columns ignored).
        out_path: result Parquet; with its `.partial.jsonl` beside it, the resume state.
        config: run settings (device, protocol, workers, timeouts, budget, limit).
        progress: called every `config.progress_every_s` seconds with a `Progress`.
    Returns:
        A RunSummary; `summary.table()` is the end-of-run table by task.
    Raises:
        WorkerError when the run cannot go on (the file then holds what was done).
    """
    cfg = config or WorkerConfig()
    cfg.validate()
    kernels = read_batch(batch_path)
    store = ResultStore(out_path, cfg.protocol)
    workdir = Path(tempfile.mkdtemp(prefix="kernelcast-worker-"))
    run = _Run(kernels, store, cfg, workdir, progress)
    stopped = "interrupted"
    try:
        stopped = run.run()
    finally:
        run.close()
        if run.hardware is None and run.pending_rows:
            log.warning("%d failures not recorded: the measuring child never started", len(run.pending_rows))
        store.finalize()
        if not cfg.log_dir:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    return RunSummary(
        out_path=Path(out_path), batch_id=store.batch_id, total=len(kernels), measured_now=run.measured_now,
        rows=list(store.rows.values()), stopped=stopped, elapsed_s=time.monotonic() - run.t0,
        hardware_id=run.hardware["hardware_id"] if run.hardware else None,
        shipped=dict(run.verifier.shipped),
        phases_s={k: round(v, 3) for k, v in sorted((run.phases_s + run.verifier.spent).items())},
        ref_cache={"path": str(run.refcache.path) if run.refcache.path else None,
                   "timings_taken": run.refcache.timed},
    )


# ---- command line ----------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    d = WorkerConfig()
    ap = argparse.ArgumentParser(prog="python3 -m pipelines.profiling.worker", description="Measure a batch of kernels (see module docstring).")
    ap.add_argument("--batch", required=True, help="input Parquet: kernel_id, task, source")
    ap.add_argument("--out", required=True, help="result Parquet (RESULT_SCHEMA); rerun with the same path to resume")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=d.device)
    ap.add_argument("--protocol", choices=PROTOCOLS, default=d.protocol)
    ap.add_argument("--compile-workers", type=int, default=d.compile_workers)
    ap.add_argument("--timeout-s", type=float, default=d.timeout_s, help="per compile job / per measuring step")
    ap.add_argument("--max-reps", type=int, default=None, help="cap on timed calls per case")
    ap.add_argument("--time-budget-s", type=float, default=None, help="stop cleanly before this much wall time")
    ap.add_argument("--limit", type=int, default=None, help="measure at most this many new kernels")
    ap.add_argument("--ref-refresh-s", type=float, default=d.ref_refresh_s,
                    help=f"re-time a task's reference case when its newest timing is older than this (default {d.ref_refresh_s:.0f} s)")
    ap.add_argument("--recycle-after", type=int, default=d.recycle_after)
    ap.add_argument("--log-dir", default=None, help="keep the children's logs here (the temp work dir with the Triton cache is kept too)")
    ap.add_argument("--phased", action=argparse.BooleanOptionalAction, default=None,
                    help="alternate compile and timing phases (default: on for cuda)")
    ap.add_argument("--compile-inputs", choices=("device", "meta"), default=d.compile_inputs,
                    help="what compile children run kernel launchers on: shape-only meta tensors (default on "
                         "cuda: no GPU work in compile children, so compiling overlaps timing) or real inputs "
                         "(default on cpu; on cuda the worker then alternates compile and timing phases)")
    ap.add_argument("--lookahead", type=int, default=None, help="kernels compiled ahead of the timer (chunk size)")
    ap.add_argument("--progress-every-s", type=float, default=d.progress_every_s)
    ap.add_argument("--json", action="store_true", help="print the summary by task as JSON on stdout")
    ap.add_argument("--summary-json", default=None, help="also write the run summary (wall time, counts) here")
    ap.add_argument("--ref-cache", default=None,
                    help="reference timings kept across runs (default: $KERNELCAST_REF_CACHE or "
                         "~/.cache/kernelcast/reference-timings.json; off: none)")
    ap.add_argument("--timed-variants", type=int, default=None,
                    help="input variants the timed calls draw from (default: 8 on cpu, 2 on cuda)")
    ap.add_argument("--timed-samples", type=int, default=None, help="outputs of timed calls verified per case (default: 1 on cpu; on cuda one of each variant, 2); from as many as the variants on, every variant gets the same share")
    ap.add_argument("--call-times", action="store_true",
                    help="diagnostics, gpumode: write every timed call of the kernel's and the reference's loops, "
                         "in the order made, into the children's logs in --log-dir; summarise them with "
                         "`python3 -m benchmarks.call_times LOG_DIR`")
    ap.add_argument("--order", choices=("task", "given"), default=d.order,
                    help="task (default): tasks take turns in runs of 64 kernels, torch.compile kernels last; given: the batch's order")
    ap.add_argument("--min-reps", type=int, default=None, help="timed calls per case at least (GPU; default 3)")
    ap.add_argument("--max-case-s", type=float, default=None, help="wall-clock cap of a case's timed loop (GPU; default 0.3 s)")
    ap.add_argument("--rse-target", type=float, default=None,
                    help="stop a case's timed loop once the statistic's relative 95%% CI half-width is below this "
                         "(GPU; default 0.01)")
    ap.add_argument("--input-cache-gib", type=float, default=None,
                    help="the measuring child's input cache (default: 30%% of the GPU's memory, at least 24 GiB)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.call_times and not args.log_dir:
        ap.error("--call-times writes into the children's logs: give --log-dir to keep them")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    cfg = WorkerConfig(
        device=args.device, protocol=args.protocol, compile_workers=args.compile_workers, timeout_s=args.timeout_s,
        max_reps=args.max_reps, time_budget_s=args.time_budget_s, limit=args.limit, ref_refresh_s=args.ref_refresh_s,
        recycle_after=args.recycle_after, log_dir=args.log_dir, progress_every_s=args.progress_every_s,
        phased=args.phased, lookahead=args.lookahead, compile_inputs=args.compile_inputs,
        ref_cache=args.ref_cache, timed_variants=args.timed_variants, timed_samples=args.timed_samples,
        call_times=args.call_times, order=args.order, input_cache_gib=args.input_cache_gib,
        min_reps=args.min_reps, max_case_s=args.max_case_s, rse_target=args.rse_target,
    )

    def on_term(signum, frame):  # SIGTERM: finish like Ctrl-C, writing the final file
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        summary = run_batch(args.batch, args.out, cfg, progress=lambda p: print(p.line(), file=sys.stderr, flush=True))
    except (WorkerError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: partial results kept in {args.out}; rerun to resume", file=sys.stderr)
        return 130
    report = {
        "out": str(summary.out_path), "batch_id": summary.batch_id, "stopped": summary.stopped,
        "elapsed_s": summary.elapsed_s, "measured_now": summary.measured_now, "total": summary.total,
        "shipped": summary.shipped, "phases_s": summary.phases_s, "ref_cache": summary.ref_cache,
        "hardware_id": summary.hardware_id, "config": cfg.__dict__, "by_task": summary.by_task(),
    }
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(report, indent=2, default=str))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(summary.table())
        if summary.shipped:
            print(f"checked outputs: {summary.shipped.get('ipc', 0)} over CUDA IPC, {summary.shipped.get('file', 0)} as files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
