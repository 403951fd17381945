"""A kernel inside a child: loading and unloading it, the integrity watch around it, what its errors mean.

`load_kernel` imports a kernel file as a fresh module and `unload_kernel` empties it again, so
nothing it kept reaches the next kernel of the process. The child's integrity watch (`WATCH`,
integrity.Watch) is started here once, before any kernel exists, and checked before each kernel,
after its import and after it is unloaded. `classify` turns an exception of kernel code into a
`KernelFailure` of one failure kind (and whether the child must be replaced); `AutotuneWatch`
finds every autotuner a kernel runs, records the configs they chose, names the config one is
trying and bounds the time all its configs take. Every role
(compile_child, runner's check and Measurer) uses these; the module is harness code a kernel could
patch, so the integrity watch covers it (integrity.HARNESS_MODULES).
"""

from __future__ import annotations

import gc
import hashlib
import importlib.util
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from pipelines.profiling.inputs import (
    CACHE,
)
from pipelines.profiling.integrity import Watch
from pipelines.profiling.sandbox_policy import GIB, one_line
from pipelines.profiling.taskload import extra_task_modules, load_task
from pipelines.profiling.timing import (
    GpuShared,
    TimingTampered,
)

log = logging.getLogger(__name__)


# Substrings of CUDA errors after which the context is unusable (sticky errors): the child
# reports the kernel as crashed and exits so the parent starts a fresh one.
CUDA_FATAL_MARKERS = (
    "illegal memory access",
    "unspecified launch failure",
    "misaligned address",
    "device-side assert",
    "illegal instruction",
    "launch timed out",
    "uncorrectable ecc",
    "hardware stack error",
    "invalid program counter",
    "warp out-of-range",
    "cuda error: unknown error",
)


class KernelFailure(Exception):
    """A kernel-attributable failure with its kind; `restart` asks for a fresh child;
    `out_of_memory`: the GPU ran out of memory, which the harness's caches may have caused."""

    def __init__(self, kind: str, message: str, restart: bool = False, out_of_memory: bool = False):
        super().__init__(message)
        self.kind, self.message, self.restart, self.out_of_memory = kind, message, restart, out_of_memory


# ---- loading ---------------------------------------------------------------------------
def load_kernel(path: str, task=None):
    """Import the kernel file at `path` as a fresh module; return its `custom_kernel`.

    With `task`, GPU MODE's `task`, `utils` and `reference` modules of that task are importable
    first (gpumode.install), so GPU MODE submissions import unmodified. Triton needs a real file
    (it reads the source with inspect), hence a file per kernel.
    """
    if task is not None:
        from pipelines.tasks import gpumode

        gpumode.install(task)
    name = "kc_kernel_" + hashlib.sha1(path.encode()).hexdigest()[:16]
    sys.modules.pop(name, None)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # @triton.jit resolves globals through the module
        spec.loader.exec_module(module)
    except BaseException as e:
        sys.modules.pop(name, None)
        raise KernelFailure("compile_failed", f"import failed: {_describe(e)}") from e
    fn = getattr(module, "custom_kernel", None)
    if not callable(fn):
        sys.modules.pop(name, None)
        raise KernelFailure("compile_failed", "the module defines no callable custom_kernel(data)")
    return fn


def unload_kernel(path: str) -> None:
    """Forget the kernel module and empty its namespace: whatever it kept (a cache of outputs,
    tensors) must not reach the next kernel in this process, even if something still holds the
    module (a traceback of its failure does)."""
    module = sys.modules.pop("kc_kernel_" + hashlib.sha1(path.encode()).hexdigest()[:16], None)
    if module is not None:
        module.__dict__.clear()
    gc.collect()


class _WatchHolder:
    """The child's integrity watch (None until `start_watch`, e.g. in in-process tests).

    Set once: a later assignment (a kernel's `WATCH.watch = None`) is refused and remembered,
    and `check_integrity` reports it."""

    __slots__ = ("_watch", "meddled")

    def __init__(self) -> None:
        self._watch: Watch | None = None
        self.meddled = False

    @property
    def watch(self) -> Watch | None:
        return self._watch

    @watch.setter
    def watch(self, value: Watch | None) -> None:
        if self._watch is not None:
            self.meddled = True
            return
        self._watch = value


