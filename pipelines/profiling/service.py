"""The warm measuring service: one long-lived profiling worker per GPU, fed from a private queue.

    python3 -m pipelines.profiling.service [--queue Q] [--device cuda|cpu] [--protocol P]
        [--compile-workers N] [--timeout-s S] [--max-reps R] [--ref-refresh-s S] [--ref-cache F]
        [--log-dir D] [--stop-grace-s S]
    python3 -m pipelines.profiling.service --status [--queue Q]     the running service's status JSON
    python3 -m pipelines.profiling.service --stop [--queue Q]       ask it to stop, wait until it has

A worker run pays its start-up (the sandbox probe, torch, CUDA and the children's imports) and
its reference timings (on the H200 together about 55 s) before its first row, so a live search
that measured each round with a worker run of its own stopped after two rounds. The service
pays them once: it is the worker's own event loop (worker_loop._Run: the same compile pool,
measuring child, verifier, sandbox, audits, reference book and cache, failure kinds, child
replacement after a crash, hang or tampering) kept alive while its queue is empty, taking the
kernels of each job a client drops into its folder (service_queue.py) and writing the job's
rows beside it when the last of them is measured. References are re-timed on the worker's drift
schedule (--ref-refresh-s) as kernels of a task come in; the measuring child is replaced after
--recycle-after kernels by the spare, which has paid its start-up already.

Kernels of all open jobs are queued grouped by task (the task measured now first), torch.compile
kernels last (queue_order.py). A kernel id is only unique within its job, so each kernel is
queued under an id of its own and its row gets the client's id back.

Stopping (SIGTERM, SIGINT, or the stop file `<queue>/stop`): no more jobs are taken; the kernel
being measured finishes if it does within --stop-grace-s, else it is abandoned (its child
killed); every job not yet complete goes back to the queue for the next service (its waiting
client sees the service gone and withdraws it); the lock is removed. Exit status 0, or 2 when
the service could not start or go on (a one-line error).

`--device cpu` runs the children on Triton's interpreter (tests, CPU hosts). Imports only the
standard library, numpy, torch, triton and pyarrow, through the worker.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.profiling import service_queue as sq
from pipelines.profiling.queue_order import order_kernels
from pipelines.profiling.results import PROTOCOLS
from pipelines.profiling.sandbox_policy import one_line
from pipelines.profiling.worker_config import WorkerConfig, WorkerError
from pipelines.profiling.worker_loop import _Run
from warehouse.formats import HARNESS_VERSION

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often the queue folder is listed
STATUS_EVERY_S = 2.0  # how often status.json is rewritten
MAX_KERNELS_PER_JOB = 20_000
STALE_ROWS_S = 24 * 3600.0  # rows no client collected are removed after this long


@dataclass
class _Job:
    job_id: str
    taken: Path  # jobs/<id>.taken
    remaining: set[str]  # internal ids not measured yet
    rows: list[dict] = field(default_factory=list)
    taken_at: float = field(default_factory=time.monotonic)


class JobStore:
    """What _Run records rows into (the ResultStore interface it uses), routing rows to jobs."""

    def __init__(self, queue: Path, protocol: str):
        self.queue, self.protocol = queue, protocol
        self.out_path = queue / sq.JOBS
        self.batch_id = uuid.uuid4().hex
        self.rows: dict[str, dict] = {}  # unused: the service reports its own progress
        self.jobs: dict[str, _Job] = {}
        self.owner: dict[str, tuple[str, str]] = {}  # internal id -> (job id, the client's kernel id)
        self.counts: Counter = Counter()  # rows by status over the service's life
        self.on_finish = None  # called before a job's rows are written (the service's status first)

    def done_ids(self) -> set[str]:
        return set()

    def hardware_ids(self) -> set[str]:
        return set()

    def continue_on(self, fingerprint: str) -> bool:
        return False  # a service keeps no rows of earlier runs: every job's rows are of this device

    def add(self, job: _Job, internal_id: str, kernel_id: str) -> None:
        self.owner[internal_id] = (job.job_id, kernel_id)
        job.remaining.add(internal_id)

    def append(self, row: dict) -> None:
        owner = self.owner.pop(row["kernel_id"], None)
        if owner is None:  # a job already returned to the queue
            return
        job_id, kernel_id = owner
        job = self.jobs.get(job_id)
        if job is None:
            return
        self.counts[row["status"]] += 1
        job.remaining.discard(row["kernel_id"])
        job.rows.append({**row, "kernel_id": kernel_id, "batch_id": job_id})
        if not job.remaining:
            self.finish(job)

    def finish(self, job: _Job, error: str | None = None) -> None:
        if self.on_finish is not None:
            self.on_finish()
        try:
            sq.write_atomic(self.out_path / f"{job.job_id}.rows",
                            {"format": sq.FORMAT, "job_id": job.job_id, "rows": job.rows, "error": error,
                             "service_pid": os.getpid(), "harness_version": HARNESS_VERSION})
            job.taken.unlink(missing_ok=True)
        except OSError as e:  # a full disk, the folder removed: this job's client times out, the service goes on
            log.error("measuring service: rows of job %s not written: %s", job.job_id, one_line(e))
        self.jobs.pop(job.job_id, None)

    def give_back(self) -> int:
        """Every open job back to the queue (taken -> job); how many."""
        n = 0
        for job in list(self.jobs.values()):
            with contextlib.suppress(OSError):
                os.replace(job.taken, job.taken.with_suffix(".job"))
                n += 1
            for internal in job.remaining:
                self.owner.pop(internal, None)
        self.jobs.clear()
        return n

    def finalize(self) -> None:  # the batch worker's end-of-run file: nothing here
        return None


class _ServiceRun(_Run):
    """The worker's loop, kept alive and fed from the queue folder."""

    def __init__(self, queue: Path, cfg: WorkerConfig, workdir: Path, stop_grace_s: float):
        self.queue_dir = queue
        self.jobstore = JobStore(queue, cfg.protocol)
        super().__init__([], self.jobstore, cfg, workdir, None)
        self.keep_warm = True
        self.stop_reason: str | None = None
        self.stop_grace_s = stop_grace_s
        self.stop_at: float | None = None
        self.last_poll = 0.0
        self.last_status = 0.0
        self.started_wall = time.time()
        self.ready_at: float | None = None
        self.pool_warmed = False
        # status.json is current when a client reads its rows (a bench reads both in turn)
        self.jobstore.on_finish = lambda: self.write_status("ready" if self.hardware is not None else "starting")

    # ---- the queue -------------------------------------------------------------------------
    def _intake(self) -> None:
        now = time.monotonic()
        if self.stop_reason is None and (self.queue_dir / sq.STOP).exists():
            self.request_stop("stop file")
        if self.stop_reason is not None:
            self._stopping(now)
            return
        if not self.pool_warmed:  # the compile children start now, not with the first job
            self.pool_warmed = True
            self.pool = [sb or self._spawn("compile") for sb in self.pool]
        if self.ready_at is None and self.hardware is not None:
            self.ready_at = time.time()
        if now - self.last_status >= STATUS_EVERY_S:
            self.write_status("ready" if self.hardware is not None else "starting")
        if now - self.last_poll < POLL_S:
            return
        self.last_poll = now
        added = False
        try:
            waiting = sorted((self.queue_dir / sq.JOBS).glob("*.job"))
        except OSError as e:
            log.error("measuring service: cannot list %s: %s", self.queue_dir / sq.JOBS, one_line(e))
            waiting = []
        for path in waiting:
            added |= self._take(path)
        if added:
            self.queue = deque(order_kernels(list(self.queue), first_task=self.last_task))

    def _take(self, path: Path) -> bool:
        job_id = path.stem
        if job_id in self.jobstore.jobs:
            # A second job under an open job's id (a job file written again by hand or by a
            # client retrying): taken now it would replace the open job's file and its kernels'
            # ids; it waits in the queue until the open one is answered.
            return False
        taken = path.with_suffix(".taken")
        try:
            os.replace(path, taken)  # the claim: a client withdrawing the job now finds it gone
        except FileNotFoundError:
            return False
        job = _Job(job_id, taken, set())
        self.jobstore.jobs[job_id] = job
        try:
            doc = sq.read_capped(taken)
            kernels = doc.get("kernels")
            if doc.get("format") != sq.FORMAT or not isinstance(kernels, list):
                raise ValueError("not a measuring-service job")
            if doc.get("protocol") not in (None, self.cfg.protocol):
                raise ValueError(f"this service measures under {self.cfg.protocol}, the job asks for {doc['protocol']}")
            if len(kernels) > MAX_KERNELS_PER_JOB:
                raise ValueError(f"{len(kernels)} kernels, at most {MAX_KERNELS_PER_JOB} a job")
            seen: set[str] = set()
            fresh = []
            for k in kernels:
                if not (isinstance(k, dict) and all(isinstance(k.get(f), str) for f in ("kernel_id", "task", "source"))):
                    raise ValueError("every kernel needs string kernel_id, task and source")
                if not k["kernel_id"] or k["kernel_id"] in seen:
                    continue
                seen.add(k["kernel_id"])
                internal = f"{job_id}/{len(fresh)}"
                self.jobstore.add(job, internal, k["kernel_id"])
                fresh.append({"kernel_id": internal, "task": k["task"], "source": k["source"]})
        except (OSError, ValueError) as e:  # json's errors are ValueErrors
            for internal in job.remaining:
                self.jobstore.owner.pop(internal, None)
            job.remaining.clear()
            self.jobstore.finish(job, error=one_line(e))
            return False
        if not fresh:
            self.jobstore.finish(job)
            return False
        self.queue.extend(fresh)
        self.total += len(fresh)
        log.info("job %s: %d kernels", job_id, len(fresh))
        return True

    def _record(self, kernel: dict, result: dict, compile_s: float | None, sandbox: str = "") -> None:
        super()._record(kernel, result, compile_s, sandbox)
        if self.hardware is not None:  # recorded, not pending: the kernel's file is no longer needed
            self._kernel_file(kernel).unlink(missing_ok=True)

    # ---- stopping ----------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            self.stop_at = time.monotonic() + self.stop_grace_s
            log.warning("measuring service: stopping (%s)", reason)

    def _serving(self) -> bool:
        return self.stop_reason is None

    def _stopping(self, now: float) -> None:
        """No new kernels; the one being measured gets until stop_at, then its child is killed."""
        self.keep_warm = False
        self.queue.clear()
        self.compiled.clear()
        for sb in self._children():
            if sb.job is not None and (sb.role == "compile" or (self.stop_at is not None and now > self.stop_at)):
                sb.job = None  # abandoned: not recorded, its job goes back to the queue
                if sb is self.measurer:
                    self.clock = None
                self._retire(sb)

    def _emit_progress(self, force: bool = False) -> None:
        return None  # status.json instead (write_status)

    def write_status(self, state: str) -> None:
        self.last_status = time.monotonic()
        up = time.time() - self.started_wall
        counts = self.jobstore.counts
        served = max(time.time() - (self.ready_at or time.time()), 1e-9)
        status = {
            "state": state, "pid": os.getpid(), "device": self.cfg.device, "protocol": self.cfg.protocol,
            "harness_version": HARNESS_VERSION, "hardware_id": (self.hardware or {}).get("hardware_id"),
            "uptime_s": round(up, 1), "ready_after_s": round(self.ready_at - self.started_wall, 1) if self.ready_at else None,
            "measured": sum(counts.values()), "ok": counts.get("ok", 0), "failed": counts.get("failed", 0),
            "open_jobs": len(self.jobstore.jobs), "queued": len(self.queue) + len(self.compiled),
            "kernels_per_hour_since_ready": round(sum(counts.values()) * 3600 / served, 1) if self.ready_at else None,
            "correct_per_hour_since_ready": round(counts.get("ok", 0) * 3600 / served, 1) if self.ready_at else None,
            "phases_s": {k: round(v, 3) for k, v in sorted(self.phases_s.items())},
            "ref_cache": {"path": str(self.refcache.path) if self.refcache.path else None,
                          "timings_taken": self.refcache.timed},
            "children_started": self.n_children,
        }
        with contextlib.suppress(OSError):
            sq.write_atomic(self.queue_dir / "status.json", status)


