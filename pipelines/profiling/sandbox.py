"""Child processes that run untrusted kernels, and the parent's handle on them.

A child is `python -P -m pipelines.profiling.child --role R --config JSON`, started with
subprocess (never fork: CUDA cannot survive it) through `jail.py`, which applies the sandbox
layers the host allows (jail.py lists them) before the child's first line runs:

* an allow-listed environment (`child_env`: no secrets, no KERNELCAST_HOME), with HOME, TMPDIR
  and the working directory a private directory that is removed when the child ends;
* as root, a dedicated unprivileged uid per child (61000 + slot) in a shared group, so a child
  can write nothing the parent owns (the warehouse, the repository) and reach no other child;
* a network namespace and a PID namespace (the kernel ends every process of the namespace with
  its first one, so a `setsid` grandchild cannot outlive the check);
* rlimits on address space (CPU), file size and processes; no core files; no_new_privs;
* a seccomp filter refusing network and Unix sockets (it holds where a namespace would stop CUDA);
* a private mount namespace with every filesystem read-only but the private directory and the
  shared Triton cache (it holds where Landlock would stop CUDA), the home folders and password
  files hidden, a /dev/shm of the child's own and a /proc that shows no other process;
* Landlock: writes only beneath the private directory, the shared Triton cache and device files.

The parent accepts one "ready" per child, refuses a message too long or too deep before decoding
it (`RefusedMessage`: the job in flight is `tampered`), replaces a child that has a process or
thread left after a job, and counts the private directory's files against the memory limit.

Messages are JSON over the child's stdin/stdout, framed by multiprocessing.connection. The
child moves fd 1 onto stderr right away, so a kernel that prints cannot corrupt the channel;
stderr goes to a per-child log file whose tail explains deaths.

`Sandbox.kill()` SIGKILLs the child's process group, then sweeps what may have escaped it
(every process of the child's uid; without one, orphans carrying the child's marker), removes
the private directory and frees the uid. On CUDA hosts, where an address-space limit would stop
CUDA from starting, the parent watches each child's resident memory instead (`over_limits`).
The parent never runs kernel code: a crash, hang or CUDA fault kills only the child.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pipelines.profiling import jail

REPO_ROOT = Path(__file__).resolve().parents[2]  # so `-m pipelines.profiling.child` imports
JAIL = Path(jail.__file__).resolve()
MARKER_ENV = "KERNELCAST_SANDBOX_ID"
SKIP_ENV = "KERNELCAST_SANDBOX_SKIP"  # comma-separated layers not to apply (e.g. "uid,landlock")
MEMORY_ENV = "KERNELCAST_SANDBOX_MEMORY_GB"  # a child's memory limit, GiB (CPU: address space, CUDA: resident)
PROCESSES_ENV = "KERNELCAST_SANDBOX_PROCESSES"  # a child's processes + threads
GIB = 2**30

# Passed through to children when set; everything else (tokens, KERNELCAST_HOME, ...) is dropped.
ALLOWED_ENV = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME",
    "CUDA_PATH", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "TRITON_PTXAS_PATH",
    "TRITON_LIBCUDA_PATH", "TRITON_CACHE_DIR", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF",
    "CUBLAS_WORKSPACE_CONFIG", "TORCH_CUDA_ARCH_LIST", "CC", "CXX", "KERNELCAST_TASK_MODULES", "KERNELCAST_DEVICE",
    "KERNELCAST_SHIP",
)
WANTED_LAYERS = ("uid", "netns", "pidns", "mountns", "masks", "sockets", "shm", "proc", "rlimits", "seccomp", "nounix",
                 "landlock")
ROOT_FALLBACK = "nocaps"  # as root without a sandbox uid: root's uid, no capabilities


class ChildDied(Exception):
    """The child exited or closed its channel; `str()` says how (exit code or signal)."""

    failure_kind = "crashed"  # what the job in flight, if any, is recorded as


class RefusedMessage(ChildDied):
    """The child sent what the harness never sends (too long, too deep, a second 'ready'): only
    kernel code that found the channel can; its job is `tampered` and the child is replaced."""

    failure_kind = "tampered"


MAX_MESSAGE_BYTES = 4 * 2**20  # a result with every timing of every case is a few KiB
MAX_MESSAGE_DEPTH = 32  # the harness's messages nest a handful of levels
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_JSON_PAIR = re.compile(rb"\[\]|\{\}")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class RefusedJSON(ValueError):
    """JSON text over the size or nesting bounds, refused before it is decoded."""


def json_nesting_ok(raw: bytes, max_depth: int) -> bool:
    """Whether the arrays and objects of JSON text `raw` nest at most `max_depth` deep (brackets
    inside strings do not count; unbalanced brackets do not pass), without a recursive parse.

    >>> json_nesting_ok(b'{"a": [[1], "]]]"]}', 3), json_nesting_ok(b"[" * 50 + b"]" * 50, 32)
    (True, False)
    """
    bare = _JSON_STRING.sub(b'""', raw).translate(None, _NOT_BRACKETS)
    if len(bare) <= max_depth:
        return bare.count(b"[") + bare.count(b"{") == bare.count(b"]") + bare.count(b"}")
    for _ in range(max_depth):  # each pass removes the innermost level
        bare = _JSON_PAIR.sub(b"", bare)
        if not bare:
            return True
    return False


def loads_bounded(raw: bytes, max_bytes: int = MAX_MESSAGE_BYTES, max_depth: int = MAX_MESSAGE_DEPTH) -> Any:
    """json.loads, after checking the size and the nesting depth of `raw`.

    Raises:
        RefusedJSON: over a bound (json.loads would not even be tried) or nested past what the
            decoder itself can take.
        ValueError: not JSON.
    """
    if len(raw) > max_bytes:
        raise RefusedJSON(f"{len(raw)} bytes, over the limit of {max_bytes}")
    if not json_nesting_ok(raw, max_depth):
        raise RefusedJSON(f"nested deeper than {max_depth} levels")
    try:
        return json.loads(raw)
    except RecursionError:
        raise RefusedJSON("nested deeper than the decoder can take") from None


def deliver(sb: Any, reply: dict, alive: Collection[Any]) -> None:
    """Send `reply` to the child `sb` if it is still one of `alive`; one that died meanwhile gets
    nothing (its death is read from its own channel next round)."""
    if sb is None or sb not in alive:
        return
    try:
        sb.send(reply)
    except ChildDied:
        pass


@dataclass(frozen=True)
class SandboxPolicy:
    """What a kernel-running child may use. Defaults fit a check on a CPU and a GPU worker.

    memory_bytes: address space of a CPU child (RLIMIT_AS), resident memory of a CUDA child
        (watched by the parent: CUDA reserves far more address space than it touches).
    """

    layers: tuple[str, ...] = WANTED_LAYERS
    memory_bytes: int = 8 * GIB
    cuda_memory_bytes: int = 48 * GIB
    file_bytes: int = 4 * GIB  # largest file a child may write (a shipped output, a cache entry)
    processes: int = 512  # processes + threads of one child (torch and CUDA start dozens of threads)
    shm_bytes: int = 2 * GIB  # the child's own /dev/shm (layer `shm`)
    private_files: int = 10_000  # files in the private directory before the child counts as a bomb
    uid_base: int = 61000
    gid: int = 61000

    def without(self, *names: str) -> SandboxPolicy:
        return replace(self, layers=tuple(x for x in self.layers if x not in names))


def policy_from_env(base: SandboxPolicy | None = None) -> SandboxPolicy:
    """`base` (default SandboxPolicy()) minus the layers named in KERNELCAST_SANDBOX_SKIP, with
    the limits of KERNELCAST_SANDBOX_MEMORY_GB and KERNELCAST_SANDBOX_PROCESSES when set.

    Raises:
        ValueError: a limit that is not a positive number.
    """
    policy = base or SandboxPolicy()
    skip = [s.strip() for s in os.environ.get(SKIP_ENV, "").split(",") if s.strip()]
    if skip:
        policy = policy.without(*skip)
    try:
        if os.environ.get(MEMORY_ENV):
            gib = float(os.environ[MEMORY_ENV])
            if not gib > 0:
                raise ValueError
            policy = replace(policy, memory_bytes=int(gib * GIB), cuda_memory_bytes=int(gib * GIB),
                             shm_bytes=min(policy.shm_bytes, int(gib * GIB) // 4))
        if os.environ.get(PROCESSES_ENV):
            n = int(os.environ[PROCESSES_ENV])
            if n < 1:
                raise ValueError
            policy = replace(policy, processes=n)
    except ValueError:
        raise ValueError(f"{MEMORY_ENV} and {PROCESSES_ENV} must be positive numbers") from None
    return policy


def child_env(device: str, extra: dict[str, str] | None = None, private_dir: Path | None = None,
              marker: str | None = None) -> dict[str, str]:
    """The environment of a child: allow-listed variables, interpreter mode on CPU, the repository
    on PYTHONPATH, HOME and TMPDIR in its private directory."""
    env = {k: os.environ[k] for k in ALLOWED_ENV if k in os.environ}
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(REPO_ROOT), *inherited]))
    env["PATH"] = env.get("PATH") or os.defpath
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a segfault leaves a Python traceback in the log
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    env["USER"] = env["LOGNAME"] = "kernelcast-sandbox"  # getpass works without a passwd entry
    # torch.compile's inductor compiles in process: no pool of worker processes that outlive a
    # kernel's job (the parent treats processes left behind as tampering).
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    if private_dir is not None:
        env["HOME"] = env["TMPDIR"] = str(private_dir)
    if marker:
        env[MARKER_ENV] = marker
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"  # must be set before triton is imported in the child
        env["KERNELCAST_DEVICE"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU child never touches a GPU, even on a GPU host
    else:
        env.pop("TRITON_INTERPRET", None)
        env["KERNELCAST_DEVICE"] = "cuda"
    env.update(extra or {})
    return env


def describe_exit(returncode: int | None) -> str:
    """'signal SIGSEGV' / 'exit code 3' / 'still running'."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


