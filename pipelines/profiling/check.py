"""Correctness of kernel sources in sandboxed children: `kernelcast check` and generation use it.

    >>> outcome = check_source("softmax", open("k.py").read())          # doctest: +SKIP
    >>> outcome.ok, outcome.failure_kind, outcome.message               # doctest: +SKIP
    (False, 'incorrect', 'case M=37,N=1000,seed=1: output: 12/37000 elements off ...')

Each source runs on its task's correctness cases in a sandboxed child (sandbox.py: its own uid,
no network, private directory, limits; TRITON_INTERPRET=1 on CPU) under a wall-clock timeout;
its outputs are judged by a verifier child it never ran in (verify.py). Failure kinds: a
syntax/import error or a Triton compile error -> compile_failed; an exception in a case ->
runtime_error; a failed check -> incorrect; no answer in time -> timeout; the child dying
(signal, os._exit, a limit) -> crashed; a patched harness, torch or verdict, a message on the
channel the harness never sends (too long, too deep, a second "ready"), or a process or thread
left running after the job -> tampered.
Children are reused across sources until one crashes, times out or is tampered with (then it
is replaced); `outcome.sandbox` names the layers the checking child had.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path

from pipelines.profiling.processes import scan_processes
from pipelines.profiling.sandbox import ChildDied, Sandbox, deliver
from pipelines.profiling.sandbox_policy import SandboxPolicy, make_traversable, one_line
from pipelines.profiling.taskload import extra_task_modules
from pipelines.profiling.verdicts import VerifierLink, settle

LIMIT_SCAN_S = 0.2  # how often the parent reads /proc for the children's memory and processes


@dataclass(frozen=True)
class CheckOutcome:
    ok: bool
    failure_kind: str | None  # one of formats.FAILURE_KINDS when not ok
    message: str  # one line; "ok" when ok
    seconds: float  # wall time of this check, child start-up excluded
    sandbox: str = ""  # the sandbox layers of the child that ran it (jail.py names them)


def _known_task(name: str) -> bool:
    from pipelines.tasks import TASK_MODULES

    return name in TASK_MODULES or name in extra_task_modules()


def check_source(task_name: str, source: str, *, timeout_s: float = 60.0, device: str = "cpu",
                 policy: SandboxPolicy | None = None) -> CheckOutcome:
    """Check one kernel source against `task_name`'s correctness cases (see module docstring)."""
    return check_sources([(task_name, source)], n_workers=1, timeout_s=timeout_s, device=device, policy=policy)[0]


def check_sources(
    items: Iterable[tuple[str, str]],
    n_workers: int = 2,
    timeout_s: float = 60.0,
    *,
    device: str = "cpu",
    progress: Callable[[int, int], None] | None = None,
    startup_timeout_s: float = 300.0,
    policy: SandboxPolicy | None = None,
) -> list[CheckOutcome]:
    """Check many (task_name, source) pairs over `n_workers` children; outcomes in input order.

    Args:
        items: (task name, kernel source) pairs.
        n_workers: checking children at a time.
        timeout_s: per source, from dispatch to verdict.
        device: "cpu" (Triton interpreter) or "cuda".
        progress: called as progress(done, total).
        startup_timeout_s: for a child to import its stack.
        policy: sandbox layers and limits (default: sandbox.policy_from_env()).
    Raises:
        ValueError: an unknown task name or device.
        RuntimeError: the children cannot start (3 failures in a row).
    """
    items = list(items)
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    for name in {t for t, _ in items}:
        if not _known_task(name):
            raise ValueError(f"unknown task {name!r}")
    if not items:
        return []
    return _CheckRun(items, n_workers, timeout_s, device, progress, startup_timeout_s, policy).run()


