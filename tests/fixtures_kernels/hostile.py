"""Hostile kernels for task `tiny_scale` (y = 2x + 1): each tries to reach outside its sandbox or
to cheat its verdict or its timing.

`render(name, **params)` gives a kernel's source with its targets filled in (paths, a port, a
secret), so the tests and the fault battery (benchmarks/fault_injection.py) aim them at
things they can watch.
Every kernel returns the right answer only if its attack worked, and otherwise raises with what
it observed, so an escape shows up as status ok and containment as a failure kind; the tests
also check the targets themselves (files unchanged, no connection, no surviving process).

KINDS: kernel name -> failure kinds accepted (on the CPU path; the GPU path accepts the same).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
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
import pipelines.profiling.checked_calls as checked_calls
import pipelines.profiling.verify as verify

always = lambda *a, **k: (True, "ok")
verify.judge = always
checked_calls.check_case = lambda *a, **k: None
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
import pipelines.profiling.kernel_loading as kernel_loading

_done = []


def custom_kernel(data):
    if not _done:
        real = time.perf_counter
        t0 = real()
        time.perf_counter = lambda: t0 + (real() - t0) / 5
        if kernel_loading.WATCH.watch is not None:
            kernel_loading.WATCH.watch.rebase()
        _done.append(1)
    return _right(data)
''',
    # Switches the integrity watch off, then slows the clock.
    "watch_disabled": '''
import pipelines.profiling.kernel_loading as kernel_loading

kernel_loading.WATCH.watch = None
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


# ---- the sandbox escapes of issue 25 (item 2): the channel, Unix sockets, the caller's files,
# /proc, threads, the verifier's decoder, the Triton cache, /dev/shm and the private folder.
class UnixListener:
    """A Unix socket file (anyone may connect) and an abstract Unix name on the host; records
    whatever reaches them (the `unix_socket` kernel aims at both)."""

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, "kc-listener.sock")
        self.abstract = "\0kc-listener-" + os.urandom(4).hex()
        self.socks = []
        for address in (self.path, self.abstract):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(address)
            s.listen()
            s.settimeout(0.2)
            self.socks.append(s)
        os.chmod(self.path, 0o777)  # the worst case: a socket anyone may connect to
        self.got: list[str] = []
        self.stop = False
        self.threads = [threading.Thread(target=self._accept, args=(s,), daemon=True) for s in self.socks]
        for t in self.threads:
            t.start()

    def _accept(self, s: socket.socket) -> None:
        while not self.stop:
            try:
                conn, _ = s.accept()
                self.got.append(conn.recv(64).decode(errors="replace"))
                conn.close()
            except OSError:
                continue

    def close(self) -> None:
        self.stop = True
        for t in self.threads:
            t.join(timeout=2)
        for s in self.socks:
            s.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class ArgvWitness:
    """A host process whose command line carries a marker (the `proc_snoop` kernel looks for it)."""

    def __init__(self, marker: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", marker])

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


_CHANNEL = '''
import gc, json
from multiprocessing.connection import Connection


def _channel():
    """The harness's channel to the parent, found among the live objects (the measuring child
    freezes its heap after the integrity baseline, which hides it from gc.get_objects: a kernel
    can thaw it first)."""
    gc.unfreeze()
    for obj in gc.get_objects():
        if isinstance(obj, Connection) and obj.writable and not obj.closed:
            return obj
    raise LookupError("no channel found")
'''

SOURCES.update({
    # Connect to a Unix socket file on the host and to an abstract Unix name, and send to them.
    "unix_socket": '''
import socket


def custom_kernel(data):
    seen = []
    for address in ({unix_path!r}, {unix_abstract!r}):
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(2)
            s.connect(address)
            s.sendall(b"escaped")
            s.close()
            return _right(data)
        except OSError as e:
            seen.append(type(e).__name__)
    raise ConnectionError("unix sockets: " + ",".join(seen))
''',
    # Read the caller's 0600 files: keys, tokens, password hashes.
    "caller_secrets": '''
def custom_kernel(data):
    seen = []
    for path in {secret_files!r}:
        try:
            with open(path, "rb") as f:
                if f.read(4096).strip():
                    return _right(data)
            seen.append("empty")
        except OSError as e:
            seen.append(type(e).__name__)
    raise PermissionError(f"uid {{os.getuid()}}: " + ",".join(seen))
''',
    # Read other processes' command lines through /proc.
    "proc_snoop": '''
def custom_kernel(data):
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    for pid in pids:
        try:
            with open(f"/proc/{{pid}}/cmdline", "rb") as f:
                if {proc_marker!r}.encode() in f.read():
                    return _right(data)
        except OSError:
            pass
    raise LookupError(f"{{len(pids)}} processes visible, none with the marker")
''',
    # A second "ready" on the channel, to forge the row's sandbox column.
    "second_ready": _CHANNEL + '''

def custom_kernel(data):
    info = {{"sandbox": "env,tmpdir,uid,netns,pidns,mountns,landlock,forged"}}
    _channel().send_bytes(json.dumps({{"type": "ready", "info": info}}).encode())
    return _right(data)
''',
    # A message nested past the decoder's recursion limit.
    "deep_message": _CHANNEL + '''

def custom_kernel(data):
    _channel().send_bytes(b"[" * 200000)
    return _right(data)
''',
    # A message longer than any the harness sends (the parent would have to hold all of it).
    "long_message": _CHANNEL + '''

def custom_kernel(data):
    _channel().send_bytes(b" " * (6 << 20))
    return _right(data)
''',
    # A thread disguised as torch's, meant to keep running into the next kernel's job.
    "lingering_thread": '''
import threading


def _linger(sleep=time.sleep):  # bound now: the harness empties the kernel's module after its job
    while True:
        sleep(0.05)


_linger.__module__ = "torch.nn.modules.module"  # the integrity watch trusts torch's threads
_linger.__qualname__ = "Module._apply"


def custom_kernel(data):
    if not any(t.name == "kc-lingering" for t in threading.enumerate()):
        threading.Thread(target=_linger, name="kc-lingering", daemon=True).start()
    return _right(data)
''',
    # Right only where the lingering thread of an earlier kernel is still running beside it.
    "thread_survivor": '''
import threading


def custom_kernel(data):
    if any(t.name == "kc-lingering" for t in threading.enumerate()):
        return _right(data)
    raise LookupError("no thread of an earlier kernel in this process")
''',
    # A wrong answer whose output header nests past the verifier's recursion limit (json.dumps,
    # which the integrity watch does not cover, swapped for the one call), so that the verifier
    # fails instead of saying no: the kernel would be `infrastructure`, retried forever.
    "verifier_recursion": '''
import json

_real_dumps = json.dumps


def _deep_header(obj, *args, **kwargs):
    if isinstance(obj, dict) and "tree" in obj and "tensors" in obj:
        json.dumps = _real_dumps  # the one header: the channel's messages stay as they were
        return '{{"tree": ' + "[" * 100000 + "]" * 100000 + ', "tensors": []}}'
    return _real_dumps(obj, *args, **kwargs)


def custom_kernel(data):
    json.dumps = _deep_header
    return torch.zeros_like(data)
''',
    # Leave a "compiled launcher" in every Triton cache it can find outside its private folder.
    "triton_cache_write": '''
def custom_kernel(data):
    seen = []
    for var in ("KERNELCAST_TRITON_SHARED", "TRITON_CACHE_DIR"):
        folder = os.environ.get(var)
        if not folder or os.path.realpath(folder).startswith(os.getcwd()):
            seen.append(f"{{var}} private" if folder else f"{{var}} unset")
            continue
        try:
            os.makedirs(os.path.join(folder, "kc-poison"), exist_ok=True)
            with open(os.path.join(folder, "kc-poison", "__triton_launcher.so"), "wb") as f:
                f.write(b"poison")
            return _right(data)
        except OSError as e:
            seen.append(f"{{var}} {{type(e).__name__}}")
    raise PermissionError("; ".join(seen))
''',
    # Fill /dev/shm, which would count against the host's memory and no limit of the child.
    "shm_hoard": '''
def custom_kernel(data):
    names, block = [], b"x" * (64 << 20)
    try:
        for i in range({shm_mb} // 64):
            name = f"/dev/shm/kc-hoard-{{os.getpid()}}-{{i}}"
            names.append(name)
            with open(name, "wb") as f:
                f.write(block)
        return _right(data)
    except OSError as e:
        raise MemoryError(f"{{64 * (len(names) - 1)}} MiB in /dev/shm, then {{type(e).__name__}}") from None
    finally:
        for name in names:
            try:
                os.unlink(name)
            except OSError:
                pass
''',
    # Many files in its own private folder (on /dev/shm: host memory), held long enough to be seen.
    "private_hoard": '''
def custom_kernel(data):
    os.makedirs("hoard", exist_ok=True)
    for i in range({files}):
        open(f"hoard/{{i}}", "wb").close()
    time.sleep(3)
    return _right(data)
''',
})
KINDS.update({
    "unix_socket": ("runtime_error",),
    "caller_secrets": ("runtime_error",),
    "proc_snoop": ("runtime_error",),
    "second_ready": ("tampered",),
    "deep_message": ("tampered",),
    "long_message": ("tampered",),
    "lingering_thread": (None,),  # right answer; its thread ends with its child, before the next kernel
    "thread_survivor": ("runtime_error",),
    "verifier_recursion": ("incorrect",),
    "triton_cache_write": ("runtime_error",),
    "shm_hoard": ("runtime_error",),
    "private_hoard": ("crashed",),
})
MORE_DEFAULTS = {
    "unix_path": "/nonexistent/kc-listener.sock", "unix_abstract": "\0kc-no-listener", "proc_marker": "kc-no-witness",
    "secret_files": ["/etc/shadow", "/etc/gshadow", os.path.expanduser("~/.ssh/id_rsa"), os.path.expanduser("~/.netrc")],
    "shm_mb": 4096, "files": 20000,
}
_render_first = render


def render(name: str, **params) -> str:  # noqa: F811 - the first render, with this block's defaults
    """The source of hostile kernel `name` (see the first `render`); this block's kernels also take
    unix_path, unix_abstract (a Unix listener), secret_files, proc_marker, shm_mb, files."""
    return _render_first(name, **{**MORE_DEFAULTS, **params})


# ---- memos and timer sniffers: kernels that reuse an earlier answer, or find the timer -------------
# Each works honestly on its own (the same slow work as `slow_honest`, its twin) and gains only
# where the harness lets it: an input seen before, or the timer's state within reach of its frames.
# Accepted: a failure kind, or `ok` with a speedup no better than the twin's (NO_GAIN_FACTOR).
_SLOW = '''

def _slow_right(data):  # the twin's honest work: the same answer, computed WORK times
    y = data
    for _ in range({work}):
        y = data * 2.0 + 1.0
    return y


def _bounded(memo, key, value, size=8):  # a memo of the last few answers, as a real one keeps
    memo[key] = value
    while len(memo) > size:
        memo.pop(next(iter(memo)))
    return value
'''

_FRAMES = '''
import types


def _reachable_frames():
    """The callers' frames, and the frames of generators held by their locals or by the attributes
    of their locals (with each generator's delegates)."""
    todo, seen, found = [], set(), []
    f = sys._getframe(2)
    while f is not None:
        todo.append(f)
        f = f.f_back
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        found.append(f)
        values = list(f.f_locals.values())
        for v in list(values):
            for name in getattr(type(v), "__slots__", ()) or ():
                values.append(getattr(v, name, None))
            values += list(getattr(v, "__dict__", {{}}).values()) if not isinstance(v, types.ModuleType) else []
        for v in values:
            g = v
            while isinstance(g, types.GeneratorType):
                if g.gi_frame is not None:
                    todo.append(g.gi_frame)
                g = g.gi_yieldfrom
    return found


def _forge_clocks(frames):
    """Every clock reading the frames hold (a perf_counter float or a monotonic_ns int of the last
    few seconds) set to now, and every CUDA event they hold recorded again now: the call that
    has just run looks as if it took no time. True if anything was forged."""
    import ctypes

    now_s, now_ns = time.perf_counter(), time.monotonic_ns()
    forged = False
    for f in frames:
        loc = f.f_locals
        changed = False
        for name, v in list(loc.items()):
            if torch.cuda.is_available() and isinstance(v, torch.cuda.Event):
                v.record()
                forged = True
            elif type(v) is float and now_s - 5.0 < v <= now_s:
                loc[name], changed = time.perf_counter(), True
            elif type(v) is int and now_ns - 5_000_000_000 < v <= now_ns:
                loc[name], changed = time.monotonic_ns(), True
            elif isinstance(v, list) and v and all(isinstance(e, torch.cuda.Event) for e in v
                                                   if torch.cuda.is_available()) and torch.cuda.is_available():
                for e in v:
                    e.record()
                forged = True
        if changed:
            ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(f), ctypes.c_int(0))
            forged = True
    return forged