class _Lock:
    """The service's flock on <queue>/service.lock (released by the kernel if the process dies)."""

    def __init__(self, queue: Path, info: dict):
        self.path = queue / sq.LOCK
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = sq.service_info(queue) or {}
            os.close(self.fd)
            raise WorkerError(f"a measuring service already runs on {queue} (pid {other.get('pid', '?')})") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(info).encode(), 0)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _recover(queue: Path) -> None:
    """At start: jobs a killed service had taken go back to the queue; a stop file meant for an
    earlier service is removed; rows no client collected within a day are removed."""
    (queue / sq.STOP).unlink(missing_ok=True)
    now = time.time()
    for path in (queue / sq.JOBS).iterdir():
        with contextlib.suppress(OSError):
            if path.suffix == ".taken":
                os.replace(path, path.with_suffix(".job"))
            elif path.suffix == ".rows" and now - path.stat().st_mtime > STALE_ROWS_S:
                path.unlink()


def serve(queue: str | Path | None = None, config: WorkerConfig | None = None, stop_grace_s: float = 10.0) -> dict:
    """Run the measuring service on `queue` until it is stopped; its final status.

    Raises:
        WorkerError: another service holds the queue, or the measuring child cannot start.
        ServiceError: the queue folder is not private to this user.
    """
    cfg = config or WorkerConfig()
    cfg.validate()
    q = sq.default_queue(cfg.device, queue)
    sq.make_private(q)
    lock = _Lock(q, {"pid": os.getpid(), "device": cfg.device, "protocol": cfg.protocol,
                     "harness_version": HARNESS_VERSION, "started_at": time.time()})
    workdir = Path(tempfile.mkdtemp(prefix="kernelcast-service-"))
    run = None
    early: list[str] = []  # a signal during start-up (the sandbox probe takes seconds)
    previous = {}

    def on_signal(signum, frame):
        name = signal.Signals(signum).name
        if run is None:
            early.append(name)
        else:
            run.request_stop(name)

    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread (tests call serve in one)
                previous[sig] = signal.signal(sig, on_signal)
        _recover(q)
        run = _ServiceRun(q, cfg, workdir, stop_grace_s)
        if early:
            run.request_stop(early[0])
        run.write_status("starting")
        run.run()
        return {"stopped": run.stop_reason or "complete", "measured": run.measured_now}
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if run is not None:
            run.close()
            returned = run.jobstore.give_back()
            if returned:
                log.warning("measuring service: %d unfinished job(s) returned to %s", returned, q / sq.JOBS)
            run.write_status("stopped")
        lock.release()
        if not cfg.log_dir:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)