# ---- host facts ---------------------------------------------------------------------------
def is_root() -> bool:
    return os.geteuid() == 0


def private_root() -> Path:
    """Where private directories go: /dev/shm when it has room (shipped outputs are read back at
    memory speed), else the temporary directory."""
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize >= 8 * GIB and os.access("/dev/shm", os.W_OK):
            return Path("/dev/shm")
    except OSError:
        pass
    return Path(tempfile.gettempdir())


def device_files() -> list[str]:
    """Device files a child may open for writing (CUDA's, and the harmless ones)."""
    found = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"]
    for pattern in ("/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/dri/*"):
        found += [p for p in glob.glob(pattern) if not os.path.isdir(p)]
    return found


_STALE_SWEPT: list[bool] = []


def _remove_stale_private_dirs() -> None:
    """Private directories of parents that were killed (and could not remove them): once per
    process, every kc-<role>-<pid>-* folder whose <pid> no longer runs."""
    if _STALE_SWEPT:
        return
    _STALE_SWEPT.append(True)
    root = private_root()
    for d in root.glob("kc-*-*-*"):
        parts = d.name.split("-")
        if len(parts) >= 4 and parts[2].isdigit() and not Path(f"/proc/{parts[2]}").exists():
            shutil.rmtree(d, ignore_errors=True)


