"""The measuring service's queue: a folder only its user can enter, and the client's `submit`.

    <queue>/                 created 0700; a queue another user owns, or others can enter, is refused
        service.lock         held (flock) by the running service; JSON: pid, device, protocol, state
        stop                 created by anyone with access: the service stops (as on SIGTERM)
        jobs/<id>.job        a job, written by a client under a temporary name and renamed in place
        jobs/<id>.taken      the same file, renamed by the service when it takes the job
        jobs/<id>.rows       the job's result rows (JSON), renamed in place by the service

Why a folder and not a Unix socket: a rename is atomic, so neither side ever reads half a job or
half a result, and nothing needs framing or a size-capped decoder on a live connection; jobs
survive the service (a job dropped while it restarts, or one it was measuring when it was
stopped, is taken by the next one); the service's event loop, which already wakes every 0.5 s
to watch its children, lists the folder without a thread of its own; and the folder's owner and
mode are the whole access rule (a client checks them before it hands over a kernel). The lock is
an flock, not a pid file: the kernel releases it when the service dies, however it dies, so a
client never waits on a service that is gone.

`submit(kernels)` writes one job and waits for its rows; `ServiceUnavailable` (no service,
or it went away) and `ServiceTimeout` are one-line errors the callers turn into a fallback to the
one-shot worker or a failed measurement.

Imports only the standard library.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import stat
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

FORMAT = 1
ENV = "KERNELCAST_MEASURE_QUEUE"
MAX_JOB_BYTES = 64 * 2**20  # a job larger than this is refused unread (sources of ~10,000 kernels)
LOCK, STOP, JOBS = "service.lock", "stop", "jobs"


class ServiceError(RuntimeError):
    """A measuring service problem (one line)."""


class ServiceUnavailable(ServiceError):
    """No measuring service runs on the queue, or it went away before the rows came."""


class ServiceTimeout(ServiceError):
    """The rows did not come in time (the job is withdrawn if the service had not taken it)."""


def queue_name(device: str) -> str:
    """One queue per GPU: the physical index the service and the client see first
    (CUDA_VISIBLE_DEVICES, as a Dagster step pinned to a GPU sets it), 0 without it.

    >>> queue_name("cpu")
    'cpu'
    """
    if device == "cpu":
        return "cpu"
    first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
    return f"cuda-{first}"


def default_queue(device: str = "cuda", given: str | Path | None = None) -> Path:
    """`given`, else $KERNELCAST_MEASURE_QUEUE, else ~/.cache/kernelcast/measure/<queue_name>."""
    if given:
        return Path(given)
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    return Path.home() / ".cache" / "kernelcast" / "measure" / queue_name(device)


def check_private(folder: Path) -> None:
    """Raise ServiceError unless `folder` is a directory of this user that no one else can enter."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        raise ServiceUnavailable(f"no measuring service queue at {folder}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ServiceError(f"{folder} is not a folder")
    if st.st_uid != os.getuid():
        raise ServiceError(f"{folder} belongs to uid {st.st_uid}, not to this user: not a queue to hand kernels to")
    if st.st_mode & 0o077:
        raise ServiceError(f"{folder} is open to others (mode {stat.S_IMODE(st.st_mode):o}): a queue must be 0700")