WATCH = _WatchHolder()
_STARTED: list[Watch] = []  # the watch start_watch made: a second reference, checked against the holder


def start_watch() -> Watch:
    """Load every task (so their modules are watched too), then record the baseline."""
    from pipelines.tasks import TASK_MODULES

    modules = []
    for name in list(TASK_MODULES) + list(extra_task_modules()):
        try:
            task = load_task(name)
        except Exception as e:  # noqa: BLE001 - a broken extra task fails its own jobs later
            log.warning("task %s not loaded for the integrity watch: %s", name, e)
            continue
        module = getattr(task.generate_input, "__module__", None)
        if module:
            modules.append(module)
    watch = Watch(tuple(dict.fromkeys(modules)))
    WATCH.watch = watch
    _STARTED.append(watch)
    # The child's baseline heap (torch, triton, the tasks: ~180,000 objects) lives as long as the
    # child; frozen, the full collection each unload_kernel makes scans only what came after it:
    # 0.5 s a collection on a loaded CPU before, under a microsecond after (the H200's unload
    # phase was 17 s of 183 kernels). Kernels' objects are collected as before.
    gc.collect()
    gc.freeze()
    return watch


def integrity_changes() -> list[str]:
    """What differs from the child's baseline (also: a watch switched off or replaced)."""
    watch = WATCH.watch
    if not _STARTED and watch is None:
        return []  # no watch in this process (in-process tests)
    if WATCH.meddled or watch is None or not _STARTED or watch is not _STARTED[0]:
        return ["the integrity watch (switched off or replaced)"]
    return watch.changes()


def check_integrity(when: str) -> None:
    """Raise `tampered` (and ask for a fresh child) if a watched identity changed."""
    changed = integrity_changes()
    if changed:
        raise KernelFailure("tampered", one_line(f"{when}: the kernel changed {', '.join(changed)}"), restart=True)


# ---- errors ----------------------------------------------------------------------------
def _describe(e: BaseException) -> str:
    """One line: exception type, message and the deepest line of kernel code involved."""
    where = ""
    tb = e.__traceback__
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).startswith("kc_kernel_"):
            where = f" (kernel line {tb.tb_lineno})"  # the deepest frame in the kernel's own file
        tb = tb.tb_next
    text = str(e)
    if isinstance(e, torch.cuda.OutOfMemoryError):
        text = _memory_account(text)
    if type(e).__name__ in ("CompilationError", "UnsupportedLanguageConstruct", "CompileTimeAssertionFailure"):
        lines = [ln for ln in text.splitlines() if ln.strip()]
        text = f"{lines[0]} {lines[-1]}" if len(lines) > 1 else text  # position + cause, not the source dump
    return one_line(f"{type(e).__name__}: {text}{where}")


def _memory_account(message: str) -> str:
    """An out-of-memory message cut to what tells whose memory it was: torch's own message names
    every process on the GPU and overflows a one-line error before its last part (this process's
    allocated and cached bytes; seen on an H100: three TriMul submissions, the harness's share
    unknown). Here: the request, the device's free memory, this process's allocated and cached
    bytes, and how much of that is the harness's input cache."""
    asked = re.search(r"Tried to allocate ([0-9.]+ [KMG]iB)", message)
    try:
        free, total = torch.cuda.mem_get_info()
        allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    except Exception:  # a broken context: torch's message is all there is
        return message
    return (f"CUDA out of memory (asked {asked.group(1) if asked else '?'}, {free / GIB:.2f} of {total / GIB:.2f} GiB "
            f"free): this process {allocated / GIB:.2f} GiB allocated ({CACHE.nbytes() / GIB:.2f} GiB the "
            f"harness's kept inputs) + {(reserved - allocated) / GIB:.2f} GiB cached")


def _is_triton_compile_error(e: BaseException) -> bool:
    try:
        from triton.compiler.errors import CompilationError
        from triton.runtime.errors import OutOfResources, PTXASError
    except ImportError:  # pragma: no cover - triton is always there in practice
        return False
    if isinstance(e, (CompilationError, OutOfResources, PTXASError)):
        return True
    # Under TRITON_INTERPRET=1 the kernel body runs as Python: what the compiler would reject
    # (an undefined name, an attribute tl does not have) surfaces as an InterpreterError.
    from triton.runtime.errors import InterpreterError

    return isinstance(e, InterpreterError) and isinstance(e.__cause__, (NameError, AttributeError, SyntaxError))


