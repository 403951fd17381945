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
  correctness cases), then timing (timing.py: L2 flush, launch cover, CUDA events per call,
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
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

import pyarrow.parquet as pq

from pipelines.profiling.audit import (
    REF_KEEP,
    PhaseClock,
    ReferenceBook,
    audit_claims,
    timing_fields,
)
from pipelines.profiling.hardware import fingerprint_json
from pipelines.profiling.layer_probe import probe
from pipelines.profiling.processes import scan_processes
from pipelines.profiling.queue_order import TASK_CHUNK, order_kernels, uses_torch_compile
from pipelines.profiling.refcache import RefCache, default_path
from pipelines.profiling.results import PROTOCOLS, ResultStore, now_utc, pairs_reference
from pipelines.profiling.sandbox import ChildDied, Sandbox, deliver
from pipelines.profiling.sandbox_policy import (
    kernel_cache_dir,
    make_traversable,
    one_line,
    policy_from_env,
    prepare_shared_dir,
    read_only_triton_cache,
    seal_dir,
)
from pipelines.profiling.verdicts import VerifierLink, settle
from warehouse.formats import FAILURE_KINDS, HARNESS_VERSION

NEEDS_RECHECK_ABOVE = 10.0  # speedups above this are flagged for a re-measure
TRITON_DIR_KEY = "_triton_dir"  # a kernel's own Triton cache folder, while the run holds it
OOM_RETRY_KEY = "_after_out_of_memory"  # a kernel measured again after running out of GPU memory
LIMIT_SCAN_S = 0.5  # how often the parent reads /proc for the children's memory and processes

log = logging.getLogger(__name__)


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


@dataclass
class Progress:
    """What the progress callback sees."""

    done: int  # rows in the output, this run and earlier attempts
    total: int  # kernels in the batch
    ok: int
    failed: int
    rate_per_s: float  # kernels finished per second in this run
    eta_s: float | None
    compiling: int
    waiting: int  # compiled, waiting for the timer

    def line(self) -> str:
        eta = "?" if self.eta_s is None else _fmt_s(self.eta_s)
        return (
            f"[profile] {self.done}/{self.total} done (ok {self.ok}, failed {self.failed}), "
            f"{self.rate_per_s:.2f} kernels/s, ETA {eta}, compiling {self.compiling}, waiting {self.waiting}"
        )


@dataclass
class RunSummary:
    out_path: Path
    batch_id: str
    total: int
    measured_now: int
    rows: list[dict] = field(repr=False, default_factory=list)
    stopped: str = "complete"  # "complete" | "time budget" | "limit" | "interrupted"
    elapsed_s: float = 0.0
    hardware_id: str | None = None
    shipped: dict[str, int] = field(default_factory=dict)  # checked outputs by how they came: ipc | file
    phases_s: dict[str, float] = field(default_factory=dict)  # the measuring child's (and verifier_*: the verifier's) seconds by phase, summed
    ref_cache: dict[str, object] = field(default_factory=dict)  # the reference cache's file and use

    def by_task(self) -> dict[str, dict]:
        """{task: {"ok": n, "failed": {kind: n}, "median_speedup": x}} over all rows."""
        out: dict[str, dict] = {}
        for r in self.rows:
            t = out.setdefault(r["task"], {"ok": 0, "failed": Counter(), "speedups": []})
            if r["status"] == "ok":
                t["ok"] += 1
                t["speedups"].append(r["speedup"])
            else:
                t["failed"][r["failure_kind"]] += 1
        for t in out.values():
            sp = t.pop("speedups")
            t["median_speedup"] = statistics.median(sp) if sp else None
            t["failed"] = dict(t["failed"])
        return out

    def table(self) -> str:
        """A short text table by task: ok, failures by kind, median speedup."""
        kinds = list(FAILURE_KINDS)
        head = ["task", "ok"] + kinds + ["median_speedup"]
        lines = [head]
        for task, t in sorted(self.by_task().items()):
            ms = t["median_speedup"]
            lines.append([task, str(t["ok"])] + [str(t["failed"].get(k, 0)) for k in kinds] + ["-" if ms is None else f"{ms:.3f}"])
        widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
        text = "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in lines)
        return (
            f"{text}\n{len(self.rows)}/{self.total} kernels in {self.out_path} ({self.stopped}; "
            f"{self.measured_now} this run in {_fmt_s(self.elapsed_s)}; hardware {self.hardware_id})"
        )


def _fmt_s(s: float) -> str:
    s = round(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


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


class _Run:
    """The event loop of one worker run; `run_batch` is the public door."""

    def __init__(self, kernels: list[dict], store: ResultStore, cfg: WorkerConfig, workdir: Path,
                 progress: Callable[[Progress], None] | None):
        self.cfg, self.store, self.workdir, self.progress_cb = cfg, store, workdir, progress
        self.total = len(kernels)
        done = store.done_ids()
        todo = [k for k in kernels if k["kernel_id"] not in done]
        self.limited = cfg.limit is not None and len(todo) > cfg.limit
        todo = todo[: cfg.limit] if cfg.limit is not None else todo
        self.queue = deque(order_kernels(todo, chunk=TASK_CHUNK) if cfg.order == "task" else todo)
        self.keep_warm = False  # the measuring service keeps its measuring child while the queue is empty
        self.last_task: str | None = None  # the task of the kernel measured last
        self.compiled: deque[tuple[dict, float]] = deque()  # (kernel, compile seconds)
        self.pool: list[Sandbox | None] = [None] * cfg.compile_workers
        self.measurer: Sandbox | None = None
        self.spare: Sandbox | None = None  # a started measuring child that takes over after a death
        self.hardware: dict | None = None
        self.pending_rows: list[tuple[dict, dict, float | None]] = []  # until the hardware is known
        self.measured_now = 0
        self.start_failures = 0
        self.n_children = 0
        self.t0 = time.monotonic()
        self.hard_stop = math.inf  # set by run() from the time budget
        self.last_progress = 0.0
        self.measure_s_ema: float | None = None  # seconds per measured kernel, for the budget stop
        # Phases keep compile children off the GPU while it is timing; meta inputs keep them off it
        # altogether, so compiles can overlap the timing.
        self.compile_inputs = cfg.compile_inputs or ("meta" if cfg.device == "cuda" else "device")
        self.phased = cfg.phased if cfg.phased is not None else (cfg.device == "cuda" and self.compile_inputs == "device")
        self.lookahead = cfg.lookahead or (8 if self.phased else 4) * cfg.compile_workers
        self.phase = "compile"
        self.triton_cache = Path(os.environ.get("TRITON_CACHE_DIR") or str(workdir / "triton-cache"))
        self.env_extra = {"TRITON_CACHE_DIR": str(self.triton_cache)}
        self.policy = policy_from_env()
        prepare_shared_dir(self.triton_cache, self.policy)  # the root of the kernels' cache folders
        self.verifier = VerifierLink(lambda: self._spawn("verify", jailed=False))
        # a row of a paired protocol uses the reference timing taken beside the kernel's alone
        self.refbook = ReferenceBook(keep=1 if pairs_reference(cfg.protocol) else REF_KEEP)
        self.refcache = RefCache(default_path(cfg.ref_cache))
        self.phases_s: Counter = Counter()
        self.clock: PhaseClock | None = None  # phases of the measuring child's job in flight
        self.last_scan = 0.0
        self.waited = self.arrived_after = time.monotonic()  # bounds of when a message read now arrived
        self.job_keys = 0
        self.base_config = {
            "device": cfg.device, "protocol": cfg.protocol, "max_reps": cfg.max_reps,
            "ref_refresh_s": cfg.ref_refresh_s, "parent_pid": os.getpid(),
            "min_reps": cfg.min_reps, "max_case_s": cfg.max_case_s, "rse_target": cfg.rse_target,
            "compile_inputs": self.compile_inputs,
            "timed_variants": cfg.timed_variants, "timed_samples": cfg.timed_samples, "call_times": cfg.call_times,
            "input_cache_bytes": int(cfg.input_cache_gib * 2**30) if cfg.input_cache_gib else None,
        }
        (workdir / "kernels").mkdir(parents=True, exist_ok=True)
        make_traversable(workdir, workdir / "kernels")
        # The verifier is not jailed, so it needs no probe: started first, its imports and CUDA
        # set-up run beside the probe's attempts instead of before the first kernel's first check.
        self.verifier.ensure()
        try:
            report = probe(self.policy, cfg.device)
        except BaseException:
            self.verifier.close()
            raise
        log.warning(report.line())  # one line: the layers children get, and what this host lacks

    # ---- children --------------------------------------------------------------------
    def _spawn(self, role: str, jailed: bool = True) -> Sandbox:
        self.n_children += 1
        log_dir = Path(self.cfg.log_dir) if self.cfg.log_dir else self.workdir / "logs"
        if role == "measure":  # reads what the compile children compiled, writes a cache of its own
            env, shared = read_only_triton_cache(self.triton_cache), ()
            prepare_shared_dir(self.triton_cache, self.policy)
        else:
            env, shared = self.env_extra, (self.triton_cache,)
        return Sandbox(role, self.cfg.device, self.base_config, log_dir / f"{role}-{self.n_children:04d}.log",
                       env, policy=self.policy, shared_dirs=shared, jailed=jailed)

    def _children(self) -> list[Sandbox]:
        return [s for s in self.pool + [self.measurer, self.spare] if s is not None]

    def _kernel_file(self, kernel: dict) -> Path:
        import hashlib

        return self.workdir / "kernels" / f"k_{hashlib.sha256(kernel['kernel_id'].encode()).hexdigest()[:20]}.py"

    def _kernel_path(self, kernel: dict) -> str:
        path = self._kernel_file(kernel)
        if not path.exists():
            path.write_text(kernel["source"], encoding="utf-8")
            os.chmod(path, 0o644)  # readable by the sandbox uids, writable by none of them
        return str(path)

    def _job(self, kernel: dict) -> dict:
        return {"job_id": kernel["kernel_id"], "kernel_id": kernel["kernel_id"], "task": kernel["task"], "path": self._kernel_path(kernel),
                "ref_fresh": self.refcache.freshness(kernel["task"], self.cfg.ref_refresh_s),
                "triton_dir": kernel.get(TRITON_DIR_KEY), "after_out_of_memory": bool(kernel.get(OOM_RETRY_KEY))}

    # ---- Triton caches: one folder per kernel ----------------------------------------------
    # A compile job writes its kernel's Triton cache (binaries, launcher) into a folder of its
    # own under the shared root, writable by that compile child's uid alone; once the job is done
    # the folder is sealed (ours, read-only) and the measuring child reads that kernel's folder
    # and no other. So no kernel can leave a compiled kernel or a launcher for another to load.
    def _new_cache_dir(self, kernel: dict, sb: Sandbox) -> None:
        self._drop_cache_dir(kernel)
        kernel[TRITON_DIR_KEY] = str(kernel_cache_dir(self.triton_cache, sb.uid, self.policy.gid))

    def _drop_cache_dir(self, kernel: dict) -> None:
        folder = kernel.pop(TRITON_DIR_KEY, None)
        if folder:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)

    def _retire(self, sb: Sandbox) -> None:
        if sb.job_key is not None:
            self.verifier.outcome(sb.job_key)
            sb.job_key = None
        sb.kill()
        if sb is self.measurer:
            self.measurer = None
        elif sb is self.spare:
            self.spare = None
        else:
            self.pool[self.pool.index(sb)] = None

    # ---- rows ------------------------------------------------------------------------
    def _record(self, kernel: dict, result: dict, compile_s: float | None, sandbox: str = "") -> None:
        if self.hardware is None:
            self.pending_rows.append((kernel, result, compile_s, sandbox))
            return
        hw = self.hardware
        row = {
            "batch_id": self.store.batch_id,
            "kernel_id": kernel["kernel_id"],
            "task": kernel["task"],
            "status": result.get("status", "failed"),
            "failure_kind": result.get("failure_kind"),
            "error": result.get("error"),
            "protocol": self.cfg.protocol,
            "harness_version": HARNESS_VERSION,
            "hardware_id": hw["hardware_id"],
            "hardware_json": fingerprint_json(hw),
            "measured_at": now_utc(),
            "compile_s": compile_s,
            "check_s": result.get("check_s"),
            "time_s": result.get("time_s"),
            "sandbox": sandbox or None,
        }
        for key in ("case_ids", "kernel_median_ms", "kernel_mean_ms", "kernel_stderr_ms", "kernel_reps", "ref_median_ms",
                    "ref_mean_ms", "ref_stderr_ms", "ref_reps", "case_speedups", "speedup", "needs_recheck",
                    "kernel_host_ms", "ref_host_ms", "device_speedup", "launch_bound", "autotune_json"):
            row[key] = result.get(key) if row["status"] == "ok" else None
        if row["status"] != "ok":
            row["status"], row["speedup"] = "failed", None
            row["failure_kind"] = row["failure_kind"] if row["failure_kind"] in FAILURE_KINDS else "infrastructure"
        self.store.append(row)
        self.measured_now += 1
        self._drop_cache_dir(kernel)

    def _fail(self, kernel: dict, kind: str, error: str, compile_s: float | None = None, sandbox: str = "") -> None:
        self._record(kernel, {"status": "failed", "failure_kind": kind, "error": one_line(error)}, compile_s, sandbox)

    def _measured(self, sb: Sandbox, kernel: dict, msg: dict) -> dict:
        """The row fields of a measuring child's result: settled with the verifier, audited
        against the parent's clock, timings from the parent's reference book."""
        now = time.monotonic()
        verdicts = self.verifier.outcome(sb.job_key) if sb.job_key else None
        sb.job_key = None
        clock, self.clock = self.clock or PhaseClock(), None
        problem = audit_claims(msg, clock, now)
        if problem is None and msg.get("ref_new"):
            self.refbook.add(kernel["task"], msg["ref_new"])
            self.refcache.record(kernel["task"], msg["ref_new"])
        self.phases_s["compile_s"] += float(getattr(sb, "compile_s", None) or 0.0)  # in parallel children
        phases = msg.get("phases")
        if isinstance(phases, dict):
            self.phases_s.update({str(k): float(v) for k, v in phases.items()
                                  if isinstance(v, (int, float)) and math.isfinite(v) and v >= 0})
        result = settle(msg, verdicts) if verdicts is not None else dict(msg)
        if problem is not None and result.get("failure_kind") != "infrastructure":
            return {**result, "status": "failed", "failure_kind": "tampered", "error": one_line(problem), "restart": True}
        if result.get("status") == "ok":
            fields = timing_fields(msg, self.refbook, kernel["task"], self.cfg.protocol, verdicts.timed if verdicts else [],
                                   NEEDS_RECHECK_ABOVE)
            if isinstance(fields, str):
                return {**result, "status": "failed", "failure_kind": "tampered", "error": one_line(fields), "restart": True}
            result.update(fields)
        return result

    def _set_hardware(self, info: dict) -> None:
        hw = info.get("hardware")
        if self.hardware is not None or not hw:
            return
        earlier = self.store.hardware_ids()
        if earlier and earlier != {hw["hardware_id"]}:
            raise WorkerError(f"{self.store.out_path} holds results from {', '.join(sorted(earlier))}, "
                              f"this device is {hw['hardware_id']}: use another --out")
        if self.store.continue_on(fingerprint_json(hw)):
            log.info("resuming on another device than the rows of %s were measured on: new batch %s",
                     self.store.out_path, self.store.batch_id)
        self.hardware = hw
        for task, timings in self.refcache.bind(hw["hardware_id"], HARNESS_VERSION, self.cfg.protocol).items():
            self.refbook.add(task, timings)
        pending, self.pending_rows = self.pending_rows, []
        for kernel, result, compile_s, sandbox in pending:
            self._record(kernel, result, compile_s, sandbox)

    # ---- messages ----------------------------------------------------------------------
    def _on_message(self, sb: Sandbox) -> None:
        now = time.monotonic()
        try:
            msg = sb.recv()
        except ChildDied as e:
            self._on_death(sb, str(e), e.failure_kind)
            return
        kind = msg.get("type")
        if kind == "ready":
            problem = sb.accept_ready(msg)  # one per child; a second is kernel code
            if problem is not None:
                self._on_death(sb, problem, "tampered")
                return
            self.start_failures = 0
            if sb.role == "measure":
                self._set_hardware(sb.info)
        elif kind == "fatal":
            self._on_death(sb, msg.get("error", "failed to start"))
        elif kind == "progress":
            sb.deadline = now + self.cfg.timeout_s
            sb.phase = str(msg.get("phase", ""))
            if sb is self.measurer and self.clock is not None:
                self.clock.mark(sb.phase, max(self.arrived_after, sb.job_started or 0.0), now)
        elif kind == "verify":
            if sb is self.measurer and sb.job is not None and sb.job_key is not None:
                sb.deadline = now + self.cfg.timeout_s
                reply = self.verifier.forward(sb, sb.job_key, "measure", sb.job["task"], msg)
            else:  # only the measuring child's job has a plan to verify
                reply = {"type": "verdict", "seq": msg.get("seq"), "ok": False}
            if reply is not None:
                deliver(sb, reply, self._children())
        elif kind == "result":
            kernel, sb.job, sb.deadline = sb.job, None, None
            if kernel is None:
                return
            leftover, blamed = sb.leftovers(msg.get("python_threads_left"))
            if leftover and blamed:  # a process or thread the kernel started is still running: ended with the child below
                msg = {**msg, "ok": False, "status": "failed", "failure_kind": "tampered", "restart": True,
                       "error": leftover}
            elif leftover:  # a native thread: not surely the kernel's, but no later kernel may share the child
                msg = {**msg, "restart": True}
            if sb.role == "compile":
                if msg.get("ok"):
                    if msg.get("restart"):  # nothing of the kernel's may run while its folder is sealed
                        self._retire(sb)
                    if kernel.get(TRITON_DIR_KEY):
                        seal_dir(Path(kernel[TRITON_DIR_KEY]))
                    self.compiled.append((kernel, msg.get("seconds")))
                else:
                    self._fail(kernel, msg.get("failure_kind") or "infrastructure", msg.get("error", ""), msg.get("seconds"),
                               sb.layers)
            measured = None
            if sb.role == "measure":
                took = now - sb.job_started
                self.measure_s_ema = took if self.measure_s_ema is None else 0.8 * self.measure_s_ema + 0.2 * took
                msg = self._measured(sb, kernel, msg)
                measured = (kernel, msg, sb.compile_s, sb.layers)
                sb.jobs_done += 1
                if (msg.get("out_of_memory") and msg.get("failure_kind") in ("runtime_error", "infrastructure")
                        and not kernel.get(OOM_RETRY_KEY)):
                    # Out of GPU memory: the harness's caches (the child has just emptied its
                    # own) may be what filled it, so the kernel is measured once more before
                    # the failure is its own.
                    log.info("%s ran out of GPU memory; measuring it once more", kernel["kernel_id"])
                    kernel[OOM_RETRY_KEY] = True
                    self.compiled.appendleft((kernel, sb.compile_s))
                    measured = None
            if (msg.get("restart") or (sb is self.measurer and sb.jobs_done >= self.cfg.recycle_after)) and sb in self._children():
                self._retire(sb)
            if measured is not None:
                # The next kernel goes out (to this child, or to the spare that replaces it) before
                # this one's row is written (an fsync): the write then overlaps the next job
                # instead of holding the measuring child idle.
                self._dispatch(self._out_of_time())
                self._record(*measured)

    def _on_death(self, sb: Sandbox, reason: str, kind: str = "crashed") -> None:
        kernel = sb.job
        if kernel is not None:
            if sb is self.measurer:
                self.clock = None
            self._fail(kernel, kind, reason, getattr(sb, "compile_s", None), sb.layers)
        elif not sb.ready:
            self._on_start_failure(sb, reason)
        self._retire(sb)

    def _on_start_failure(self, sb: Sandbox, reason: str) -> None:
        self.start_failures += 1
        if self.start_failures >= 3 or (sb is self.measurer and self.hardware is None and "failed to start" in reason):
            raise WorkerError(one_line(reason))

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        scan = None
        if now - self.last_scan >= LIMIT_SCAN_S and any(sb.job is not None for sb in self._children()):
            scan, self.last_scan = scan_processes(), now
        for sb in self._children():
            if sb.job is not None and sb.deadline is not None and now > sb.deadline:
                kernel = sb.job
                last = getattr(sb, "phase", "") or ""
                what = (f"compiling{f' (last step: {last})' if last else ''}" if sb.role == "compile"
                        else f"measuring (last step: {last or 'start'})")
                sb.job = None
                if sb is self.measurer:
                    self.clock = None
                layers = sb.layers
                self._retire(sb)
                self._fail(kernel, "timeout", f"no progress for {self.cfg.timeout_s:.0f} s while {what}; worker killed",
                           getattr(sb, "compile_s", None), layers)
            elif sb.job is not None and scan is not None and (reason := sb.over_limits(scan)):
                kernel, sb.job, layers = sb.job, None, sb.layers
                if sb is self.measurer:
                    self.clock = None
                self._retire(sb)
                self._fail(kernel, "crashed", f"killed: {reason}", getattr(sb, "compile_s", None), layers)
            elif not sb.ready and now - sb.started_at > self.cfg.startup_timeout_s:
                self._retire(sb)
                self._on_start_failure(sb, f"{sb.role} worker did not start within {self.cfg.startup_timeout_s:.0f} s")

    # ---- dispatch ------------------------------------------------------------------------
    def _dispatch(self, stopping: bool) -> None:
        """Hand out work. Phased (default on a GPU): compile a chunk of `lookahead` kernels with
        the timer idle, then time them with the compile pool idle, and so on; compile children
        touch the GPU (inputs, CUDA contexts) and would otherwise share it with timed calls."""
        in_compile = sum(1 for s in self.pool if s is not None and s.job is not None)
        m = self.measurer
        if self.phased:
            if self.phase == "measure" and not self.compiled and (m is None or m.job is None):
                self.phase = "compile"
            if self.phase == "compile" and self.compiled and in_compile == 0 and (
                    len(self.compiled) >= self.lookahead or not self.queue):
                self.phase = "measure"
        allow_compile = not self.phased or self.phase == "compile"
        allow_measure = not self.phased or self.phase == "measure"
        starting = sum(1 for s in self.pool if s is not None and not s.ready)
        for i, sb in enumerate(self.pool):
            if stopping or not allow_compile or not self.queue or len(self.compiled) + in_compile >= self.lookahead:
                break
            if sb is None:
                if starting < len(self.queue):  # no more children than kernels left to compile
                    self.pool[i] = self._spawn("compile")
                    starting += 1
                continue
            if sb.ready and sb.job is None:
                kernel = self.queue.popleft()
                self._new_cache_dir(kernel, sb)
                sb.send({"type": "job", "job": self._job(kernel)})
                sb.job, sb.deadline, sb.phase = kernel, time.monotonic() + self.cfg.timeout_s, ""
                in_compile += 1
        work_left = bool(self.compiled or self.queue or in_compile or self.keep_warm)
        if self.measurer is None and not stopping and work_left:
            # A crash or hang costs a restart; the spare has paid its start-up (imports, CUDA init) already.
            self.measurer, self.spare = (self.spare, None) if self.spare is not None else (self._spawn("measure"), None)
        if self.spare is None and self.measurer is not None and self.measurer.ready and work_left and not stopping:
            self.spare = self._spawn("measure")
        m = self.measurer
        if m is not None and m.ready and m.job is None and self.compiled and not stopping and allow_measure:
            kernel, compile_s = self._next_compiled()
            try:
                m.send({"type": "job", "job": self._job(kernel)})
            except ChildDied as e:
                self.compiled.appendleft((kernel, compile_s))
                self._on_death(m, str(e))
                return
            m.job, m.compile_s, m.phase = kernel, compile_s, ""
            self.job_keys += 1
            m.job_key = f"measure-{self.job_keys}"
            m.job_started = time.monotonic()
            m.deadline = m.job_started + self.cfg.timeout_s
            self.clock = PhaseClock()

    def _next_compiled(self) -> tuple[dict, float]:
        """The next compiled kernel for the timer: one of the task measured last if any waits
        (compiles finish out of order; a task switch costs the input caches their inputs)."""
        for i, (kernel, _) in enumerate(self.compiled):
            if kernel["task"] == self.last_task and not uses_torch_compile(kernel.get("source")):
                item = self.compiled[i]
                del self.compiled[i]
                break
        else:
            item = self.compiled.popleft()
        self.last_task = item[0]["task"]
        return item

    def _intake(self) -> None:
        """New kernels for the queue, once per loop: none in a batch run (the service's door)."""

    def _serving(self) -> bool:
        """Whether to go on while there is nothing to do: never in a batch run."""
        return False

    def _busy(self) -> bool:
        return bool(self.queue or self.compiled or any(s.job is not None for s in self._children()))

    def _emit_progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_progress < self.cfg.progress_every_s:
            return
        self.last_progress = now
        rows = list(self.store.rows.values())
        ok = sum(r["status"] == "ok" for r in rows)
        rate = self.measured_now / max(now - self.t0, 1e-9)
        left = self.total - len(rows)
        info = Progress(len(rows), self.total, ok, len(rows) - ok, rate, left / rate if rate > 0 else None,
                        sum(1 for s in self.pool if s is not None and s.job is not None), len(self.compiled))
        if self.progress_cb:
            self.progress_cb(info)
        log.info(info.line())

    # ---- main loop ---------------------------------------------------------------------
    def _out_of_time(self) -> bool:
        """Whether to stop taking new kernels: the next one would likely not finish in the budget."""
        expected = 2.0 * (self.measure_s_ema or 1.0) + 2.0
        return time.monotonic() + expected > self.hard_stop

    def run(self) -> str:
        budget = self.cfg.time_budget_s
        self.hard_stop = self.t0 + budget - 3.0 if budget else math.inf  # leave time to write the file
        stopped = "complete"
        while True:
            now = time.monotonic()
            stopping = self._out_of_time()
            self._intake()
            self._dispatch(stopping)
            if not self._busy() and not self._serving():
                break
            m = self.measurer
            if stopping and (m is None or m.job is None):
                stopped = "time budget"
                break
            if now >= self.hard_stop:
                if m is not None and m.job is not None:
                    m.job = None  # not recorded: a resumed run measures it again
                    self._retire(m)
                stopped = "time budget"
                break
            conns = {s.conn: s for s in self._children()}
            deadlines = [s.deadline for s in self._children() if s.deadline is not None] + [self.hard_stop, now + 0.5]
            timeout = max(0.01, min(deadlines) - now)
            waitable = list(conns) + ([self.verifier.conn] if self.verifier.conn is not None else [])
            ready = wait(waitable, timeout=timeout) if waitable else []
            # A message read now arrived after the previous wait returned (we read every queued
            # message then): the earliest time the parent's clock can give it.
            self.arrived_after, self.waited = self.waited, time.monotonic()
            for conn in ready:
                if conn is self.verifier.conn:
                    self.verifier.relay(self._children())
                    continue
                sb = conns.get(conn)
                while sb in self._children():  # not retired by an earlier message of this round
                    self._on_message(sb)
                    if not sb.poll(0):
                        break
            self._check_deadlines()
            self._emit_progress()
        if stopped == "complete" and self.limited:
            stopped = "limit"
        self._emit_progress(force=True)
        return stopped

    def close(self) -> None:
        """Busy children are killed at once; idle ones are asked to exit, then killed if slow."""
        children = self._children()
        for sb in children:
            if sb.job is not None or not sb.ready:
                sb.kill()
            else:
                try:
                    sb.send({"type": "exit"})
                except ChildDied:
                    pass
        end = time.monotonic() + 3.0
        for sb in children:
            while sb.alive() and time.monotonic() < end:
                time.sleep(0.02)
            sb.kill()
        self.pool, self.measurer, self.spare = [None] * len(self.pool), None, None
        self.verifier.close()


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
