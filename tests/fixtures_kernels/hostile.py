"""Hostile kernels for task `tiny_scale` (y = 2x + 1): each tries to reach outside its sandbox or
to cheat its verdict or its timing.

`render(name, **params)` gives a kernel's source with its targets filled in (paths, a port, a
secret), so the tests and the fault battery (pipelines/profiling/fault_injection.py) aim them at
things they can watch.
Every kernel returns the right answer only if its attack worked, and otherwise raises with what
it observed, so an escape shows up as status ok and containment as a failure kind; the tests
also check the targets themselves (files unchanged, no connection, no surviving process).

KINDS: kernel name -> failure kinds accepted (on the CPU path; the GPU path accepts the same).
"""

from __future__ import annotations

import os
import socket
import threading


class Listener:
    """A TCP and a UDP socket on the host's loopback; records whatever reaches them (the
    network kernels aim at its port: containment means it hears nothing from them)."""

    def __init__(self) -> None:
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen()
        self.tcp.settimeout(0.2)
        self.port = self.tcp.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", self.port))
        self.udp.settimeout(0.2)
        self.got: list[str] = []
        self.stop = False
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._accept, self._recv)]
        for t in self.threads:
            t.start()

    def _accept(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.tcp.accept()
                self.got.append("tcp " + conn.recv(64).decode(errors="replace"))
                conn.close()
            except OSError:
                continue

    def _recv(self) -> None:
        while not self.stop:
            try:
                self.got.append("udp " + self.udp.recv(64).decode(errors="replace"))
            except OSError:
                continue

    def close(self) -> None:
        self.stop = True
        for t in self.threads:
            t.join(timeout=2)
        self.tcp.close()
        self.udp.close()


def escapees(marker: str) -> list[int]:
    """Pids of the processes whose command line carries `marker` (the setsid kernel's: one
    still running got out of its sandbox's process tree)."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except (OSError, ValueError):  # gone meanwhile, or not a process folder
            pass
    return found


PRELUDE = '''
import os, sys, time
import torch


def _right(data):
    return data * 2.0 + 1.0
'''

SOURCES: dict[str, str] = {
    # Writes outside the private directory: a world-writable folder, the repository, /tmp.
    "write_outside": '''
def custom_kernel(data):
    done, denied = [], []
    for target in {targets!r}:
        try:
            with open(target, "w") as f:
                f.write("escaped")
            done.append(target)
        except OSError as e:
            denied.append(type(e).__name__)
    if done:
        return _right(data)
    raise PermissionError("writes denied: " + ",".join(denied))
''',
    # A TCP connection to a server on the host's loopback, and a UDP datagram to it.
    "network": '''
import socket


def custom_kernel(data):
    try:
        with socket.create_connection(("127.0.0.1", {port}), timeout=2) as s:
            s.sendall(b"escaped")
        return _right(data)
    except OSError as e:
        tcp = type(e).__name__
    try:
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"escaped", ("127.0.0.1", {port}))
        udp = "sent"
    except OSError as e:
        udp = type(e).__name__
    raise ConnectionError(f"tcp {{tcp}}, udp {{udp}}")
''',
    # Secrets of the parent: its environment variables, read directly or through /proc.
    "env_secrets": '''
def custom_kernel(data):
    found = [k for k, v in os.environ.items() if {secret!r} in v or k == "KERNELCAST_HOME"]
    for pid in [os.getppid(), 1] + sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{{pid}}/environ", "rb") as f:
                if {secret!r}.encode() in f.read():
                    found.append(f"/proc/{{pid}}/environ")
        except OSError:
            pass
    if found:
        return _right(data)
    raise LookupError(f"no secret; KERNELCAST_HOME {{'set' if 'KERNELCAST_HOME' in os.environ else 'absent'}}")
''',
    # Memory until the sandbox stops it (bounded, so an unsandboxed run cannot take the host down).
    "memory_bomb": '''
def custom_kernel(data):
    hoard = []
    for _ in range({chunks}):
        block = bytearray(256 * 2**20)  # zero-filled: the pages are really touched
        hoard.append(block)
    time.sleep(3)  # an escape holds the memory long enough for a watchdog to see it
    return _right(data)
''',
    # Processes until the sandbox stops it (bounded); each one lingers.
    "fork_bomb": '''
def custom_kernel(data):
    born = 0
    for _ in range({forks}):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        born += 1
    time.sleep(3)  # an escape keeps them all alive long enough for a watchdog to see them
    return _right(data)
''',
    # A grandchild detached with setsid(), meant to outlive the check.
    "setsid_escape": '''
def custom_kernel(data):
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", {marker!r}])
        os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.5)
    raise RuntimeError("escapee started")
''',
    # The warehouse: rewrite, truncate or delete the DuckDB file and its folder.
    "warehouse_tampering": '''
def custom_kernel(data):
    path = {warehouse!r}
    attempts = []
    for how in ("append", "truncate", "remove", "rename"):
        try:
            if how == "append":
                with open(path, "ab") as f:
                    f.write(b"999.0")
            elif how == "truncate":
                os.truncate(path, 0)
            elif how == "remove":
                os.remove(path)
            else:
                os.rename(os.path.dirname(path), os.path.dirname(path) + ".moved")
            return _right(data)
        except OSError as e:
            attempts.append(f"{{how}} {{type(e).__name__}}")
    raise PermissionError("; ".join(attempts))
''',
    # Replace the harness's check and torch's comparison, then return a wrong answer.
    "patched_check": '''
import pipelines.profiling.runner as runner
import pipelines.profiling.verify as verify

always = lambda *a, **k: (True, "ok")
verify.judge = always
runner.check_case = lambda *a, **k: None
torch.allclose = lambda *a, **k: True
torch.isclose = lambda a, b, **k: torch.ones_like(a, dtype=torch.bool)


def custom_kernel(data):
    return torch.zeros_like(data)
''',
    # Patch the op the reference uses, so an in-process reference agrees with a wrong answer.
    "patched_reference_op": '''
_mul = torch.Tensor.__mul__
torch.Tensor.__mul__ = lambda self, other: torch.zeros_like(self) if not isinstance(other, torch.Tensor) else _mul(self, other)
lib = torch.library.Library("aten", "IMPL")
lib.impl("add.Tensor", lambda a, b, alpha=1: torch.zeros_like(a), "CPU")


def custom_kernel(data):
    return torch.ones_like(data)
''',
    # On its first call, make the clocks read slow (9x the reference's time) and fast for itself.
    "patched_timer": '''
_patched = []


def _patch():
    real = time.perf_counter
    state = {{"t": real()}}

    def fast():  # time passes at a ninth of its speed
        now = real()
        state["t"] += (now - state.setdefault("last", now)) / 9
        state["last"] = now
        return state["t"]

    time.perf_counter = fast
    if torch.cuda.is_available():
        orig = torch.cuda.Event.elapsed_time
        torch.cuda.Event.elapsed_time = lambda self, other: orig(self, other) / 9
    _patched.append(1)


def custom_kernel(data):
    if not _patched:
        _patch()
    return _right(data)
''',
    # Return the reference's own output, found in memory (the harness's, if it ever computed one here).
    "reference_output_returned": '''
import gc


def custom_kernel(data):
    for obj in reversed(gc.get_objects()):
        if isinstance(obj, torch.Tensor) and obj is not data and obj.shape == data.shape \\
                and obj.dtype == data.dtype and obj.data_ptr() != data.data_ptr():
            return obj
    return torch.empty_like(data)  # left-over memory, if anything correct was ever freed
''',
    # Cache the answer by the input's shape: right on the first seed, wrong on a new one.
    "shape_keyed_caching": '''
_cache = {{}}


def custom_kernel(data):
    key = tuple(data.shape)
    if key not in _cache:
        _cache[key] = _right(data)
    return _cache[key]
''',
    # Cache the answer by the input's address: the timed loop reuses one buffer.
    "address_keyed_caching": '''
_cache = {{}}


def custom_kernel(data):
    key = (data.data_ptr(), tuple(data.shape))
    if key not in _cache:
        _cache[key] = _right(data)
    return _cache[key]
''',
    # GPU only: the work goes to a side stream the timing events do not see.
    "side_stream": '''
_side = torch.cuda.Stream() if torch.cuda.is_available() else None


def custom_kernel(data):
    out = torch.empty_like(data)
    if _side is None:
        return _right(data)
    _side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(_side):
        x = data
        for _ in range(200):  # enough device work for the wall clock to see
            x = x * 1.0
        out.copy_(x * 2.0 + 1.0)
    return out
''',
}

# name -> failure kinds accepted. None would mean status ok: no hostile kernel may get it.
KINDS: dict[str, tuple[str, ...]] = {
    "write_outside": ("runtime_error",),
    "network": ("runtime_error",),
    "env_secrets": ("runtime_error",),
    "memory_bomb": ("runtime_error", "crashed"),
    "fork_bomb": ("runtime_error", "crashed", "tampered"),
    "setsid_escape": ("tampered", "runtime_error"),
    "warehouse_tampering": ("runtime_error",),
    "patched_check": ("tampered",),
    "patched_reference_op": ("tampered",),
    "patched_timer": ("tampered",),
    "reference_output_returned": ("incorrect",),
    "shape_keyed_caching": ("incorrect",),
    "address_keyed_caching": ("incorrect",),
    "side_stream": ("tampered",),
}
CPU_ONLY_OK = ("side_stream",)  # no CUDA on the CPU path: the kernel just computes the answer
TIMING_KINDS = ("patched_timer", "address_keyed_caching", "side_stream")  # need the measuring path


# ---- timed-call cheats: kernels that tell a timed call from a checked one, or fake the timing ----
# Each worked against the harness of 2026-12-01 (status ok, inflated speedup); each must now end
# `tampered` or `incorrect`, on the CPU path and the GPU path.
SOURCES.update({
    # Idles (returns uninitialised memory, no work) while a time_* function is on its stack or
    # when called straight after its previous call, as in a timed loop; right otherwise.
    "frame_walk_idler": '''
_last = [0.0]


def _timed():
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name.startswith("time_"):
            return True
        f = f.f_back
    return False


def custom_kernel(data):
    try:
        if _timed() or time.monotonic() - _last[0] < 0.005:
            return torch.empty_like(data)
        return _right(data)
    finally:
        _last[0] = time.monotonic()
''',
    # Makes the clock run at a fifth of its speed, then asks the integrity watch to re-base.
    "clock_patch_rebase": '''
import pipelines.profiling.runner as runner

_done = []


def custom_kernel(data):
    if not _done:
        real = time.perf_counter
        t0 = real()
        time.perf_counter = lambda: t0 + (real() - t0) / 5
        if runner.WATCH.watch is not None:
            runner.WATCH.watch.rebase()
        _done.append(1)
    return _right(data)
''',
    # Switches the integrity watch off, then slows the clock.
    "watch_disabled": '''
import pipelines.profiling.runner as runner

runner.WATCH.watch = None
_real = time.perf_counter
_t0 = _real()
time.perf_counter = lambda: _t0 + (_real() - _t0) / 5


def custom_kernel(data):
    return _right(data)
''',
    # Patches the measuring child's timing method at class level: the reference looks 5x slower.
    "measurer_time_fn_patched": '''
import dataclasses

import pipelines.profiling.runner as runner

_orig = runner.Measurer.time_fn


def _slow_reference(self, fn, data):
    t = _orig(self, fn, data)
    return dataclasses.replace(t, median_ms=t.median_ms * 5, mean_ms=t.mean_ms * 5)


runner.Measurer.time_fn = _slow_reference


def custom_kernel(data):
    return _right(data)
''',
    # Patches Timing.as_dict at class level: every timing reported is a fifth of the truth.
    "timing_as_dict_patched": '''
from pipelines.profiling.timing import Timing

Timing.as_dict = lambda self: {{"median_ms": self.median_ms / 5, "mean_ms": self.mean_ms / 5,
                                "stderr_ms": self.stderr_ms / 5, "reps": self.reps}}


def custom_kernel(data):
    return _right(data)
''',
    # Rewrites the timing loop's list of recorded times (found on its stack or in the generators
    # its frames hold) to a fifth; where it finds none, slows the clock instead.
    "timing_list_rewritten": '''
import types

_patched = []


def _frames():
    f = sys._getframe(1)
    while f is not None:
        yield f
        for v in list(f.f_locals.values()):
            g = v
            while isinstance(g, types.GeneratorType) and g.gi_frame is not None:
                yield g.gi_frame
                g = g.gi_yieldfrom
        f = f.f_back


def custom_kernel(data):
    out = _right(data)
    hit = False
    for f in _frames():
        times = f.f_locals.get("times")
        if isinstance(times, list) and times:
            times[:] = [t / 5 for t in times]
            hit = True
    if not hit and not _patched:
        real = time.perf_counter
        t0 = real()
        time.perf_counter = lambda: t0 + (real() - t0) / 5
        _patched.append(1)
    return out
''',
    # A memo keyed by the input's content: the first two calls of a shape compute, later ones
    # return the memo, and on a miss gamble that the values repeat (as they did in a timed loop).
    "content_keyed_memo": '''
import hashlib

_memo = {{}}
_calls = {{}}


def custom_kernel(data):
    shape = tuple(data.shape)
    key = (shape, hashlib.sha1(data.detach().cpu().numpy().tobytes()).hexdigest())
    _calls[shape] = _calls.get(shape, 0) + 1
    if key in _memo:
        return _memo[key]
    if _calls[shape] <= 2:
        _memo[key] = _right(data)
        return _memo[key]
    return next(v for k, v in reversed(list(_memo.items())) if k[0] == shape)
''',
    # Honest itself, but leaves a clock at a fifth of its speed for the next kernel of its
    # process: a finalizer that runs when the harness empties the kernel's module.
    "clock_saboteur": '''
import weakref


class _Fuse:
    pass


_fuse = _Fuse()


def _sabotage(time=time):  # its own reference: the module's globals are gone when it runs
    real = time.perf_counter
    t0 = real()
    time.perf_counter = lambda: t0 + (real() - t0) / 5


weakref.finalize(_fuse, _sabotage)


def custom_kernel(data):
    return _right(data)
''',
})
KINDS.update({
    "frame_walk_idler": ("tampered", "incorrect"),
    "clock_patch_rebase": ("tampered",),
    "watch_disabled": ("tampered",),
    "measurer_time_fn_patched": ("tampered",),
    "timing_as_dict_patched": ("tampered",),
    "timing_list_rewritten": ("tampered",),
    "content_keyed_memo": ("tampered", "incorrect"),
    "clock_saboteur": ("tampered",),
})
TIMED_CALL_CHEATS = ("frame_walk_idler", "clock_patch_rebase", "watch_disabled", "measurer_time_fn_patched",
                     "timing_as_dict_patched", "timing_list_rewritten", "content_keyed_memo", "clock_saboteur")
TIMING_KINDS = TIMING_KINDS + TIMED_CALL_CHEATS  # need the measuring path


def render(name: str, **params) -> str:
    """The source of hostile kernel `name` with its parameters filled in.

    Params: targets (paths to write), port, secret, chunks (256 MiB blocks), forks, marker,
    warehouse (a file to tamper with).
    """
    defaults = {"targets": [], "port": 9, "secret": "no-secret", "chunks": 24, "forks": 600, "marker": "kc-escapee",
                "warehouse": "/nonexistent/warehouse.duckdb"}
    return PRELUDE + SOURCES[name].format(**{**defaults, **params})
