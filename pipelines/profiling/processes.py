"""What the sandbox's parent reads of the host's processes through /proc, and how it ends them.

One pass over /proc serves the limit checks of every child (`scan_processes`); a child's
processes are found by its process group, its uid or the marker in its environment
(`MARKER_ENV`), also after a `setsid` took them out of the group; `kill_processes` SIGKILLs and
reaps them. Standard library only (the GPU worker's floor).
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

MARKER_ENV = "KERNELCAST_SANDBOX_ID"  # each child's environment carries its marker


def status_of(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return {}


def all_pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def processes_of_uid(uid: int) -> list[int]:
    """Live processes whose real uid is `uid`."""
    out = []
    for pid in all_pids():
        uids = status_of(pid).get("Uid", "").split()
        if uids and int(uids[0]) == uid:
            out.append(pid)
    return out


def process_group(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def pid_namespace(pid: int, link: str = "pid") -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{link}")
    except OSError:
        return None


def is_zombie(pid: int) -> bool:
    return status_of(pid).get("State", "Z").startswith(("Z", "X"))


class ProcInfo:
    """What the parent reads about one process in one pass over /proc: its status file at once;
    its process group and PID namespace (two more reads) only when asked, which only the
    searches for a child's processes without a uid of their own do. Every kernel's end reads a
    scan, so its cost is on the measuring path (tens of milliseconds a kernel with three reads
    per process)."""

    __slots__ = ("pid", "uid", "rss_bytes", "threads", "zombie", "_pgid", "_pidns")
    _UNREAD = object()

    def __init__(self, pid: int, uid: int, rss_bytes: int, threads: int, zombie: bool):
        self.pid, self.uid, self.rss_bytes, self.threads, self.zombie = pid, uid, rss_bytes, threads, zombie
        self._pgid = self._pidns = ProcInfo._UNREAD

    @property
    def pgid(self) -> int | None:
        if self._pgid is ProcInfo._UNREAD:
            self._pgid = process_group(self.pid)
        return self._pgid

    @property
    def pidns(self) -> str | None:
        if self._pidns is ProcInfo._UNREAD:
            self._pidns = pid_namespace(self.pid)
        return self._pidns


def scan_processes() -> list[ProcInfo]:
    """Every process of the host, read once (the limit checks of all children share one scan)."""
    out = []
    for pid in all_pids():
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                text = f.read()
        except OSError:
            continue
        uid = _field(text, b"Uid")
        kb = _field(text, b"VmRSS")
        n = _field(text, b"Threads")
        out.append(ProcInfo(pid, int(uid) if uid.isdigit() else -1, int(kb) * 1024 if kb.isdigit() else 0,
                            int(n) if n.isdigit() else 1, _field(text, b"State")[:1] in (b"Z", b"X", b"")))
    return out


def _field(status: bytes, name: bytes) -> bytes:
    r"""The first word of a /proc/<pid>/status field (b"" when absent): a dict of every line
    costs six times the read itself.

    >>> _field(b"Name:\tx\nState:\tS (sleeping)\nUid:\t1000\t1000\t1000\t1000\n", b"Uid")
    b'1000'
    """
    at = status.find(b"\n" + name + b":")
    if at < 0:
        return b""
    end = status.find(b"\n", at + 1)
    words = status[at + len(name) + 2: end if end >= 0 else None].split()
    return words[0] if words else b""


def has_marker(pid: int, marker: str) -> bool:
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
            state = status_of(pid).get("State", "")
            if not state or state.startswith("Z"):
                break
            time.sleep(0.01)
        try:
            os.waitpid(pid, os.WNOHANG)  # reap orphans reparented to us (subreaper)
        except (ChildProcessError, OSError):
            pass


def become_subreaper() -> None:
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
