"""Child processes that run untrusted kernels, and the parent's handle on them.

A child is `python -m pipelines.profiling.child --role R --config JSON`, started with
subprocess (never fork: CUDA cannot survive it) in its own session. Messages are JSON over
the child's stdin/stdout, framed by multiprocessing.connection. The child moves fd 1 onto
stderr right away, so a kernel that prints (or a C library that writes to fd 1) cannot
corrupt the channel; stderr goes to a per-child log file whose tail explains deaths.

The parent never runs kernel code: a crash, hang or CUDA fault kills only the child, which
the parent kills (SIGKILL to the whole process group) and replaces.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]  # so `-m pipelines.profiling.child` imports


class ChildDied(Exception):
    """The child exited or closed its channel; `str()` says how (exit code or signal)."""


def child_env(device: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child: interpreter mode on CPU, the repository on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a segfault leaves a Python traceback in the log
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


class Sandbox:
    """One child process. Not thread-safe; the worker's event loop owns it."""

    def __init__(self, role: str, device: str, config: dict, log_path: Path, env_extra: dict | None = None):
        self.role = role
        self.device = device
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipelines.profiling.child", "--role", role, "--config", json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=child_env(device, env_extra),
            cwd=str(REPO_ROOT),
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
        self.job: dict | None = None  # the job in flight, if any
        self.deadline: float | None = None  # monotonic time after which the job counts as hung
        self.jobs_done = 0
        self.phase = ""  # the measuring child's last progress step, for timeout messages
        self.compile_s: float | None = None  # compile seconds of the job in flight (measuring child)
        self.job_started: float | None = None

    # ---- channel -------------------------------------------------------------------------
    @property
    def conn(self) -> Connection:
        """What multiprocessing.connection.wait() waits on."""
        return self._rx

    def send(self, msg: dict) -> None:
        try:
            self._tx.send_bytes(json.dumps(msg).encode())
        except (OSError, ValueError) as e:
            raise ChildDied(self.exit_reason()) from e

    def recv(self) -> dict:
        try:
            return json.loads(self._rx.recv_bytes())
        except (EOFError, OSError) as e:
            raise ChildDied(self.exit_reason()) from e

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
        self.ready, self.info = True, msg.get("info", {})
        return self.info

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
                lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        fatal = [ln for ln in lines if ln.startswith("Fatal Python error")]
        line = fatal[-1] if fatal else (lines[-1] if lines else "")
        return line[:max_chars]

    def kill(self) -> None:
        """SIGKILL the child's whole process group and reap it. Idempotent."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a process stuck in the driver; the OS will reap it
            pass
        self.close()

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
