"""Ahead-of-time compile features of kernel modules for a GPU we do not have (default sm_90).

Triton compiles for Hopper without a GPU: ASTSource -> ttir -> ttgir -> llir -> ptx -> cubin with
the ptxas the wheel ships. To know *what* a module launches (which @triton.jit functions, with
which constexprs, dtypes, num_warps, num_stages), we run its `custom_kernel(data)` on CPU tensors
with `JITFunction.run` replaced by a function that compiles for the target and returns without
launching. Registers and stack (spill) bytes come from `cuobjdump --dump-resource-usage` of the
cubin, dynamic shared memory from Triton's metadata.

Input: the task's FIRST BENCHMARK CASE by default (the shapes the GPU will time, so constexprs
such as BLOCK = next_power_of_2(N) match the measured run), built on the CPU once per worker and
reused; `case="correctness"` uses the last correctness case instead (small, for tests and for
tasks whose benchmark inputs are too big for the host). Kernels do not execute, so reuse is safe
unless a launcher mutates its input's shape in PyTorch.

Untrusted code runs in child processes (`python -m pipelines.generation.aot`), each a long-lived
worker speaking JSON lines on a private pipe; a compile that exceeds its time limit or kills its
worker is recorded and the worker is replaced. Nothing here raises on a bad kernel. The children
are held by `CompilePool`, which also serves the source-feature reader
(pipelines.forecasting.source_features): its children run the same loop (`serve_compile_jobs`)
with their own job handler, so starting, feeding, time limits and restarts live in one place.

Statuses:
    compiled        every launch compiled and fits the target
    compile_failed  import error, exception while launching, Triton/ptxas error, timeout, crash
    rejected        compiled (or about to) but exceeds a hardware limit: dynamic shared memory over
                    the target's per-block maximum (232448 B on sm_90; the compiler does not
                    enforce it, so we stop before ptxas), or more than 1024 threads per block
    skipped         not a Triton module (language != 'triton', e.g. the PyTorch reference)
    error           our side failed (task input could not be built, worker would not start)
Autotuned kernels (@triton.autotune) compile every config: features are the max over configs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import selectors
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (done, total)

# Max dynamic shared memory per block (opt-in), bytes, by compute capability.
SHARED_MEMORY_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448}
DEFAULT_SHARED_LIMIT = 232448
MAX_THREADS_PER_BLOCK = 1024
# SM counts shown to launchers that size persistent grids from device properties.
SM_COUNT = {80: 108, 86: 84, 89: 128, 90: 132, 100: 148}

STATUSES = ("compiled", "compile_failed", "rejected", "skipped", "error")
DEFAULT_TIMEOUT_S = 120.0  # per kernel; big tiles with heavy spilling take ptxas ~60 s
INPUT_TIMEOUT_S = 300.0  # building a benchmark input on the CPU, once per worker and case
WORKER_START_TIMEOUT_S = 120.0
MAX_JOBS_PER_WORKER = 100  # replace workers now and then: untrusted modules accumulate state

_REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Features:
    """Compile-time features of one kernel module for the target.

    Aggregates are maxima over the module's distinct compiled kernels.
    """

    status: str  # one of STATUSES
    n_regs: int | None = None  # registers per thread
    n_spills: int | None = None  # local (stack) bytes per thread / 4, as Triton's CompiledKernel
    shared_bytes: int | None = None  # dynamic shared memory per block, bytes
    n_kernels: int = 0  # distinct (function, specialisation, options) compiled
    n_launches: int = 0  # launches the module made for the input
    error: str | None = None  # one line
    seconds: float = 0.0  # wall time of this kernel's compile request
    kernels: tuple[dict, ...] = field(default=())  # per kernel: name, n_regs, stack_bytes, ...

    def to_row(self) -> dict[str, Any]:
        """Flat columns for a frame (per-kernel details as JSON)."""
        row = asdict(self)
        row["kernels"] = json.dumps(list(self.kernels), sort_keys=True)
        return row


# =============================================================================================
# Parent side: the pool of compile children
# =============================================================================================


def _one_line(text: str, limit: int = 400) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    msg = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def describe(exc: BaseException) -> str:
    """'<type>: <message>' of an exception, in one line; a Triton compile error says where in
    the kernel it arose, and what went wrong there is in its innermost cause, which is added.

    >>> try:
    ...     try:
    ...         raise AssertionError("Both operands must be same dtype. Got fp16 and bf16")
    ...     except AssertionError as inner:
    ...         raise RuntimeError("at 45:14:\\n    acc = tl.dot(p, v, acc)\\n          ^") from inner
    ... except RuntimeError as e:
    ...     describe(e)
    'RuntimeError: at 45:14: ... ^ (AssertionError: Both operands must be same dtype. Got fp16 and bf16)'
    """
    text = _one_line(f"{type(exc).__name__}: {exc}")
    root, seen = exc, {id(exc)}
    while (nxt := root.__cause__ or root.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        root = nxt
    if root is not exc and str(root).strip():
        text = _one_line(f"{text} ({type(root).__name__}: {_one_line(str(root), 200)})")
    return text


def _worker_env(cache_dir: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # the worker needs real JITFunctions, not the interpreter
    env["KERNELCAST_DEVICE"] = "cpu"  # task inputs on the CPU
    env["CUDA_VISIBLE_DEVICES"] = ""  # never touch a GPU, even on a GPU host
    env["TRITON_CACHE_DIR"] = cache_dir
    # torch.compile'd functions run as written (eager): Inductor would build the GPU code it
    # times (13 s a module on two cores) only for the trace to count the ops it fuses anyway
    env["TORCHDYNAMO_DISABLE"] = "1"
    # Nothing to add to PYTHONPATH: the child is `-m` from the repo root (the repo first on its
    # path), with this interpreter's packages and the inherited PYTHONPATH.
    return env


# request's errors for a child that gave no answer on the kernel itself
_CRASHED, _TIMED_OUT = "worker crashed", "timeout after "


def gave_no_answer(error: str | None) -> bool:
    """Whether a job's error says its child crashed or ran out of time on the kernel (request),
    so asking another child the same again would cost as much for the same outcome."""
    return bool(error) and (error == _CRASHED or error.startswith(_TIMED_OUT))


class _Worker:
    """One child process (`python -m <entry>`); requests are answered in order, one at a time."""

    def __init__(self, env: dict[str, str], entry: tuple[str, ...]):
        self.env = env
        self.command = ("-m", *entry)
        self.proc: subprocess.Popen | None = None
        self.jobs = 0
        self._buf = b""

    def _start(self) -> None:
        # untrusted modules and Triton may print: by default that is dropped (errors come back in
        # the answers); KERNELCAST_AOT_STDERR=<file> appends it there for debugging
        log_path = os.environ.get("KERNELCAST_AOT_STDERR")
        stderr = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, *self.command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=self.env,
            cwd=str(_REPO_ROOT),
        )
        if log_path:
            stderr.close()  # the child holds its own descriptor
        self.jobs = 0
        self._buf = b""
        ready = self._read(WORKER_START_TIMEOUT_S)
        if ready is None or ready.get("phase") != "ready":
            self.stop()
            raise RuntimeError("aot worker did not start")

    def stop(self) -> None:
        """Let an idle child exit at the end of its input (killed when stuck)."""
        self._end(orderly=True)

    def kill(self) -> None:
        """Stop an idle child at once, without its orderly exit (a torch process takes most of a
        second to tear down): for children whose scratch the parent removes itself."""
        self._end(orderly=False)

    def _end(self, orderly: bool) -> None:
        if self.proc is not None:
            if self.proc.poll() is None and orderly:
                try:  # a healthy worker exits at end of input; a stuck one is killed
                    self.proc.stdin.close()
                    self.proc.wait(timeout=2)
                except (OSError, subprocess.TimeoutExpired):
                    self.proc.kill()
            elif self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream:
                    stream.close()
        self.proc = None

    def _read(self, timeout_s: float) -> dict | None:
        """The next JSON line, or None on timeout or EOF (the caller tells which by poll())."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return None
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def request(self, job: dict, timeout_s: float) -> dict:
        """The child's answer to `job` as a dict with at least status, error and seconds."""
        start = time.monotonic()
        try:
            if (
                self.proc is None
                or self.proc.poll() is not None
                or self.jobs >= MAX_JOBS_PER_WORKER
            ):
                self.stop()
                self._start()
            self.jobs += 1
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
        except (RuntimeError, OSError) as exc:
            self.stop()
            return {"status": "error", "error": _one_line(f"worker: {exc}"),
                    "seconds": time.monotonic() - start}
        # phase 1: the input is built (slow only the first time per task and case)
        msg = self._read(INPUT_TIMEOUT_S)
        if msg is not None and msg.get("phase") == "input":
            # phase 2: the kernel itself, under the kernel's time limit
            t0 = time.monotonic()
            msg = self._read(timeout_s)
            if msg is None:
                crashed = self.proc.poll() is not None
                self.stop()
                what = _CRASHED if crashed else f"{_TIMED_OUT}{timeout_s:.0f} s"
                return {"status": "compile_failed", "error": what, "seconds": time.monotonic() - t0}
            msg.pop("phase", None)
            return msg
        if msg is not None:  # answered without building the input: the input failed
            msg.pop("phase", None)
            return msg
        crashed = self.proc is None or self.proc.poll() is not None
        self.stop()
        what = (
            "crashed while building the task input"
            if crashed
            else "timeout building the task input"
        )
        return {"status": "error", "error": f"aot worker {what}", "seconds": time.monotonic() - start}


