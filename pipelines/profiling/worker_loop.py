"""The worker's event loop: compile children, the measuring child and the verifier, one row per kernel.

`_Run` owns the children of one run (sandbox.py): it hands kernels to the compile pool, then to the
measuring child, forwards the children's verdict requests to the verifier (verdicts.VerifierLink),
watches their deadlines, memory and processes, replaces a child that dies or hangs, and builds each
row from what the parent saw itself (audit.py) before the result store appends it. worker.py
describes the pipeline and is its door (`run_batch`, the command line); the measuring service
(service.py) runs the same loop on the jobs of its queue. The parent never imports a kernel, so
this module stays torch-free.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter, deque
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path

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
from pipelines.profiling.results import ResultStore, now_utc, pairs_reference
from pipelines.profiling.run_summary import Progress
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
from pipelines.profiling.worker_config import WorkerConfig, WorkerError
from warehouse.formats import FAILURE_KINDS, HARNESS_VERSION

NEEDS_RECHECK_ABOVE = 10.0  # speedups above this are flagged for a re-measure
TRITON_DIR_KEY = "_triton_dir"  # a kernel's own Triton cache folder, while the run holds it
OOM_RETRY_KEY = "_after_out_of_memory"  # a kernel measured again after running out of GPU memory
LIMIT_SCAN_S = 0.5  # how often the parent reads /proc for the children's memory and processes

log = logging.getLogger(__name__)


def given_order_warning(kernels: list[dict]) -> str | None:
    """What a batch measured in its own order (`--order given`) will cost, when it costs: each task
    switch makes the input caches draw that task's inputs again (about a second a case, in the
    measuring child and the verifier alike), and a torch.compile kernel before others holds the
    GPU idle while Inductor compiles (docs/results/harness.md, harness 15 on the H100: what such
    a batch cost). None when the order is cheap.

    >>> given_order_warning([{"task": t, "source": ""} for t in "ab" * 40]).startswith("--order given: the batch switches task 79 times")
    True
    >>> given_order_warning([{"task": t, "source": ""} for t in "a" * 40 + "b" * 40]) is None
    True
    """
    switches = sum(a["task"] != b["task"] for a, b in zip(kernels, kernels[1:]))
    compiled = [uses_torch_compile(k.get("source")) for k in kernels]
    last_plain = max((i for i, c in enumerate(compiled) if not c), default=-1)
    early = sum(compiled[:last_plain])  # torch.compile kernels before the last plain one
    parts = []
    if switches > max(8, len(kernels) // (TASK_CHUNK // 4)):
        parts.append(f"the batch switches task {switches} times in {len(kernels)} kernels, and each switch "
                     "draws that task's inputs again")
    if early:
        parts.append(f"{early} torch.compile kernels come before plain ones (Inductor compiles in the measuring child)")
    return f"--order given: {'; '.join(parts)} (--order task groups tasks and puts torch.compile last)" if parts else None


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
        if cfg.order == "given" and (warning := given_order_warning(todo)):
            log.warning(warning)
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
                    "kernel_host_ms", "ref_host_ms", "program_speedup", "launch_bound", "autotune_json"):
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