def stop(queue: str | Path | None = None, device: str = "cuda", wait_s: float = 60.0) -> bool:
    """Ask the service on `queue` to stop and wait until its lock is gone; whether it stopped."""
    q = sq.default_queue(device, queue)
    if sq.service_info(q) is None:
        return True
    sq.request_stop(q)
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        if sq.service_info(q) is None:
            return True
        time.sleep(0.1)
    return False


def status(queue: str | Path | None = None, device: str = "cuda") -> dict:
    """The service's status.json with `running` (whether it holds the lock now)."""
    q = sq.default_queue(device, queue)
    doc: dict = {}
    with contextlib.suppress(OSError, ValueError):
        doc = sq.read_capped(q / "status.json", limit=2**20)
    return {**doc, "queue": str(q), "running": sq.service_info(q) is not None}


def config_from_args(args: argparse.Namespace) -> WorkerConfig:
    d = WorkerConfig()
    return WorkerConfig(
        device=args.device, protocol=args.protocol, compile_workers=args.compile_workers or d.compile_workers,
        timeout_s=args.timeout_s, max_reps=args.max_reps, ref_refresh_s=args.ref_refresh_s, ref_cache=args.ref_cache,
        log_dir=args.log_dir, timed_variants=args.timed_variants, timed_samples=args.timed_samples,
        input_cache_gib=args.input_cache_gib, recycle_after=args.recycle_after,
    )