'''

SOURCES.update({
    # The honest twin of the kernels below: the same slow work on every call.
    "slow_honest": _SLOW + '''

def custom_kernel(data):
    return _slow_right(data)
''',
    # A memo per input buffer: the buffer's address, its shape and two of its values.
    "buffer_memo": _SLOW + '''
_memo = {{}}


def custom_kernel(data):
    flat = data.reshape(-1)
    key = (data.data_ptr(), tuple(data.shape), float(flat[0]), float(flat[-1]))
    if key in _memo:
        return _memo[key]
    return _bounded(_memo, key, _slow_right(data))
''',
    # A memo by the input's whole content (paper's clone inside the window moves the buffer,
    # not the values).
    "whole_content_memo": _SLOW + '''
import hashlib

_memo = {{}}


def custom_kernel(data):
    key = (tuple(data.shape), str(data.dtype), hashlib.sha1(data.detach().cpu().contiguous().numpy().tobytes()).hexdigest())
    if key in _memo:
        return _memo[key]
    return _bounded(_memo, key, _slow_right(data))
''',
    # Looks for the timer's objects (CUDA events, clock readings) in its callers' frames and in the
    # generators they hold; where it finds them, forges them once its work is done.
    "timer_frame_sniffer": _SLOW + _FRAMES + '''

