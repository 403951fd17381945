"""Correctness of kernel sources in sandboxed children: `kernelcast check` and generation use it.

    >>> outcome = check_source("softmax", open("k.py").read())          # doctest: +SKIP
    >>> outcome.ok, outcome.failure_kind, outcome.message               # doctest: +SKIP
    (False, 'incorrect', 'case M=37,N=1000,seed=1: output: 12/37000 elements off ...')

Each source runs on its task's correctness cases in a child process (TRITON_INTERPRET=1 on
CPU) under a wall-clock timeout. Failure kinds: a syntax/import error or a Triton compile
error -> compile_failed; an exception in a case -> runtime_error; a failed check ->
incorrect; no answer in time -> timeout; the child dying (signal, os._exit) -> crashed.
Children are reused across sources until one crashes or times out (then it is replaced);
a kernel module that changes global state could in principle affect later checks in the same
child, which is acceptable for a screening step (the GPU measurement re-checks everything).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path

from pipelines.profiling.sandbox import ChildDied, Sandbox, one_line
from pipelines.profiling.taskload import extra_task_modules


@dataclass(frozen=True)
class CheckOutcome:
    ok: bool
    failure_kind: str | None  # one of formats.FAILURE_KINDS when not ok
    message: str  # one line; "ok" when ok
    seconds: float  # wall time of this check, child start-up excluded


def _known_task(name: str) -> bool:
    from pipelines.tasks import TASK_MODULES

    return name in TASK_MODULES or name in extra_task_modules()


def check_source(task_name: str, source: str, *, timeout_s: float = 60.0, device: str = "cpu") -> CheckOutcome:
    """Check one kernel source against `task_name`'s correctness cases (see module docstring)."""
    return check_sources([(task_name, source)], n_workers=1, timeout_s=timeout_s, device=device)[0]


def check_sources(
    items: Iterable[tuple[str, str]],
    n_workers: int = 2,
    timeout_s: float = 60.0,
    *,
    device: str = "cpu",
    progress: Callable[[int, int], None] | None = None,
    startup_timeout_s: float = 300.0,
) -> list[CheckOutcome]:
    """Check many (task_name, source) pairs over `n_workers` children; outcomes in input order.

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
    workdir = Path(tempfile.mkdtemp(prefix="kernelcast-check-"))
    outcomes: list[CheckOutcome | None] = [None] * len(items)
    queue = deque(range(len(items)))
    pool: list[Sandbox | None] = [None] * max(1, min(n_workers, len(items)))
    config = {"device": device, "parent_pid": os.getpid()}
    start_failures, n_spawned, done = 0, 0, 0

    def finish(i: int, outcome: CheckOutcome) -> None:
        nonlocal done
        outcomes[i] = outcome
        done += 1
        if progress:
            progress(done, len(items))

    def retire(slot: int) -> None:
        pool[slot].kill()
        pool[slot] = None

    try:
        while done < len(items):
            now = time.monotonic()
            for slot, sb in enumerate(pool):
                if sb is None and queue:
                    n_spawned += 1
                    pool[slot] = Sandbox("check", device, config, workdir / "logs" / f"check-{n_spawned:04d}.log")
                elif sb is not None and sb.ready and sb.job is None and queue:
                    i = queue.popleft()
                    task, source = items[i]
                    path = workdir / f"k_{i:06d}_{hashlib.sha1(source.encode()).hexdigest()[:8]}.py"
                    path.write_text(source, encoding="utf-8")
                    sb.send({"type": "job", "job": {"job_id": i, "kernel_id": str(i), "task": task, "path": str(path)}})
                    sb.job, sb.job_started, sb.deadline = i, now, now + timeout_s
            live = {sb.conn: slot for slot, sb in enumerate(pool) if sb is not None}
            for conn in wait(list(live), timeout=0.2):
                slot = live[conn]
                sb = pool[slot]
                try:
                    msg = sb.recv()
                except ChildDied as e:
                    if sb.job is not None:
                        finish(sb.job, CheckOutcome(False, "crashed", one_line(e), time.monotonic() - sb.job_started))
                    else:
                        start_failures += 1
                    retire(slot)
                    continue
                if msg.get("type") == "ready":
                    sb.ready, start_failures = True, 0
                elif msg.get("type") == "fatal":
                    start_failures += 1
                    retire(slot)
                    if start_failures >= 3:
                        raise RuntimeError(one_line(msg.get("error", "check worker failed to start")))
                elif msg.get("type") == "result" and sb.job is not None:
                    ok = bool(msg.get("ok"))
                    finish(sb.job, CheckOutcome(ok, None if ok else msg.get("failure_kind") or "infrastructure",
                                                msg.get("error") or ("ok" if ok else ""), time.monotonic() - sb.job_started))
                    sb.job = None
                    if msg.get("restart"):
                        retire(slot)
            if start_failures >= 3:
                raise RuntimeError("check workers keep dying at start-up; see the logs of a failing run")
            now = time.monotonic()
            for slot, sb in enumerate(pool):
                if sb is None:
                    continue
                if sb.job is not None and now > sb.deadline:
                    finish(sb.job, CheckOutcome(False, "timeout", f"no answer within {timeout_s:.0f} s; worker killed", now - sb.job_started))
                    sb.job = None
                    retire(slot)
                elif not sb.ready and now - sb.started_at > startup_timeout_s:
                    retire(slot)
                    start_failures += 1
    finally:
        for sb in pool:
            if sb is not None:
                sb.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    return [o for o in outcomes if o is not None]