def add_arguments(ap: argparse.ArgumentParser) -> None:
    d = WorkerConfig()
    ap.add_argument("--queue", default=None, help=f"the queue folder (default: ${sq.ENV} or ~/.cache/kernelcast/measure/<gpu>)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--protocol", choices=PROTOCOLS, default=d.protocol)
    ap.add_argument("--compile-workers", type=int, default=None)
    ap.add_argument("--timeout-s", type=float, default=d.timeout_s, help="per compile job / per measuring step")
    ap.add_argument("--max-reps", type=int, default=None)
    ap.add_argument("--ref-refresh-s", type=float, default=d.ref_refresh_s,
                    help=f"re-time a task's reference case when its newest timing is older than this (default {d.ref_refresh_s:.0f} s)")
    ap.add_argument("--ref-cache", default=None)
    ap.add_argument("--recycle-after", type=int, default=d.recycle_after)
    ap.add_argument("--log-dir", default=None)
    ap.add_argument("--timed-variants", type=int, default=None)
    ap.add_argument("--timed-samples", type=int, default=None)
    ap.add_argument("--input-cache-gib", type=float, default=None)
    ap.add_argument("--stop-grace-s", type=float, default=10.0, help="how long a kernel being measured may finish after a stop")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m pipelines.profiling.service", description=__doc__.splitlines()[0])
    add_arguments(ap)
    ap.add_argument("--status", action="store_true", help="print the running service's status JSON and exit")
    ap.add_argument("--stop", action="store_true", help="ask the running service to stop and wait for it")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        if args.status:
            print(json.dumps(status(args.queue, args.device), indent=1))
            return 0
        if args.stop:
            ok = stop(args.queue, args.device)
            print("stopped" if ok else "still running after 60 s", file=sys.stderr)
            return 0 if ok else 1
        result = serve(args.queue, config_from_args(args), args.stop_grace_s)
    except (WorkerError, sq.ServiceError, ValueError, OSError) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    print(f"measuring service stopped ({result['stopped']}): {result['measured']} kernels measured", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