def custom_kernel(data):
    out = _slow_right(data)
    _forge_clocks(_reachable_frames())
    return out
''',
    # Walks its callers' frames and the generators they hold for a `time_*` function; where it
    # finds one, its call is timed: the clock readings of the frames found are forged.
    "stack_name_walker": _SLOW + _FRAMES + '''

def custom_kernel(data):
    out = _slow_right(data)
    frames = _reachable_frames()
    if any(f.f_code.co_name.startswith("time_") for f in frames):
        _forge_clocks(frames)
    return out
''',
})
KINDS.update({name: ("tampered", "incorrect", None) for name in
              ("buffer_memo", "whole_content_memo", "timer_frame_sniffer", "stack_name_walker")})
KINDS["slow_honest"] = (None,)
NO_GAIN = ("buffer_memo", "whole_content_memo", "timer_frame_sniffer", "stack_name_walker")
NO_GAIN_TWIN = "slow_honest"
TIMING_KINDS = TIMING_KINDS + NO_GAIN + (NO_GAIN_TWIN,)  # they gain, if at all, on the measuring path
# `ok` for a NO_GAIN kernel is accepted when its time is at most this many times shorter than its
# honest twin's (the faster of two copies): on a loaded 2-core host, with three timed calls a
# case, honest runs of the same work part by up to ~1.6x; a memo's hits or forged clocks gained
# 10x and more.
NO_GAIN_FACTOR = 3.0
_MORE_DEFAULTS_2 = {"work": 200}
_render_second = render


def render(name: str, **params) -> str:  # noqa: F811 - the render above, with this block's defaults
    """The source of hostile kernel `name` (see the first `render`); this block's kernels also take
    work (how many times the slow honest work repeats the answer)."""
    return _render_second(name, **{**_MORE_DEFAULTS_2, **params})