# what a compile child runs: `python -m pipelines.generation.aot`, answering compile jobs
COMPILE_CHILD = ("pipelines.generation.aot",)


class CompilePool:
    """Child processes answering jobs on untrusted kernel modules, one job at a time each.

    The one pool of both readings of a module: the sm_90 compile (`compile_many`, children of
    COMPILE_CHILD) and the source features (pipelines.forecasting.source_features, its own
    child entry); each child's main loop is `serve_compile_jobs` with the reading's job handler.
    Children start on first use (torch and triton are imported once per child, a task's input
    built once per child), answer under the time limits of `_Worker.request`, are replaced when
    they die, run out of time or have answered MAX_JOBS_PER_WORKER jobs, and are stopped by
    `close` (at the end of a `with` block, when the pool is collected, or at exit), which also
    removes their scratch folder.

    Args:
        size: children at most (one per core is what a compile wants).
        entry: the child's `python -m` arguments, e.g. COMPILE_CHILD.
        cache_dir: the children's Triton cache; None: a private one in the scratch folder
            (fresh compiles, no litter in ~/.triton).
    """

    def __init__(self, size: int = 2, entry: tuple[str, ...] = COMPILE_CHILD, cache_dir: str | None = None):
        self.size = max(1, int(size))
        self.entry = tuple(entry)
        # one scratch root: the private Triton cache and every child's module files (a killed
        # child cannot clean up after itself, so the pool removes it all when it stops)
        self._root = tempfile.mkdtemp(prefix="kernelcast-compile-")
        env = _worker_env(cache_dir or os.path.join(self._root, "triton-cache"))
        env["KERNELCAST_AOT_WORKDIR"] = self._root
        self._children = tuple(_Worker(env, self.entry) for _ in range(self.size))
        self._idle = list(self._children)
        self._free = threading.Condition()  # a caller waits here while every child is busy
        self._closed = False
        self._finalizer = weakref.finalize(self, _stop_children, self._idle, self._root)

    @property
    def running(self) -> int:
        """Children started and not stopped since."""
        return sum(w.proc is not None for w in self._children)

    def run(self, jobs: list[tuple[Any, dict]], timeout_s: float, answer: Callable[[Any, dict], None],
            n_workers: int | None = None) -> None:
        """Answer each (key, job) by `answer(key, message)`, in up to n_workers children at once.

        `answer` is called one message at a time. A message has at least status and error (one
        line): the child's own answer, or the pool's when the child gave none (request's errors;
        status 'error', 'worker: ...' when its answer could not be read).
        """
        if self._closed:
            raise RuntimeError("the compile pool is closed")
        state = {"next": 0}
        lock = threading.Lock()

        def serve() -> None:
            with self._free:
                self._free.wait_for(lambda: self._idle or self._closed)
                if self._closed:
                    return
                worker = self._idle.pop()
            try:
                while True:
                    with lock:
                        n = state["next"]
                        state["next"] += 1
                    if n >= len(jobs):
                        return
                    key, job = jobs[n]
                    try:
                        msg = worker.request(job, timeout_s)
                    except Exception as exc:  # noqa: BLE001 - a garbled answer must not stop the batch
                        worker.stop()
                        msg = {"status": "error", "error": _one_line(f"worker: {type(exc).__name__}: {exc}")}
                    with lock:
                        answer(key, msg)
            finally:
                with self._free:
                    if self._closed:
                        worker.stop()
                    self._idle.append(worker)
                    self._free.notify()

        width = min(len(jobs), self.size, max(1, n_workers or self.size))
        threads = [threading.Thread(target=serve, daemon=True) for _ in range(width)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def close(self) -> None:
        """Stop the children and remove their scratch folder (a child still answering a job
        stops when its job is done)."""
        with self._free:
            self._closed = True
            self._free.notify_all()
        self._finalizer()

    def __enter__(self) -> CompilePool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _stop_children(workers: list[_Worker], root: str) -> None:
    # idle children are killed rather than asked to exit: their answers are all in, their
    # scratch is under `root`, and an orderly exit of a process holding torch took 0.8 s of
    # the 4 s `kernelcast forecast` spends on one file
    for worker in list(workers):
        worker.kill()
    shutil.rmtree(root, ignore_errors=True)


_FEATURE_KEYS = frozenset(Features.__dataclass_fields__)


def _features(msg: dict) -> Features:
    """A compile child's answer as Features (the launch log and other extras dropped)."""
    msg["kernels"] = tuple(msg.get("kernels") or ())
    return Features(**{k: v for k, v in msg.items() if k in _FEATURE_KEYS})


def compile_many(
    records: Iterable[Mapping[str, Any]],
    n_workers: int = 2,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: Progress | None = None,
    target: tuple[int, int] = (90, 32),
    case: str = "benchmark",
    cache_dir: str | None = None,
) -> list[Features]:
    """Compile features of many kernel records, in input order; never raises on a bad kernel.

    Args:
        records: mappings with 'source' and 'task' (a registry task, or one named in
            KERNELCAST_TASK_MODULES); a 'language' other than 'triton' is skipped.
        n_workers: child processes compiling in parallel (a `CompilePool` of this call).
        timeout_s: limit per kernel (after its input exists); past it the worker is killed.
        progress: called as progress(done, total).
        target: (compute capability, warp size), e.g. (90, 32) for H100/H200.
        case: 'benchmark' (first benchmark case) or 'correctness' (last correctness case).
        cache_dir: Triton cache directory; None uses a private temporary one, removed afterwards
            (fresh compiles, no litter in ~/.triton).

    Returns:
        One Features per record.
    """
    items = list(records)
    results: list[Features | None] = [None] * len(items)
    done = {"n": 0}

    def answer(i: int, feats: Features) -> None:
        results[i] = feats
        done["n"] += 1
        if progress:
            progress(done["n"], len(items))

    jobs = []
    for i, rec in enumerate(items):
        if (rec.get("language") or "triton") != "triton":
            answer(i, Features("skipped", error=f"language {rec.get('language')}: nothing to compile"))
        elif not isinstance(rec.get("source"), str) or not isinstance(rec.get("task"), str):
            answer(i, Features("error", error="record without a 'source' and 'task' text"))
        else:
            jobs.append((i, {"source": rec["source"], "task": rec["task"], "target": list(target), "case": case}))
    if jobs:
        with CompilePool(n_workers, COMPILE_CHILD, cache_dir) as pool:
            pool.run(jobs, timeout_s, lambda i, msg: answer(i, _features(msg)))
    return [r if r is not None else Features("error", error="not compiled") for r in results]


# =============================================================================================
# Child side: import, capture launches, compile for the target
# =============================================================================================


class _Rejected(Exception):
    """A hardware limit is exceeded; raised from inside triton.compile before ptxas."""


# PTX instruction classes counted per compiled kernel (static counts: instructions in the code,
# not executed ones). Each pattern is matched against an instruction's opcode (the text before
# its first operand, predicate guard removed), e.g. "ld.global.v4.b32" or "wgmma.mma_async...".
PTX_CLASSES: dict[str, str] = {
    "ld_global": r"^ld\.global\b",
    "st_global": r"^st\.global\b",
    "ld_shared": r"^ld\.shared\b",
    "st_shared": r"^st\.shared\b",
    "ldmatrix": r"^ldmatrix\b",
    "vec2": r"^(?:ld|st)\.global\S*\.v2\b",
    "vec4": r"^(?:ld|st)\.global\S*\.v4\b",
    "mma": r"^mma\b",
    "wgmma": r"^wgmma\.mma_async\b",
    "barrier": r"^(?:bar\.sync|bar\.arrive|barrier\.|bar\.warp\.sync|mbarrier\.)",
    "cp_async": r"^cp\.async\.(?:ca|cg)\b",
    "cp_async_bulk": r"^cp\.async\.bulk\b",
    "atomic": r"^(?:atom|red)\.",
    "ex2": r"^ex2\.",
    "fma": r"^fma\.",
    "cvt_fp8": r"^cvt\S*\.e[45]m[23]",
    "cvt_bf16": r"^cvt\S*\.bf16",
    "branch": r"^bra\b",
    "shfl": r"^shfl\.",
}
_PTX_COMPILED = {k: re.compile(v) for k, v in PTX_CLASSES.items()}
_PTX_OPCODE = re.compile(r"^\s*(?:@!?%\w+\s+)?([a-z][\w.:]*)", re.MULTILINE)
_WIDTH = {"8": 1, "16": 2, "32": 4, "64": 8, "128": 16}
_ELEMENT = re.compile(r"\.[busf](8|16|32|64|128)\b")


def ptx_mix(ptx: str) -> dict[str, int]:
    """Static instruction counts of one kernel's PTX by class (PTX_CLASSES), the total, and the
    bytes one thread moves per pass through the code in global loads and stores (vector width
    times element size, summed over the instructions).

    >>> m = ptx_mix("\\tld.global.v4.b32 {%r1, %r2, %r3, %r4}, [%rd1];\\n@%p1 st.global.b16 [%rd2], %rs1;\\n")
    >>> m["ld_global"], m["vec4"], m["st_global"], m["ld_global_bytes"], m["st_global_bytes"], m["instructions"]
    (1, 1, 1, 16, 2, 2)
    """
    out = dict.fromkeys(PTX_CLASSES, 0)
    out.update(instructions=0, ld_global_bytes=0, st_global_bytes=0)
    for line in ptx.splitlines():
        stripped = line.strip()
        # directives (.reg, .visible), labels ("$L__BB0_1:"), braces and comments are not code
        if not stripped or stripped[0] in ".$/{}" or stripped.endswith(":"):
            continue
        m = _PTX_OPCODE.match(stripped)
        if not m:
            continue
        op = m.group(1)
        out["instructions"] += 1
        for name, pattern in _PTX_COMPILED.items():
            if pattern.search(op):
                out[name] += 1
        if op.startswith(("ld.global", "st.global")):
            vec = 4 if ".v4" in op else 2 if ".v2" in op else 1
            size = _ELEMENT.findall(op)
            nbytes = vec * _WIDTH.get(size[-1], 4) if size else vec * 4
            out["ld_global_bytes" if op.startswith("ld.") else "st_global_bytes"] += nbytes
    return out


def _tensor_bytes(values: Iterable[Any]) -> int:
    """Bytes of the tensor arguments of one launch (what the kernel may read or write)."""
    total = 0
    for v in values:
        if hasattr(v, "data_ptr") and hasattr(v, "element_size") and hasattr(v, "numel"):
            total += int(v.numel()) * int(v.element_size())
    return total


def _grid_of(grid: Any, bound_args: dict) -> tuple[int, int, int]:
    """A launch's grid as three ints (a callable grid is given the bound arguments, as Triton)."""
    g = grid(bound_args) if callable(grid) else grid
    g = tuple(int(x) for x in (g if isinstance(g, (tuple, list)) else (g,)))
    return (g + (1, 1, 1))[:3]


class _Capture:
    """Patches Triton so that launches compile for `target` and return without running.

    With `compile=False` nothing compiles: each launch is only bound and recorded (its grid,
    warps and argument bytes), which is what a trace on fake tensors of big shapes needs.
    Every launch is logged in `launch_log` (kernel index or None, grid, programs, argument
    bytes, weight): an autotuned function's configs share one call, weight 1/configs each.
    """

    def __init__(self, capability: int, warp_size: int, workdir: str, compile: bool = True):
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, make_backend

        self.triton = triton
        self.target = GPUTarget("cuda", capability, warp_size)
        self.backend = make_backend(self.target)
        self.ASTSource = ASTSource
        self.shared_limit = SHARED_MEMORY_LIMIT.get(capability, DEFAULT_SHARED_LIMIT)
        self.workdir = workdir
        self.do_compile = compile
        self.binders: dict[int, Any] = {}
        self.compiled: dict[Any, int] = {}  # key -> index into self.kernels
        self.objects: list[Any] = []  # the CompiledKernels, returned to launchers as Triton does
        self.kernels: list[dict] = []
        self.launches = 0
        self.launch_log: list[dict] = []
        self.weight = 1.0  # of the launches being made (autotune: 1 / configs)
        self.current = "?"

    def _log(self, fn, index: int | None, grid: Any, bound_args: dict, options: Any) -> None:
        try:
            g = _grid_of(grid, bound_args)
        except Exception:  # noqa: BLE001 - an odd grid is an unknown grid, not a failed capture
            g = (0, 0, 0)
        warps = getattr(options, "num_warps", None)
        if warps is None and isinstance(options, dict):
            warps = options.get("num_warps")
        self.launch_log.append({
            "name": fn.__name__, "kernel": index, "grid": list(g), "programs": g[0] * g[1] * g[2],
            "arg_bytes": _tensor_bytes(bound_args.values()), "weight": self.weight,
            "num_warps": int(warps) if warps is not None else 4,
        })

    # -- the replacement of JITFunction.run ------------------------------------------------
    def run(self, fn, *args, grid, warmup, **kwargs):
        """A launch: compiled for the target (with `compile`) and logged, never run. A `warmup`
        call (a launcher compiling ahead to size its grid from the kernel's registers and shared
        memory) compiles and returns the compiled kernel without a launch; its launches come
        later through the stand-in driver (`direct_launch`)."""
        from triton import knobs
        from triton.runtime.jit import create_function_from_signature

        kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        if not warmup:
            for hook in fn.pre_run_hooks:
                hook(*args, **kwargs)
        binder = self.binders.get(id(fn))
        if binder is None:
            binder = self.binders[id(fn)] = create_function_from_signature(
                fn.signature, fn.params, self.backend
            )
        bound_args, specialization, options = binder(*args, **kwargs)
        if warmup:
            return self._compiled(fn, kwargs, bound_args, specialization, options)[1]
        self.launches += 1
        if not self.do_compile:
            self._log(fn, None, grid, bound_args, options)
            return None
        index, kernel = self._compiled(fn, kwargs, bound_args, specialization, options)
        self._log(fn, index, grid, bound_args, self.kernels[index])
        return kernel

    def _compiled(self, fn, kwargs, bound_args, specialization, options) -> tuple[int, Any]:
        """(index into `kernels`, CompiledKernel) of one specialisation, compiled once."""
        key = (id(fn), str(specialization), str(options))
        if key in self.compiled:
            index = self.compiled[key]
            return index, self.objects[index]
        options, signature, constexprs, attrs = fn._pack_args(
            self.backend, kwargs, bound_args, specialization, options
        )
        threads = options.num_warps * self.target.warp_size
        if threads > MAX_THREADS_PER_BLOCK:
            raise _Rejected(f"{fn.__name__}: {threads} threads per block > {MAX_THREADS_PER_BLOCK}")
        src = self.ASTSource(fn, signature, constexprs, attrs)
        self.current = fn.__name__  # for messages raised inside the compile pipeline
        kernel = self.triton.compile(src, target=self.target, options=options.__dict__)
        # torch-importing: loaded in the compile child only, not wherever aot is imported
        from pipelines.profiling.standin import cubin_resources

        n_regs, stack = cubin_resources(kernel.asm["cubin"], self.workdir)
        self.kernels.append(
            {
                "name": kernel.metadata.name,
                "n_regs": n_regs,
                "stack_bytes": stack,
                "shared_bytes": int(kernel.metadata.shared),
                "num_warps": int(kernel.metadata.num_warps),
                "num_stages": int(kernel.metadata.num_stages),
                "ptx": ptx_mix(kernel.asm.get("ptx") or ""),
            }
        )
        self.compiled[key] = len(self.kernels) - 1
        self.objects.append(kernel)
        return len(self.kernels) - 1, kernel

    def direct_launch(self, name: str, grid: tuple[int, int, int], args: tuple) -> None:
        """A compiled kernel launched by the launcher itself (`kernel[grid](...)` after `warmup`)."""
        index = next((i for i, k in enumerate(self.kernels) if k["name"] == name), None)
        self.launches += 1
        warps = self.kernels[index]["num_warps"] if index is not None else 4
        self.launch_log.append({
            "name": name, "kernel": index if self.do_compile else None, "grid": list(grid),
            "programs": grid[0] * grid[1] * grid[2], "arg_bytes": _tensor_bytes(args),
            "weight": self.weight, "num_warps": warps,
        })

    # -- the replacement of Autotuner.run: every config, no benchmarking ---------------------
    def autotune_run(self, tuner, *args, **kwargs):
        """Every config when compiling (features cover whichever the tuner would pick; of a
        tuner with more than MAX_AUTOTUNE_CONFIGS, that many spread over its list); the first one
        only when tracing (one call makes one config's launches). A config past the target's
        limits is skipped, as the autotuner skips one that runs out of resources on the GPU; the
        kernel is rejected only when every config is."""
        configs = _spread(tuner.configs, MAX_AUTOTUNE_CONFIGS) if self.do_compile else tuner.configs[:1]
        saved, ret, rejected = self.weight, None, []
        self.weight = saved / max(1, len(configs))
        try:
            for config in configs:
                try:
                    ret = tuner.fn.run(*args, **kwargs, **config.all_kwargs())
                except _Rejected as exc:
                    rejected.append(exc)
        finally:
            self.weight = saved
        if len(rejected) == len(configs) and rejected:
            raise rejected[-1]
        return ret

    def stages_hook(self, backend, stages, options, language, capability):
        """Stop before ptxas when the shared memory Triton allocated exceeds the target's limit."""
        make_ptx = stages.get("ptx")
        if make_ptx is None:
            return
        limit = self.shared_limit
        capture = self

        def checked_ptx(src, metadata):
            shared = int(metadata.get("shared") or 0)
            if shared > limit:
                raise _Rejected(f"{capture.current}: shared memory {shared} B > {limit} B")
            return make_ptx(src, metadata)

        stages["ptx"] = checked_ptx

    def __enter__(self):
        from triton import knobs
        from triton.runtime.autotuner import Autotuner
        from triton.runtime.jit import JITFunction

        capture = self
        self._saved = (JITFunction.run, Autotuner.run, knobs.runtime.add_stages_inspection_hook)

        def run(fn, *args, grid=None, warmup=False, **kwargs):
            return capture.run(fn, *args, grid=grid, warmup=warmup, **kwargs)

        def autotune_run(tuner, *args, **kwargs):
            return capture.autotune_run(tuner, *args, **kwargs)

        JITFunction.run = run
        Autotuner.run = autotune_run
        knobs.runtime.add_stages_inspection_hook = self.stages_hook
        _CAPTURES.append(self)
        return self

    def __exit__(self, *exc):
        from triton import knobs
        from triton.runtime.autotuner import Autotuner
        from triton.runtime.jit import JITFunction

        JITFunction.run, Autotuner.run, knobs.runtime.add_stages_inspection_hook = self._saved
        _CAPTURES.remove(self)
        return False


# the captures entered, innermost last: launches of compiled kernels reach the innermost
_CAPTURES: list[_Capture] = []


def _direct_launch(name: str, grid: tuple[int, int, int], args: tuple) -> None:
    if _CAPTURES:
        _CAPTURES[-1].direct_launch(name, grid, args)


# Configs of one autotuner compiled for the features: a library's tuner may list dozens (block
# sizes x warps x stages), each a full compile, which took a chunked attention kernel past the
# compile's time limit on a busy two-core host; an even spread of them keeps the range of
# registers, shared memory and instruction mix the tuner chooses from.
MAX_AUTOTUNE_CONFIGS = 8


def _spread(items: list, n: int) -> list:
    """At most `n` items, first and last included, evenly spread.

    >>> _spread(list(range(10)), 4), _spread([1, 2], 4)
    ([0, 3, 6, 9], [1, 2])
    """
    if len(items) <= n:
        return list(items)
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)]