class _CheckRun:
    """The event loop of one check_sources call."""

    def __init__(self, items, n_workers, timeout_s, device, progress, startup_timeout_s, policy):
        self.items, self.timeout_s, self.device, self.progress = items, timeout_s, device, progress
        self.startup_timeout_s, self.policy = startup_timeout_s, policy
        self.workdir = Path(tempfile.mkdtemp(prefix="kernelcast-check-"))
        make_traversable(self.workdir)
        self.outcomes: list[CheckOutcome | None] = [None] * len(items)
        self.queue = deque(range(len(items)))
        self.pool: list[Sandbox | None] = [None] * max(1, min(n_workers, len(items)))
        self.config = {"device": device, "parent_pid": os.getpid()}
        self.start_failures, self.n_spawned, self.done = 0, 0, 0
        self.keys = itertools.count(1)
        self.verifier = VerifierLink(lambda: self._spawn("verify", jailed=False))
        self.last_scan = 0.0

    def _spawn(self, role: str, jailed: bool = True) -> Sandbox:
        self.n_spawned += 1
        log = self.workdir / "logs" / f"{role}-{self.n_spawned:04d}.log"
        return Sandbox(role, self.device, self.config, log, policy=self.policy, jailed=jailed)

    def finish(self, i: int, outcome: CheckOutcome) -> None:
        self.outcomes[i] = outcome
        self.done += 1
        if self.progress:
            self.progress(self.done, len(self.items))

    def retire(self, slot: int) -> None:
        self.pool[slot].kill()
        self.pool[slot] = None

    def _fail_job(self, slot: int, kind: str, message: str) -> None:
        sb = self.pool[slot]
        self.verifier.outcome(sb.job_key)
        self.finish(sb.job, CheckOutcome(False, kind, one_line(message), time.monotonic() - sb.job_started, sb.layers))
        sb.job = None
        self.retire(slot)

    def _dispatch(self, now: float) -> None:
        for slot, sb in enumerate(self.pool):
            if sb is None and self.queue:
                self.pool[slot] = self._spawn("check")
            elif sb is not None and sb.ready and sb.job is None and self.queue:
                i = self.queue.popleft()
                task, source = self.items[i]
                path = self.workdir / f"k_{i:06d}_{hashlib.sha1(source.encode()).hexdigest()[:8]}.py"
                path.write_text(source, encoding="utf-8")
                os.chmod(path, 0o644)
                sb.job_key = f"check-{next(self.keys)}"
                sb.send({"type": "job", "job": {"job_id": i, "kernel_id": str(i), "task": task, "path": str(path)}})
                sb.job, sb.job_started, sb.deadline = i, now, now + self.timeout_s

    def _on_child(self, slot: int) -> None:
        sb = self.pool[slot]
        try:
            msg = sb.recv()
        except ChildDied as e:  # a refused message (RefusedMessage) is the kernel's: tampered
            if sb.job is not None:
                self._fail_job(slot, e.failure_kind, str(e))
            else:
                self.start_failures += 1
                self.retire(slot)
            return
        kind = msg.get("type")
        if kind == "ready":
            problem = sb.accept_ready(msg)
            if problem is None:
                self.start_failures = 0
            elif sb.job is not None:
                self._fail_job(slot, "tampered", problem)
            else:
                self.retire(slot)
        elif kind == "fatal":
            self.start_failures += 1
            self.retire(slot)
            if self.start_failures >= 3:
                raise RuntimeError(one_line(msg.get("error", "check worker failed to start")))
        elif kind == "verify" and sb.job is not None:
            task = self.items[sb.job][0]
            reply = self.verifier.forward(sb, sb.job_key, "check", task, msg)
            if reply is not None:
                deliver(sb, reply, self.pool)
        elif kind == "result" and sb.job is not None:
            result = settle(msg, self.verifier.outcome(sb.job_key))
            leftover, blamed = sb.leftovers(msg.get("python_threads_left"))
            if leftover and blamed:  # a process or thread the kernel started is still running: ended with the child below
                result = {**result, "status": "failed", "failure_kind": "tampered", "restart": True, "error": leftover}
            elif leftover:  # a native thread: not surely the kernel's, but no later kernel may share the child
                result = {**result, "restart": True}
            ok = result.get("status") == "ok"
            message = result.get("error") or ("ok" if ok else "")
            self.finish(sb.job, CheckOutcome(ok, None if ok else result.get("failure_kind") or "infrastructure",
                                             one_line(message), time.monotonic() - sb.job_started, sb.layers))
            sb.job = None
            if msg.get("restart") or result.get("restart") or not ok and result.get("failure_kind") == "tampered":
                self.retire(slot)

    def _deadlines(self) -> None:
        now = time.monotonic()
        scan = None
        if now - self.last_scan >= LIMIT_SCAN_S and any(sb is not None and sb.job is not None for sb in self.pool):
            scan, self.last_scan = scan_processes(), now
        for slot, sb in enumerate(self.pool):
            if sb is None:
                continue
            if sb.job is not None and now > sb.deadline:
                self._fail_job(slot, "timeout", f"no answer within {self.timeout_s:.0f} s; worker killed")
            elif sb.job is not None and scan is not None and (reason := sb.over_limits(scan)):
                self._fail_job(slot, "crashed", f"killed: {reason}")
            elif not sb.ready and now - sb.started_at > self.startup_timeout_s:
                self.retire(slot)
                self.start_failures += 1

    def run(self) -> list[CheckOutcome]:
        try:
            while self.done < len(self.items):
                self._dispatch(time.monotonic())
                live = {sb.conn: slot for slot, sb in enumerate(self.pool) if sb is not None}
                conns = list(live)
                if self.verifier.conn is not None:
                    conns.append(self.verifier.conn)
                for conn in wait(conns, timeout=0.2):
                    if conn is self.verifier.conn:
                        self.verifier.relay(self.pool)
                    elif conn in live and self.pool[live[conn]] is not None:
                        self._on_child(live[conn])
                if self.start_failures >= 3:
                    raise RuntimeError("check workers keep dying at start-up; see the logs of a failing run")
                self._deadlines()
        finally:
            for sb in self.pool:
                if sb is not None:
                    sb.kill()
            self.verifier.close()
            shutil.rmtree(self.workdir, ignore_errors=True)
        return [o for o in self.outcomes if o is not None]