def cuda_healthy(launch: bool = True) -> bool:
    """Whether the CUDA context still works (a sticky error poisons every later call).

    `launch` also runs a one-element op and reads it back. Without it the check only
    synchronises, which reports a sticky error too: a compile child on meta inputs checks so
    after each kernel, and puts no work of its own on the GPU while another process times on it
    (an op of another process can make the GPU switch contexts while a timed kernel runs)."""
    try:
        torch.cuda.synchronize()
        return not launch or float((torch.ones(1, device="cuda") + 1).item()) == 2.0
    except Exception:  # noqa: BLE001
        return False


def classify(e: BaseException, device: str, what: str) -> KernelFailure:
    """Map an exception raised by kernel code to a failure kind (and whether to restart)."""
    if isinstance(e, KernelFailure):
        return e
    msg = f"{what}: {_describe(e)}"
    if isinstance(e, GpuShared):
        return KernelFailure("infrastructure", msg)
    if isinstance(e, TimingTampered):
        return KernelFailure("tampered", msg, restart=True)
    if _is_triton_compile_error(e):
        return KernelFailure("compile_failed", msg)
    if isinstance(e, torch.cuda.OutOfMemoryError):
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return KernelFailure("runtime_error", msg, out_of_memory=True)
    if device == "cuda":
        if any(m in str(e).lower() for m in CUDA_FATAL_MARKERS) or not cuda_healthy():
            return KernelFailure("crashed", msg, restart=True)
    return KernelFailure("runtime_error", msg)


AUTOTUNE_BUDGET_S = 120.0  # all configs one autotuned kernel tries, per job, in compiles or warm-up calls


def tune_in_memory(tuner, tuning_key, configs, bench_fn) -> bool:
    """Triton's `Autotuner.check_disk_cache`, in the harness's children: never read nor write a
    choice on disk; the configs are benchmarked here (`bench_fn`). Returns False: nothing cached.

    An autotuner with `cache_results=True` (or TRITON_CACHE_AUTOTUNING=1) stores its choice in the
    Triton cache. The compile children, whose benchmarker only compiles (every config 0 ms), stored
    the first config for every shape in the kernel's cache folder, and the measuring child read it
    back without tuning: flash-linear-attention's softmax ran 1 warp on rows of 16384 and nothing
    recorded which config it ran. Neither a stored guess nor another process's timings choose a
    config here: the measuring child tunes on the real inputs, as a process with an empty cache does."""
    bench_fn()
    return False


def keep_tuning_in_memory() -> None:
    """From here on in this process, no autotuner reads or writes a choice in Triton's disk cache
    (`tune_in_memory`): every child of the harness, compiling or measuring, calls this."""
    from triton.runtime.autotuner import Autotuner

    if hasattr(Autotuner, "check_disk_cache"):  # Triton >= 3.3: cache_results
        Autotuner.check_disk_cache = tune_in_memory