def _resolve_task(name: str):
    # the same resolution as the profiling sandboxes: registry, or KERNELCAST_TASK_MODULES
    from pipelines.profiling.taskload import load_task

    return load_task(name)


class _ChildState:
    def __init__(self, workdir: str):
        self.workdir = workdir
        self.inputs: dict[tuple[str, str], Any] = {}
        self.n = 0

    def task_input(self, task_spec: str, case: str):
        key = (task_spec, case)
        if key not in self.inputs:
            task = _resolve_task(task_spec)
            if case == "benchmark" and task.benchmark_cases:
                chosen = dict(task.benchmark_cases[0])
            elif task.correctness_cases:
                chosen = dict(task.correctness_cases[-1])
            else:
                raise ValueError(f"task {task.name} has no cases")
            seed = chosen.pop("seed", 0)
            self.inputs.clear()  # one input alive at a time: benchmark inputs can be large
            self.inputs[key] = task.generate_input(seed=seed, **chosen)
        return self.inputs[key]

    def compile(self, source: str, data: Any, capability: int, warp_size: int) -> dict:
        import importlib.util

        import torch

        start = time.monotonic()
        self.n += 1
        name = f"kernelcast_aot_{os.getpid()}_{self.n}"
        path = os.path.join(self.workdir, name + ".py")
        with open(path, "w") as f:
            f.write(source)

        def result(status: str, error: str | None = None, cap: _Capture | None = None) -> dict:
            kernels = cap.kernels if cap else []
            return {
                "status": status,
                "n_regs": max((k["n_regs"] for k in kernels), default=None),
                "n_spills": max((k["stack_bytes"] // 4 for k in kernels), default=None),
                "shared_bytes": max((k["shared_bytes"] for k in kernels), default=None),
                "n_kernels": len(kernels),
                "n_launches": cap.launches if cap else 0,
                "error": error,
                "seconds": time.monotonic() - start,
                "kernels": kernels,
                "launch_log": cap.launch_log if cap else [],
            }

        try:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # triton.jit reads the source through the module
            spec.loader.exec_module(module)
        except BaseException as exc:  # noqa: BLE001 - untrusted code: anything is a compile failure
            sys.modules.pop(name, None)
            return result("compile_failed", _one_line(f"import: {type(exc).__name__}: {exc}"))
        try:
            fn = getattr(module, "custom_kernel", None)
            if not callable(fn):
                return result("compile_failed", "module defines no custom_kernel(data)")
            cap = _Capture(capability, warp_size, self.workdir)
            try:
                with cap, torch.no_grad():
                    fn(data)
            except _Rejected as exc:
                return result("rejected", _one_line(str(exc)), cap)
            except BaseException as exc:  # noqa: BLE001
                return result("compile_failed", describe(exc), cap)
            if not cap.kernels:
                return result("compile_failed", "custom_kernel launched no Triton kernel", cap)
            return result("compiled", None, cap)
        finally:
            sys.modules.pop(name, None)


def serve_compile_jobs(handle: Callable[[_ChildState, dict, Callable[[dict], None]], None]) -> None:
    """A compile child's loop: one JSON job per stdin line, `handle(state, job, send)` answers it
    on the original stdout only (whatever kernels or Triton print goes to stderr, never into the
    protocol). Each job runs on a stand-in device of its target (pipelines.profiling.standin): the
    kernel's launcher may ask the device as on the GPU the features are for."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    import torch  # noqa: F401  (imported before user code; the first request need not pay it)
    import triton  # noqa: F401

    from pipelines.profiling.standin import DEVICES, device_for, standin_device

    workdir = tempfile.mkdtemp(prefix="worker-", dir=os.environ.get("KERNELCAST_AOT_WORKDIR"))
    state = _ChildState(workdir)

    def send(msg: dict) -> None:
        out.write(json.dumps(msg) + "\n")
        out.flush()

    send({"phase": "ready"})
    try:
        for line in sys.stdin:
            job = json.loads(line)
            spec = DEVICES.get(job.get("hardware") or "") or device_for(int(job["target"][0]))
            with standin_device(spec, on_launch=_direct_launch):
                handle(state, job, send)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _compile_job(state: _ChildState, job: dict, send: Callable[[dict], None]) -> None:
    from pipelines.tasks import gpumode

    capability, warp_size = job["target"]
    try:
        data = state.task_input(job["task"], job.get("case", "benchmark"))
        gpumode.install(_resolve_task(job["task"]))  # submissions import `task` and `utils`
    except BaseException as exc:  # noqa: BLE001
        send({"phase": "done", "status": "error", "error": _one_line(f"task input: {type(exc).__name__}: {exc}")})
        return
    send({"phase": "input"})
    send({"phase": "done", **state.compile(job["source"], data, capability, warp_size)})


if __name__ == "__main__":
    serve_compile_jobs(_compile_job)