class _UidPool:
    """Dedicated uids for the children of this process, one per live child.

    A uid is claimed with an exclusive lock on a file named after it (the lock goes with the
    process that holds it, dead or alive), so two workers on one host (one per GPU) never hand
    out the same uid, and one's sweep cannot end the other's children.
    """

    LOCKS = Path(tempfile.gettempdir()) / "kernelcast-sandbox-uids"

    def __init__(self) -> None:
        self.held: dict[int, int] = {}  # uid -> lock file descriptor

    def take(self, base: int) -> int:
        import fcntl

        self.LOCKS.mkdir(mode=0o700, exist_ok=True)
        for slot in range(1000):
            uid = base + slot
            if uid in self.held:
                continue
            fd = os.open(self.LOCKS / f"{uid}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)  # another worker's child has it
                continue
            self.held[uid] = fd
            kill_processes(processes_of_uid(uid))  # leftovers of a run that died holding it
            return uid
        raise RuntimeError("no free sandbox uid")

    def give_back(self, uid: int) -> None:
        fd = self.held.pop(uid, None)
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the lock


_UIDS = _UidPool()


# ---- /proc ------------------------------------------------------------------------------
def _status(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return {}


def _pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def processes_of_uid(uid: int) -> list[int]:
    """Live processes whose real uid is `uid`."""
    out = []
    for pid in _pids():
        uids = _status(pid).get("Uid", "").split()
        if uids and int(uids[0]) == uid:
            out.append(pid)
    return out


def _process_group(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def _pid_namespace(pid: int, link: str = "pid") -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{link}")
    except OSError:
        return None


def _is_zombie(pid: int) -> bool:
    return _status(pid).get("State", "Z").startswith(("Z", "X"))


@dataclass(frozen=True)
class ProcInfo:
    """What the parent reads about one process in one pass over /proc."""

    pid: int
    uid: int
    rss_bytes: int
    threads: int
    pgid: int | None
    pidns: str | None
    zombie: bool


def scan_processes() -> list[ProcInfo]:
    """Every process of the host, read once (the limit checks of all children share one scan)."""
    out = []
    for pid in _pids():
        st = _status(pid)
        if not st:
            continue
        uid = int(st.get("Uid", "-1").split()[0])
        kb = st.get("VmRSS", "0 kB").split()[0]
        n = st.get("Threads", "1")
        out.append(ProcInfo(pid, uid, int(kb) * 1024 if kb.isdigit() else 0, int(n) if n.isdigit() else 1,
                            _process_group(pid), _pid_namespace(pid), st.get("State", "Z").startswith(("Z", "X"))))
    return out


def _has_marker(pid: int, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{MARKER_ENV}={marker}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def kill_processes(pids: list[int], wait_s: float = 2.0) -> None:
    """SIGKILL each pid (ours or not yet reaped), then wait until they are gone or zombies."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    end = time.monotonic() + wait_s
    for pid in pids:
        while time.monotonic() < end:
            state = _status(pid).get("State", "")
            if not state or state.startswith("Z"):
                break
            time.sleep(0.01)
        try:
            os.waitpid(pid, os.WNOHANG)  # reap orphans reparented to us (subreaper)
        except (ChildProcessError, OSError):
            pass


def _become_subreaper() -> None:
    """Orphans of our children are reparented to us, so the sweep finds setsid escapees."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def hide_from_children() -> None:
    """Children of the same uid cannot read our environment or memory or ptrace us
    (PR_SET_DUMPABLE 0: /proc/<pid> of this process then belongs to root)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except (OSError, AttributeError):
        pass


# ---- what this host provides --------------------------------------------------------------
@dataclass
class LayerReport:
    """The layers a child gets on this host and, for each wanted one it does not, why."""

    layers: tuple[str, ...]
    notes: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        """One line for logs and `kernelcast check`."""
        text = "sandbox: " + ",".join(self.layers)
        if self.notes:
            text += "; not on this host: " + "; ".join(f"{k} ({v})" for k, v in sorted(self.notes.items()))
        return text


_PROBES: dict[tuple, LayerReport] = {}


def _read_notes(text: str) -> dict[str, str]:
    for line in text.splitlines():
        if line.startswith(jail.NOTES_PREFIX):
            try:
                return dict(json.loads(line[len(jail.NOTES_PREFIX):]))
            except ValueError:
                return {}
    return {}


# What the probe runs inside the jail: everything a child needs must be readable and usable there.
_PROBE_CODE = """
import importlib.util, os, sys
open(sys.argv[1]).close()
for name in ("torch", "triton", "numpy"):
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.origin:
        open(spec.origin).close()
if sys.argv[2] == "cuda":
    for dev in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm"):
        if os.path.exists(dev):
            os.close(os.open(dev, os.O_RDWR))
    import torch  # the driver itself must start: opening the device files is not enough
    if torch.cuda.device_count() < 1:
        raise SystemExit("CUDA initialisation failed inside the sandbox: no CUDA device visible")
    torch.zeros(1, device="cuda").sum().item()
sys.stdout.write(os.environ.get("KERNELCAST_SANDBOX_LAYERS", ""))
"""


# Dropped in this order when CUDA will not start; `mountns` last: where Landlock has to go, it is
# what still keeps a kernel from writing outside its private directory.
CUDA_FRAGILE_LAYERS = ("nounix", "proc", "sockets", "shm", "masks", "landlock", "netns", "pidns", "seccomp", "mountns")


def _probe_once(policy: SandboxPolicy, device: str, uid: int | None) -> tuple[list[str] | None, dict[str, str], str]:
    """(layers, notes, error) of one trivial child started through the jail."""
    with tempfile.TemporaryDirectory(prefix="kc-probe-") as d:
        if uid is not None:
            os.chown(d, uid, policy.gid)
        spec = _jail_spec(policy, device, Path(d), uid=uid, shared_dirs=())
        child = REPO_ROOT / "pipelines" / "profiling" / "child.py"
        argv = [sys.executable, "-I", "-S", str(JAIL), json.dumps(spec), "--", sys.executable, "-I", "-c", _PROBE_CODE,
                str(child), device]
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=d,
                                 env=child_env(device, private_dir=Path(d)))
        except (OSError, subprocess.SubprocessError) as e:
            return None, {}, one_line(e)
    notes = _read_notes(res.stderr)
    if res.returncode != 0:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip() and not ln.startswith(jail.NOTES_PREFIX)]
        return None, notes, one_line(lines[-1] if lines else f"exit code {res.returncode}")
    return [x for x in res.stdout.strip().split(",") if x], notes, ""


MEMO_ENV = "KERNELCAST_SANDBOX_MEMO"  # the memo file; "off" probes every layer every time
MEMO_TTL_S = 24 * 3600.0


def _memo_path() -> Path | None:
    where = os.environ.get(MEMO_ENV)
    if where == "off":
        return None
    if where:
        return Path(where)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kernelcast" / "sandbox-layers.json"


def _host_key(policy: SandboxPolicy, device: str) -> str:
    """What the memo is valid for: this kernel, driver, interpreter, user and policy."""
    try:
        driver = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
    except (OSError, IndexError):
        driver = ""
    return json.dumps([os.uname().release, driver, sys.executable, os.geteuid(), device, list(policy.layers)])


def _read_memo(policy: SandboxPolicy, device: str) -> dict[str, str] | None:
    """The layers a recent probe of this host had to drop for CUDA to start, with their notes."""
    path = _memo_path()
    try:
        entry = json.loads(path.read_text()) if path else None
    except (OSError, ValueError):
        return None
    if (not isinstance(entry, dict) or entry.get("key") != _host_key(policy, device)
            or not time.time() - float(entry.get("at", 0)) < MEMO_TTL_S):
        return None
    dropped = entry.get("dropped")
    ok = isinstance(dropped, dict) and all(k in policy.layers and isinstance(v, str) for k, v in dropped.items())
    return dropped if ok else None


def _write_memo(policy: SandboxPolicy, device: str, dropped: dict[str, str]) -> None:
    path = _memo_path()
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")
        tmp.write_text(json.dumps({"key": _host_key(policy, device), "at": time.time(), "dropped": dropped}))
        tmp.replace(path)
    except OSError:
        pass  # a memo is an optimisation: without it the next worker probes every layer again


def probe(policy: SandboxPolicy, device: str) -> LayerReport:
    """Start a trivial program through the jail with `policy` (as a sandbox uid when root);
    report the layers it got. A uid that cannot read the interpreter, the libraries or the
    repository (or open the GPU) is dropped with a note. Cached per (policy, device).

    On a GPU host each attempt starts CUDA (seconds), and a host where the namespaces break the
    driver needs five; the layers dropped there are remembered for a day (MEMO_ENV) and the
    next worker confirms them with one attempt, probing everything again if that one fails.
    A memo only ever names layers to leave out, keyed by kernel, driver, interpreter and user.
    """
    key = (policy, device)
    if key in _PROBES:
        return _PROBES[key]
    memo = _read_memo(policy, device) if device == "cuda" else None
    report = _probe_remembered(policy, device, memo) if memo is not None else None
    if report is None:
        report, dropped = _probe_all(policy, device)
        if device == "cuda":
            _write_memo(policy, device, dropped)
    _PROBES[key] = report
    return report


def _sandbox_uid(policy: SandboxPolicy, notes: dict[str, str]) -> int | None:
    if "uid" not in policy.layers:
        return None
    if is_root():
        return policy.uid_base + 1023  # a slot the children never take
    notes["uid"] = "not started as root: children keep this user's uid"
    return None


def _finish(got: list[str] | None, found: dict[str, str], error: str, notes: dict[str, str]) -> LayerReport:
    if got is None:
        got, found = ["env", "tmpdir"], {"jail": error}
    notes.update(found)
    if "pidns" not in got:
        got.append("pgkill")  # the tree is ended by process group, uid and orphan sweeps
    return LayerReport(tuple(dict.fromkeys(got)), {k: v for k, v in notes.items() if k not in got})


def _probe_remembered(policy: SandboxPolicy, device: str, dropped: dict[str, str]) -> LayerReport | None:
    """One attempt with the remembered layers left out; None when it fails (a stale memo)."""
    notes = {name: f"turned off ({SKIP_ENV})" for name in WANTED_LAYERS if name not in policy.layers}
    notes.update(dropped)
    reduced = policy.without(*dropped)
    got, found, error = _probe_once(reduced, device, _sandbox_uid(reduced, notes))
    return None if got is None else _finish(got, found, error, notes)


def _probe_all(policy: SandboxPolicy, device: str) -> tuple[LayerReport, dict[str, str]]:
    """Every attempt the host needs: (report, the layers dropped to make CUDA start)."""
    notes = {name: f"turned off ({SKIP_ENV})" for name in WANTED_LAYERS if name not in policy.layers}
    dropped: dict[str, str] = {}
    uid = _sandbox_uid(policy, notes)
    got, found, error = _probe_once(policy, device, uid)
    if got is None and uid is not None:
        notes["uid"] = dropped["uid"] = f"a sandbox uid cannot start the child here ({error})"
        uid = None
        policy = policy.without("uid")
        got, found, error = _probe_once(policy, device, None)
    # On a GPU host a layer may keep the CUDA driver from starting (seen on an H200 VM: Landlock
    # hid the device, the network and PID namespaces made cuInit fail with error 304). Such
    # layers are dropped one by one, each with its reason in the measurement rows.
    for layer in CUDA_FRAGILE_LAYERS if device == "cuda" else ():
        if got is not None or layer not in policy.layers:
            continue
        notes[layer] = dropped[layer] = f"breaks CUDA initialisation on this host ({error})"
        policy = policy.without(layer)
        got, found, error = _probe_once(policy, device, uid)
    if got is None:
        dropped = {}  # nothing started at all: nothing worth remembering
    # A layer dropped while a later one still kept CUDA from starting may not have been at fault
    # (an H200 host lost its sandbox uid this way): each gets one more try with what works.
    for layer in list(dropped)[:-1]:
        trial = replace(policy, layers=tuple(x for x in WANTED_LAYERS if x in policy.layers or x == layer))
        trial_uid = uid if layer != "uid" else _sandbox_uid(trial, {})
        t_got, t_found, _ = _probe_once(trial, device, trial_uid)
        if t_got is not None:
            policy, uid, got, found = trial, trial_uid, t_got, t_found
            del dropped[layer]
            notes.pop(layer, None)
    return _finish(got, found, error, notes), dropped


# Read by nobody but their owner, yet a child keeping root's uid (or the caller's) could read them:
# the `masks` layer empties these folders (but for what a child needs) and these files.
HIDDEN_DIRS = ("/root", "/home", "/etc/ssh", "/etc/sudoers.d")
HIDDEN_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers", "/etc/security/opasswd")


def hidden_dirs() -> list[str]:
    """Folders a child sees empty (but for `visible_paths`): every user's home, this process's
    home (HOME and its passwd entry) and KERNELCAST_HOME (the warehouse, the settings)."""
    out = list(HIDDEN_DIRS) + [os.path.expanduser("~")]
    try:
        import pwd

        out.append(pwd.getpwuid(os.geteuid()).pw_dir)
    except (ImportError, KeyError):
        pass
    if os.environ.get("KERNELCAST_HOME"):
        out.append(os.environ["KERNELCAST_HOME"])
    return [d for d in dict.fromkeys(out) if d and d != "/"]


def visible_paths(private: Path, shared_dirs: tuple[Path, ...]) -> list[str]:
    """What a child needs to read even where it lies inside a hidden folder: the interpreter and
    its libraries, the repository, the temporary directory (kernel files), the CUDA and Triton
    paths the environment names, its private directory and the shared ones."""
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), str(REPO_ROOT), tempfile.gettempdir(),
             str(private), *map(str, shared_dirs), *(p for p in sys.path if p and os.path.exists(p))]
    for var in ("PYTHONPATH", "LD_LIBRARY_PATH"):
        paths += os.environ.get(var, "").split(os.pathsep)
    for var in ("CUDA_HOME", "CUDA_PATH", "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH", "TRITON_CACHE_DIR"):
        if os.environ.get(var):
            paths.append(os.environ[var])
    return [p for p in dict.fromkeys(paths) if p and os.path.realpath(p) != "/"]


def _jail_spec(policy: SandboxPolicy, device: str, private: Path, uid: int | None,
               shared_dirs: tuple[Path, ...]) -> dict[str, Any]:
    limits: dict[str, int | None] = {"fsize": policy.file_bytes, "core": 0, "nproc": policy.processes}
    if device == "cpu":
        limits["as"] = policy.memory_bytes
    writable = [str(private), *map(str, shared_dirs)]
    if device == "cuda":
        writable.append("/dev/shm")  # the CUDA driver may keep shared memory there
    # `mountns` gives the child a /dev/shm of its own (`shm`), else leaves it read-only but for
    # the private directory: were the CUDA driver to need more, the probe drops the layer.
    mount_writable = [str(private), *map(str, shared_dirs)]
    want = [x for x in policy.layers if x != "uid" or uid is not None]
    if uid is None and is_root():
        want.append(ROOT_FALLBACK)
    return {
        "private_dir": str(private), "uid": uid, "gid": policy.gid if uid is not None else None,
        "want": want, "limits": limits,
        "writable_dirs": writable, "writable_files": device_files(), "mount_writable_dirs": mount_writable,
        "umask": 0o002, "hidden_dirs": hidden_dirs(), "hidden_files": list(HIDDEN_FILES),
        "visible_paths": visible_paths(private, shared_dirs), "shm_bytes": policy.shm_bytes,
    }


def read_only_triton_cache(shared: Path) -> dict[str, str]:
    """The environment of a child that reads the shared Triton cache `shared` without writing it
    (give it no shared_dirs): it compiles into a cache of its own (triton_cache.py)."""
    return {"TRITON_CACHE_MANAGER": "pipelines.profiling.triton_cache:ReadThroughCache",
            "KERNELCAST_TRITON_SHARED": str(shared)}


def prepare_shared_dir(path: Path, policy: SandboxPolicy) -> None:
    """A directory every child may write (the Triton cache): group-owned by the sandbox gid."""
    path.mkdir(parents=True, exist_ok=True)
    if is_root() and "uid" in policy.layers:
        os.chown(path, -1, policy.gid)
        os.chmod(path, 0o2775)  # setgid: entries keep the shared group


def make_traversable(*paths: Path) -> None:
    """Let sandbox uids read the kernel files the parent writes (directories 0755)."""
    if is_root():
        for p in paths:
            os.chmod(p, 0o755)


class Sandbox:
    """One child process. Not thread-safe; the parent's event loop owns it.

    Args:
        role: the child's role (compile, check, measure, verify).
        device: "cpu" or "cuda".
        config: the child's JSON config.
        log_path: its stderr goes here.
        env_extra: variables set on top of `child_env`.
        policy: sandbox layers and limits (None: policy_from_env()).
        shared_dirs: directories all children may write (the Triton cache).
        jailed: False for trusted roles (the verifier runs no kernel code): plain child process.
    """

    def __init__(self, role: str, device: str, config: dict, log_path: Path, env_extra: dict | None = None,
                 policy: SandboxPolicy | None = None, shared_dirs: tuple[Path, ...] = (), jailed: bool = True):
        self.role = role
        self.device = device
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.policy = policy_from_env(policy)
        self.jailed = jailed
        self.marker = secrets.token_hex(8)
        self.uid: int | None = None
        self.report = probe(self.policy, device) if jailed else LayerReport(())
        if jailed and "uid" in self.report.layers:
            self.uid = _UIDS.take(self.policy.uid_base)
        if jailed and "uid" not in self.report.layers:
            # Same uid as ours: without this a child reads /proc/<our pid>/environ (Landlock does
            # not stop it) and could ptrace us.
            hide_from_children()
        _remove_stale_private_dirs()
        self.private_dir = Path(tempfile.mkdtemp(prefix=f"kc-{role}-{os.getpid()}-", dir=private_root()))
        if self.uid is not None:
            os.chown(self.private_dir, self.uid, self.policy.gid)
        for d in shared_dirs:
            prepare_shared_dir(Path(d), self.policy)
        _become_subreaper()
        self._log = open(self.log_path, "ab")
        argv = [sys.executable, "-P", "-m", "pipelines.profiling.child", "--role", role, "--config", json.dumps(config)]
        if jailed:
            # Without a shared cache given, a Triton cache of its own: what one kernel writes there
            # never reaches another child (nor the caller's own TRITON_CACHE_DIR or ~/.triton).
            env_extra = {"TRITON_CACHE_DIR": str(self.private_dir / "triton-cache"), **(env_extra or {})}
        env = child_env(device, env_extra, self.private_dir, self.marker)
        if jailed:
            policy_now = replace(self.policy, layers=tuple(x for x in self.report.layers if x in WANTED_LAYERS))
            spec = _jail_spec(policy_now, device, self.private_dir, self.uid, tuple(Path(d) for d in shared_dirs))
            argv = [sys.executable, "-I", "-S", str(JAIL), json.dumps(spec), "--", *argv]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            cwd=str(self.private_dir),
            start_new_session=True,  # its own process group: we can kill whatever it spawned
        )
        # Wrap duplicates of the pipe fds; Connection closes what it owns.
        self._tx = Connection(os.dup(self.proc.stdin.fileno()), readable=False)
        self._rx = Connection(os.dup(self.proc.stdout.fileno()), writable=False)
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.started_at = time.monotonic()
        self.ready = False  # set when the child's "ready" message arrives
        self.info: dict = {}  # what the child said when ready (e.g. the hardware fingerprint)
        self.job: Any = None  # the job in flight, if any
        self.job_key: str | None = None  # the verifier's name for the job in flight
        self.deadline: float | None = None  # monotonic time after which the job counts as hung
        self.jobs_done = 0
        self.phase = ""  # the measuring child's last progress step, for timeout messages
        self.compile_s: float | None = None  # compile seconds of the job in flight (measuring child)
        self.job_started: float | None = None
        self.threads_at_job: set[int] | None = None  # the child's threads when its job was sent
        self._dead = False

    @property
    def layers(self) -> str:
        """The sandbox layers the child reported when ready (comma-separated), else the probe's."""
        got = self.info.get("sandbox")
        layers = got.split(",") if isinstance(got, str) and got else list(self.report.layers)
        if self.jailed and "pidns" not in layers and "pgkill" not in layers:
            layers.append("pgkill")
        return ",".join(dict.fromkeys(layers))

    # ---- channel -------------------------------------------------------------------------
    @property
    def conn(self) -> Connection:
        """What multiprocessing.connection.wait() waits on."""
        return self._rx

    def send(self, msg: dict) -> None:
        if msg.get("type") == "job" and self.jailed:
            self.threads_at_job = self.threads()  # what is new at the result is the kernel's
        try:
            self._tx.send_bytes(json.dumps(msg).encode())
        except (OSError, ValueError) as e:
            raise ChildDied(self.exit_reason()) from e

    def recv(self) -> dict:
        """The child's next message, its length and nesting checked before it is decoded.

        Raises:
            RefusedMessage: too long, too deep or not a JSON object (kernel code wrote to the channel).
            ChildDied: the child is gone.
        """
        try:
            raw = self._rx.recv_bytes(MAX_MESSAGE_BYTES)  # a longer one is refused unread
        except OSError as e:
            if e.args == ("bad message length",):
                raise RefusedMessage(f"sent a message over {MAX_MESSAGE_BYTES} bytes on the harness's channel") from e
            raise ChildDied(self.exit_reason()) from e
        except EOFError as e:
            raise ChildDied(self.exit_reason()) from e
        try:
            msg = loads_bounded(raw)
        except RefusedJSON as e:
            raise RefusedMessage(f"sent a message the harness refuses ({e})") from e
        except ValueError as e:
            raise RefusedMessage(f"sent a malformed message ({one_line(e)})") from e
        if not isinstance(msg, dict):
            raise RefusedMessage("sent a message that is not an object")
        return msg

    def accept_ready(self, msg: dict) -> str | None:
        """Take the child's "ready" message (it carries the sandbox layers for the rows); None, or
        why it is refused: the harness sends one, before any kernel, so a second is kernel code."""
        if self.ready:
            return "sent a second 'ready' message on the harness's channel"
        info = msg.get("info")
        self.ready, self.info = True, info if isinstance(info, dict) else {}
        return None

    def poll(self, timeout: float = 0.0) -> bool:
        try:
            return self._rx.poll(timeout)
        except (OSError, ValueError):
            return True  # a closed channel reads as "something happened"; recv() will say what

    def request(self, msg: dict, timeout_s: float) -> dict:
        """Send and wait for the reply, skipping progress messages; raises TimeoutError or ChildDied."""
        self.send(msg)
        end = time.monotonic() + timeout_s
        while True:
            left = end - time.monotonic()
            if left <= 0 or not self.poll(left):
                raise TimeoutError(f"no answer within {timeout_s:.0f} s")
            reply = self.recv()
            if reply.get("type") != "progress":
                return reply

    def wait_ready(self, timeout_s: float) -> dict:
        """Block until the child has imported its stack; returns its 'ready' info."""
        if not self.poll(timeout_s):
            raise TimeoutError(f"{self.role} worker did not start within {timeout_s:.0f} s")
        msg = self.recv()
        if msg.get("type") != "ready":
            raise ChildDied(msg.get("error") or f"unexpected first message {msg.get('type')!r}")
        self.accept_ready(msg)
        return self.info

    # ---- resources -----------------------------------------------------------------------
    def _own_namespace(self) -> str | None:
        """The PID namespace the jail made for this child (None without one)."""
        if "pidns" not in self.report.layers or self.proc.poll() is not None:
            return None
        if not hasattr(self, "_pidns"):
            ns = _pid_namespace(self.proc.pid, "pid_for_children")
            self._pidns = ns if ns and ns != _pid_namespace(os.getpid()) else None
        return self._pidns

    def tree(self, scan: list[ProcInfo] | None = None) -> list[ProcInfo]:
        """Processes that belong to this child: its uid's, else its PID namespace's, else its
        process group's (and, without a namespace, those carrying its marker)."""
        scan = scan_processes() if scan is None else scan
        if self.uid is not None:
            return [p for p in scan if p.uid == self.uid]
        ns = self._own_namespace()
        if ns is not None:
            return [p for p in scan if p.pidns == ns or p.pid == self.proc.pid]
        me = os.getpid()
        return [p for p in scan if p.pid != me and (p.pgid == self.proc.pid or _has_marker(p.pid, self.marker))]

    def tree_pids(self) -> list[int]:
        return [p.pid for p in self.tree()]

    def main_pids(self) -> set[int]:
        """The child itself: the jail's process and, in a PID namespace, its first process."""
        pids = {self.proc.pid}
        if "pidns" in self.report.layers:
            try:
                with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                    pids.update(int(x) for x in f.read().split())
            except OSError:
                pass
        return pids

    def stray_pids(self) -> list[int]:
        """Live processes of this child's tree other than the child: what a kernel left running."""
        if not self.jailed or self.proc.poll() is not None:
            return []
        main = self.main_pids()
        return [p.pid for p in self.tree() if p.pid not in main and not p.zombie]

    def threads(self) -> set[int]:
        """Thread ids of the child's own processes (read from /proc: nothing the kernel can patch)."""
        out: set[int] = set()
        for pid in self.main_pids():
            try:
                out.update(int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit())
            except OSError:
                pass
        return out

    def leftovers(self, python_threads_left: Any = None) -> tuple[str | None, bool]:
        """(what the job just answered left running in the child, whether it is the kernel's doing).

        Processes beside the child, or threads it did not have when the job was sent (read from
        /proc, which no kernel can patch): either way the child must be replaced before another
        kernel runs in it, since a thread keeps running kernel code. A process left behind is the
        kernel's doing; a thread is not blamed: libraries start pools of their own on first use
        (torch.compile's compile workers, Triton's autotuner), so a correct kernel may leave one,
        and replacing the child is what keeps it from the next kernel (`python_threads_left`, the
        child's own count of Python threads, goes into the note).
        """
        strays = self.stray_pids()
        if strays:
            return f"left {len(strays)} process(es) running after its job", True
        if self.threads_at_job is None or self.proc.poll() is not None:
            return None, False
        new = [t for t in self.threads() - self.threads_at_job if _status(t).get("State", "Z")[:1] not in ("Z", "X", "")]
        if not new:
            return None, False
        python = python_threads_left if isinstance(python_threads_left, int) and python_threads_left > 0 else 0
        return f"left {len(new)} thread(s) running after its job ({python} running Python)", False

    def private_usage(self) -> tuple[int, int]:
        """(bytes, entries) in the private directory, counting at most policy.private_files + 1
        entries: on /dev/shm its files are host memory, outside every limit of the child."""
        total = n = 0
        stack = [str(self.private_dir)]
        while stack and n <= self.policy.private_files:
            try:
                entries = os.scandir(stack.pop())
            except OSError:
                continue
            with entries:
                for entry in entries:
                    n += 1
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    if n > self.policy.private_files:
                        break
        return total, n

    def over_limits(self, scan: list[ProcInfo] | None = None) -> str | None:
        """Why the child must be killed for what it uses, or None: the files of its private
        folder, resident memory on CUDA (where no address-space limit can be set), its
        processes and threads."""
        if not self.jailed:
            return None
        files, entries = self.private_usage()
        if entries > self.policy.private_files:
            return f"more than {self.policy.private_files} files in its private folder"
        limit = self.policy.cuda_memory_bytes if self.device == "cuda" else self.policy.memory_bytes
        if files > limit:
            return f"{files / GIB:.1f} GiB of files in its private folder, over the sandbox limit of {limit / GIB:.0f} GiB"
        watch_memory = self.device == "cuda" and "rlimits" in self.report.layers
        # Also where RLIMIT_NPROC holds: it stops a fork bomb only at the limit, and forking a
        # process of a GiB a hundred times takes longer than a job may on a loaded host.
        watch_tasks = True
        tree = self.tree(scan)
        rss, tasks = sum(p.rss_bytes for p in tree), sum(p.threads for p in tree)
        if watch_memory and rss + files > self.policy.cuda_memory_bytes:
            return (f"used {(rss + files) / GIB:.1f} GiB of host memory (its files included), over the sandbox "
                    f"limit of {self.policy.cuda_memory_bytes / GIB:.0f} GiB")
        if watch_tasks and tasks > self.policy.processes:
            return f"{tasks} processes and threads, over the sandbox limit of {self.policy.processes}"
        return None

    # ---- life and death ------------------------------------------------------------------
    def alive(self) -> bool:
        return self.proc.poll() is None

    def exit_reason(self) -> str:
        """How the child ended, with the last meaningful line of its log (e.g. the fault)."""
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            pass
        reason = f"worker died ({describe_exit(self.proc.returncode)})"
        tail = self.log_tail()
        return f"{reason}: {tail}" if tail else reason

    def log_tail(self, max_chars: int = 200) -> str:
        """The most telling line of the child's log: a 'Fatal Python error' or else the last line."""
        try:
            self._log.flush()
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - 8192))
                lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines()
                         if ln.strip() and not ln.startswith(jail.NOTES_PREFIX)]
        except OSError:
            return ""
        fatal = [ln for ln in lines if ln.startswith("Fatal Python error")]
        line = fatal[-1] if fatal else (lines[-1] if lines else "")
        return line[:max_chars]

    def kill(self) -> None:
        """SIGKILL the child's whole process tree, reap it, remove its private directory. Idempotent."""
        if self._dead:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a process stuck in the driver; the OS will reap it
            pass
        self._sweep()
        self._dead = True
        self.close()
        shutil.rmtree(self.private_dir, ignore_errors=True)
        if self.uid is not None:
            _UIDS.give_back(self.uid)

    def _sweep(self) -> None:
        """End what escaped the process group (a setsid grandchild): by uid, else by marker."""
        if not self.jailed:
            return
        for _ in range(3):  # a process may fork while we kill its parent
            if self.uid is not None:
                left = processes_of_uid(self.uid)
            else:
                me = os.getpid()
                left = [p for p in _pids() if p != me and (_process_group(p) == self.proc.pid
                                                          or _has_marker(p, self.marker))]
            left = [p for p in left if not _is_zombie(p)]
            if not left:
                return
            kill_processes(left)

    def close(self) -> None:
        for c in (self._tx, self._rx):
            try:
                c.close()
            except OSError:
                pass
        try:
            self._log.close()
        except OSError:
            pass

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Ask politely, then kill."""
        if self.proc.poll() is None:
            try:
                self.send({"type": "exit"})
                self.proc.wait(timeout=timeout_s)
            except (ChildDied, subprocess.TimeoutExpired):
                pass
        self.kill()


def one_line(text: Any, limit: int = 300) -> str:
    """Collapse any message to one line of at most `limit` characters."""
    s = " | ".join(ln.strip() for ln in str(text).splitlines() if ln.strip())
    return s if len(s) <= limit else s[: limit - 3] + "..."