class AutotuneWatch:
    """Every Triton autotuner a kernel runs, found where it runs (the class's `run`, whatever
    wrapper, heuristic or function built it): the configs it chose (`choices`, since `mark`), each
    config it tries reported (a job's progress: "autotune <kernel>: config i/n", so a hang names
    it) and, per job, AUTOTUNE_BUDGET_S for all its configs: past it the next config raises a
    `timeout` naming the autotune, instead of the job running until its step's own limit. Choices
    are never read from or written to disk (`tune_in_memory`). Installed once per child, before
    the integrity baseline, so the patched `Autotuner` methods are the harness's own; each job sets
    its progress sink with `begin`."""

    def __init__(self, budget_s: float = AUTOTUNE_BUDGET_S):
        self.budget_s = budget_s
        self.progress: Callable[[str], None] | None = None
        self.started: dict[int, float] = {}
        self.ran: dict[int, tuple[Any, list[str]]] = {}  # since `mark`: autotuner -> the configs it ran

    def begin(self, progress: Callable[[str], None] | None) -> None:
        self.progress, self.started, self.ran = progress, {}, {}

    def mark(self) -> None:
        """From here on, `choices` names what runs after this point only (one case's call)."""
        self.ran = {}

    def saw(self, tuner: Any) -> None:
        """`tuner` ran a kernel with its `best_config` (tuned just now or chosen before)."""
        config = str(getattr(tuner, "best_config", None))
        _, configs = self.ran.setdefault(id(tuner), (tuner, []))
        if config not in configs:
            configs.append(config)

    def choices(self) -> dict[str, str]:
        """{autotuned kernel: the config it ran with} of every autotuner that ran since `mark`; a
        kernel run with several configs (several shapes in one call) has them joined by " | ", and
        two autotuners of one function name are told apart as "name", "name#2"."""
        picks: dict[str, str] = {}
        for tuner, configs in self.ran.values():
            name = getattr(getattr(tuner, "base_fn", None), "__name__", "kernel")
            key, n = name, 1
            while key in picks:
                n += 1
                key = f"{name}#{n}"
            picks[key] = " | ".join(configs)
        return picks

    def install(self) -> None:
        from triton.runtime.autotuner import Autotuner

        watch, original_bench, original_run = self, Autotuner._bench, Autotuner.run

        def bench(tuner, *args, config, **meta):
            name = getattr(tuner.base_fn, "__name__", "kernel")
            first = watch.started.setdefault(id(tuner), time.monotonic())
            index = next((i for i, c in enumerate(tuner.configs) if c is config), 0) + 1
            if time.monotonic() - first > watch.budget_s:
                raise KernelFailure("timeout", f"autotune of {name}: its configs took over the {watch.budget_s:.0f} s "
                                               f"budget ({index - 1} of {len(tuner.configs)} tried)")
            if watch.progress is not None:
                watch.progress(f"autotune {name}: config {index}/{len(tuner.configs)}")
            return original_bench(tuner, *args, config=config, **meta)

        def run(tuner, *args, **kwargs):
            out = original_run(tuner, *args, **kwargs)
            watch.saw(tuner)
            return out

        Autotuner._bench = bench
        Autotuner.run = run
        keep_tuning_in_memory()


AUTOTUNE = AutotuneWatch()


def _task_or_failure(name: str):
    try:
        return load_task(name)
    except Exception as e:  # noqa: BLE001
        raise KernelFailure("infrastructure", f"task {name!r}: {_describe(e)}") from e


def check_state_before_kernel() -> None:
    """The state check before each kernel: a process an earlier kernel changed after its own
    checks (a finalizer, a timer) is replaced before anything else runs in it; the job is
    `infrastructure` (retried by a resumed run), not this kernel's failure."""
    before = integrity_changes()
    if before:
        raise KernelFailure("infrastructure", one_line(
            f"this process was changed before the kernel was imported: {', '.join(before)}"), restart=True)


def _imported(job: dict):
    """(task, entry point) of the job's kernel, imported, with nothing tampered with on import."""
    check_state_before_kernel()
    task = _task_or_failure(job["task"])
    fn = load_kernel(job["path"], task)
    check_integrity("on import")
    return task, fn


def _failed(f: KernelFailure, t0: float, **extra: Any) -> dict:
    return {"ok": False, "status": "failed", "failure_kind": f.kind, "error": f.message,
            "seconds": time.perf_counter() - t0, "restart": f.restart, **extra}


def use_kernel_cache(job: dict, variable: str) -> None:
    """Point Triton at the job's own cache folder (the worker made one per kernel): compile
    children write there (TRITON_CACHE_DIR), the measuring child reads there (triton_cache.SHARED_ENV).
    Triton reads both each time it opens a cache entry."""
    folder = job.get("triton_dir")
    if isinstance(folder, str) and folder:
        os.environ[variable] = folder
    elif variable != "TRITON_CACHE_DIR":
        os.environ.pop(variable, None)  # no folder of its own: nothing shared to read


def _checked_after_unload(result: dict) -> dict:
    """`result`, or `tampered` when the process changed once the kernel was unloaded (what its
    finalizers did, when its module was emptied, would otherwise greet the next kernel here)."""
    changed = integrity_changes()
    if changed and result.get("failure_kind") != "tampered":
        message = one_line(f"after it was unloaded: the kernel changed {', '.join(changed)}")
        return {**result, "ok": False, "status": "failed", "failure_kind": "tampered", "error": message,
                "restart": True}
    return result
