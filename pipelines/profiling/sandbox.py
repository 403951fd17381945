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
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pipelines.profiling import jail
from pipelines.profiling.layer_probe import LayerReport, probe
from pipelines.profiling.processes import (
    ProcInfo,
    all_pids,
    become_subreaper,
    has_marker,
    hide_from_children,
    is_zombie,
    kill_processes,
    pid_namespace,
    process_group,
    processes_of_uid,
    scan_processes,
    status_of,
)
from pipelines.profiling.sandbox_policy import (
    GIB,
    JAIL,
    UID_POOL,
    WANTED_LAYERS,
    SandboxPolicy,
    child_env,
    describe_exit,
    jail_spec,
    one_line,
    policy_from_env,
    prepare_shared_dir,
    private_root,
    remove_stale_private_dirs,
)


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
            self.uid = UID_POOL.take(self.policy.uid_base)
        if jailed and "uid" not in self.report.layers:
            # Same uid as ours: without this a child reads /proc/<our pid>/environ (Landlock does
            # not stop it) and could ptrace us.
            hide_from_children()
        remove_stale_private_dirs()
        self.private_dir = Path(tempfile.mkdtemp(prefix=f"kc-{role}-{os.getpid()}-", dir=private_root()))
        if self.uid is not None:
            os.chown(self.private_dir, self.uid, self.policy.gid)
        for d in shared_dirs:
            prepare_shared_dir(Path(d), self.policy)
        become_subreaper()
        self._log = open(self.log_path, "ab")
        argv = [sys.executable, "-P", "-m", "pipelines.profiling.child", "--role", role, "--config", json.dumps(config)]
        if jailed:
            # Without a shared cache given, a Triton cache of its own: what one kernel writes there
            # never reaches another child (nor the caller's own TRITON_CACHE_DIR or ~/.triton).
            env_extra = {"TRITON_CACHE_DIR": str(self.private_dir / "triton-cache"), **(env_extra or {})}
        env = child_env(device, env_extra, self.private_dir, self.marker)
        if jailed:
            policy_now = replace(self.policy, layers=tuple(x for x in self.report.layers if x in WANTED_LAYERS))
            spec = jail_spec(policy_now, device, self.private_dir, self.uid, tuple(Path(d) for d in shared_dirs))
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
            ns = pid_namespace(self.proc.pid, "pid_for_children")
            self._pidns = ns if ns and ns != pid_namespace(os.getpid()) else None
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
        return [p for p in scan if p.pid != me and (p.pgid == self.proc.pid or has_marker(p.pid, self.marker))]

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
        new = [t for t in self.threads() - self.threads_at_job if status_of(t).get("State", "Z")[:1] not in ("Z", "X", "")]
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
            UID_POOL.give_back(self.uid)

    def _sweep(self) -> None:
        """End what escaped the process group (a setsid grandchild): by uid, else by marker."""
        if not self.jailed:
            return
        for _ in range(3):  # a process may fork while we kill its parent
            if self.uid is not None:
                left = processes_of_uid(self.uid)
            else:
                me = os.getpid()
                left = [p for p in all_pids() if p != me and (process_group(p) == self.proc.pid
                                                          or has_marker(p, self.marker))]
            left = [p for p in left if not is_zombie(p)]
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