def make_private(folder: Path) -> None:
    """Create `folder` (and its jobs/) 0700, or check an existing one (check_private)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    check_private(folder)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder / JOBS, 0o700)
    check_private(folder / JOBS)


def write_atomic(path: Path, doc: dict) -> None:
    """`doc` as JSON at `path`: a temporary file in the same folder, fsynced, renamed over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, default=_json_default)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _json_default(value):
    if isinstance(value, dt.datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


def read_capped(path: Path, limit: int = MAX_JOB_BYTES) -> dict:
    """A JSON object from `path`, refused (ValueError) above `limit` bytes or when not an object."""
    with open(path, "rb") as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise ValueError(f"{path.name} is larger than {limit} bytes")
    doc = json.loads(raw)
    if not isinstance(doc, dict):
        raise ValueError(f"{path.name} is not a JSON object")
    return doc


def service_info(queue: Path) -> dict | None:
    """The running service's lock record, or None when no service holds the lock."""
    path = queue / LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # the service holds it exclusively: it is alive
            try:
                raw = os.pread(fd, 65536, 0)
                info = json.loads(raw) if raw else {}
            except (OSError, ValueError):
                info = {}
            return info if isinstance(info, dict) else {}
        fcntl.flock(fd, fcntl.LOCK_UN)  # nobody held it: a lock file left by a killed service
        return None
    finally:
        os.close(fd)


def running(queue: str | Path | None = None, device: str = "cuda") -> bool:
    """Whether a measuring service serves `queue` (default: this GPU's)."""
    q = default_queue(device, queue)
    try:
        check_private(q)
    except ServiceError:
        return False
    return service_info(q) is not None


def _from_jsonable(row: dict) -> dict:
    out = dict(row)
    if isinstance(out.get("measured_at"), str):
        with contextlib.suppress(ValueError):
            out["measured_at"] = dt.datetime.fromisoformat(out["measured_at"])
    return out


def submit(kernels: Sequence[dict], *, queue: str | Path | None = None, device: str = "cuda",
           protocol: str | None = None, timeout_s: float = 600.0, poll_s: float = 0.05) -> list[dict]:
    """Measure `kernels` ({kernel_id, task, source}) on the running service; their result rows.

    Args:
        kernels: the batch; one row comes back per distinct kernel id, in the service's order.
        queue: the service's folder (default: default_queue(device)).
        device: which GPU's queue by default ("cuda" | "cpu").
        protocol: the protocol the rows must have (None: the service's); another is refused.
        timeout_s: how long to wait for the rows.
    Raises:
        ServiceUnavailable: no service runs there, or it stopped before the job was done.
        ServiceTimeout: no rows within timeout_s.
        ServiceError: the queue is not private, or the service refused the job (its reason).
    """
    q = default_queue(device, queue)
    check_private(q)
    info = service_info(q)
    if info is None:
        raise ServiceUnavailable(f"no measuring service runs on {q} (start one: kernelcast serve-measure)")
    if protocol is not None and info.get("protocol") not in (None, protocol):
        raise ServiceError(f"the service on {q} measures under {info.get('protocol')}, not {protocol}")
    job_id = f"{int(time.time() * 1000):013d}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    jobs = q / JOBS
    clean = [{"kernel_id": str(k["kernel_id"]), "task": str(k["task"]), "source": str(k["source"])} for k in kernels]
    write_atomic(jobs / f"{job_id}.job", {"format": FORMAT, "job_id": job_id, "protocol": protocol,
                                            "kernels": clean, "submitted_at": time.time()})
    rows_path = jobs / f"{job_id}.rows"
    deadline = time.monotonic() + timeout_s
    next_check = 0.0
    try:
        while True:
            if rows_path.exists():
                doc = read_capped(rows_path, limit=16 * MAX_JOB_BYTES)
                rows_path.unlink(missing_ok=True)
                if doc.get("error"):
                    raise ServiceError(f"the measuring service refused the job: {doc['error']}")
                return [_from_jsonable(r) for r in doc.get("rows", []) if isinstance(r, dict)]
            now = time.monotonic()
            if now >= deadline:
                raise ServiceTimeout(f"no rows from the measuring service on {q} within {timeout_s:.0f} s "
                                     f"({len(clean)} kernels)")
            if now >= next_check:  # the lock: is the service still there?
                next_check = now + 1.0
                if service_info(q) is None and not rows_path.exists():
                    raise ServiceUnavailable(f"the measuring service on {q} stopped before the job was done")
            time.sleep(poll_s)
    except BaseException:
        # Withdraw a job the service has not taken (a taken one is finished or returned to the queue
        # by the service; its rows file is then left for no one and removed by the next service).
        (jobs / f"{job_id}.job").unlink(missing_ok=True)
        raise


def request_stop(queue: str | Path | None = None, device: str = "cuda") -> Path:
    """Create the stop file: the service finishes the loop it is in and stops."""
    q = default_queue(device, queue)
    check_private(q)
    path = q / STOP
    path.touch(mode=0o600)
    return path
