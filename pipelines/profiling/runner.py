"""What a sandboxed child does with one kernel: compile it, check it, time it.

Runs INSIDE the child processes of `child.py`; the parent never imports the kernels. Each
runner takes a job {"job_id", "kernel_id", "task", "path"} (path: the kernel's source file,
written by the parent) and returns a plain dict for the JSON channel.

Correctness, per case (see `check_case`): the kernel runs on its own freshly generated input,
into an allocator whose free memory was just filled with NaN bytes (so an output the kernel
forgets to write is garbage, never a left-over correct answer); what it returned is shipped to
the verifier (verify.py), which generates the same input in its own process, computes the
reference there and judges. After timing, the re-check writes a new seed's input into the very
buffers that were timed and judges again, which catches kernels that cache their result by
shape or by input address. All device work is synchronised device-wide before anything is read.

Timed calls are verified too: each call runs on values no earlier call of the case had, written
into the same buffers (call_feed.Feed, fresh_values.py), and after each call a CSPRNG draw decides
whether its output is among those the verifier judges, on the input it rebuilds from the kept
salt and draw; every call of a kernel (check, warm-up, timed, re-check) is made by timing.drive
from the same place, so its stack says nothing about what the call is for, and no name in its
frames leads to the timer or the feed.

Integrity (integrity.Watch): the identities of torch's, the clock's and the harness's functions
(the methods of its classes included) are recorded once per child, before any kernel exists in
it, and never re-based; before each kernel, after its import, after its checks, after its timing
and after it was unloaded (its finalizers run then) they must be unchanged, else the kernel is
`tampered` and the child is replaced. Timings are checked against the wall clock
(timing.TimingTampered).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib.util
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipelines.profiling import inputs, verify
from pipelines.profiling.call_feed import Feed, plain_feed, top_up_steps
from pipelines.profiling.cpu_timing import cpu_steps
from pipelines.profiling.cuda_timing import L2Flusher, LaunchCover, cuda_steps
from pipelines.profiling.gpumode_timing import (
    ReferenceFailed,
    Turns,
    gpumode_warmup_steps,
    interleaved_steps,
)
from pipelines.profiling.inputs import (
    CACHE,
    clone_data,
    input_cache_bytes,
    make_input,
    map_tensors,
    restore_torch_flags,
    snapshot_torch_flags,
    sync,
)
from pipelines.profiling.integrity import Watch
from pipelines.profiling.results import CALL_TIMES_TAG, pairs_reference
from pipelines.profiling.sandbox_policy import GIB, one_line
from pipelines.profiling.shipping import ShippingError
from pipelines.profiling.taskload import extra_task_modules, load_task
from pipelines.profiling.timing import (
    GpuShared,
    Steps,
    Timing,
    TimingSettings,
    TimingTampered,
    collector_paused,
    drive,
    keep_output,
)
from pipelines.profiling.verify import RECHECK_SEED_SALT, recheck_salts, timed_cases, timed_draws

log = logging.getLogger(__name__)

NEEDS_RECHECK_ABOVE = 10.0  # speedups above this are flagged for a re-measure
# gpumode: the kernel's and the reference's timed calls of a case go by turns of this many
# (Measurer.paired_case_steps); each turn after the first starts with one untimed call. GPU
# MODE's statistic is a mean, and a stretch of slow calls (a few to a few dozen, host or device)
# that falls on one loop moves that loop's mean alone; taken call by call, a stretch is split
# between both (tests/profiling/test_protocol_fidelity.py: a stretch of 5 to 20 calls at twice the
# time moves identical code past 2% by turns of 10, not by turns of 1). It costs one untimed call
# per timed call, under gpumode only. The runs behind it: docs/results/harness.md, "Settings and
# the runs behind them".
PAIRED_TURN_CALLS = 1
__all__ = ["RECHECK_SEED_SALT", "KernelFailure", "load_kernel", "check_case", "check_all", "Measurer"]

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


# ---- inputs and checks -----------------------------------------------------------------
def release_cuda_memory(keep_bytes: int) -> bool:
    """Give the caching allocator's free blocks back to the device once this process reserves
    more than `keep_bytes`; True if it did. A compile child runs each kernel's launcher on the
    benchmark inputs (launches suppressed, but torch ops in a launcher and its outputs are real
    allocations); without this, a dozen children each kept ~9 GB reserved after trimul's
    1024 x 1024 pair tensors, and the measuring child's reference then ran out of memory (the
    kernels recorded as `infrastructure` failures: docs/results/dataset.md)."""
    if not torch.cuda.is_available() or torch.cuda.memory_reserved() <= keep_bytes:
        return False
    torch.cuda.empty_cache()
    return True


def poison_free_memory(device: str, data: Any) -> None:
    """Fill blocks of freed memory with 0xFF (NaN in every float format), then free them again.

    The kernel's next allocations are likely carved from these blocks (the CUDA caching
    allocator; the CPU heap, which keeps freed blocks by size, hence blocks the size of each input
    tensor as well as one of twice the input), so an output element the kernel never writes reads
    as NaN instead of whatever an earlier correct run (the reference, timed in this process) left.
    """
    sizes: list[int] = []
    map_tensors(data, lambda t: sizes.append(t.numel() * t.element_size()))
    where = "cuda" if device == "cuda" else "cpu"
    blocks = [torch.empty(2 * sum(sizes), dtype=torch.uint8, device=where)] if sum(sizes) else []
    if where == "cpu":
        blocks += [torch.empty(n, dtype=torch.uint8) for n in sizes for _ in range(2) if n]
    for b in blocks:
        b.fill_(0xFF)
    del blocks


def copy_into(target: Any, source: Any) -> Any:
    """`target` with every tensor's values replaced by `source`'s (same buffers, same objects)."""
    if isinstance(target, torch.Tensor):
        target.copy_(source)
        return target
    if isinstance(target, (tuple, list)):
        for t, s in zip(target, source):
            copy_into(t, s)
        return target
    if isinstance(target, dict):
        for k in target:
            copy_into(target[k], source[k])
        return target
    return target


def check_steps(task, case: dict, device: str, salt: int = 0, into: Any = None, held: list | None = None) -> Steps:
    """One checked call of the kernel on a case, as steps (timing.drive makes the call), and the
    verifier's verdict on its output; KernelFailure on any problem.

    Args:
        into: an input the kernel ran on before: the case's values (seed + salt) are written into
            its buffers and the kernel runs on that very object (the re-checks).
        held: where given, the output is not judged now: a copy of it (the kernel may reuse its
            buffer) goes into `held` as a `Held`, for `submit_held` and `collect_verdicts`.
    Returns:
        The input the kernel ran on (for a later re-check into its buffers).
    """
    cid = task.case_id(case) + (f" (recheck, seed +{salt})" if salt else "")
    try:
        data_k = make_input(task, case, salt)
        if into is not None:
            data_k = copy_into(into, data_k)
        sync(device)
    except Exception as e:
        raise KernelFailure("infrastructure", f"generate_input failed on {cid}: {_describe(e)}",
                            out_of_memory=isinstance(e, torch.cuda.OutOfMemoryError)) from e
    poison_free_memory(device, data_k)
    try:
        out = yield data_k
        sync(device)
        if held is not None:
            held.append(Held(case, salt, keep_output(out), cid, None))
    except Exception as e:
        raise classify(e, device, f"case {cid}") from e
    if held is None:
        judge_output(task, case, salt, out, device, cid)
    return data_k


@dataclass
class Held:
    """An output waiting to be shipped to the verifier: a copy the kernel never got. `draw`: the
    transform a timed call's input had (fresh_values.py); None for a checked call's."""

    case: dict
    salt: int
    output: Any
    cid: str
    draw: int | None = None


def submit_held(task, held: list[Held], device: str) -> list[str]:
    """Ship each held output for a verdict without waiting (verify.submit); the case ids, in order.
    The outputs are let go once shipped (the judge keeps what the verifier maps)."""
    t0 = time.perf_counter()
    cids = []
    try:
        while held:
            h = held.pop(0)
            try:
                verify.submit(task, h.case, h.salt, h.output, verify.flags_json(snapshot_torch_flags()), h.draw)
            except ShippingError as e:
                raise KernelFailure("incorrect", f"case {h.cid}: {e}") from e
            except Exception as e:
                raise _judge_failure(e, device, h.cid) from e
            cids.append(h.cid)
    finally:
        _JUDGE_CLOCK.seconds += time.perf_counter() - t0
    return cids


def collect_verdicts(cids: list[str], device: str) -> None:
    """Wait for the verdicts of everything shipped (verify.collect); KernelFailure at the first
    wrong output, named by `cids` (the case ids submit_held returned, in the same order)."""
    t0 = time.perf_counter()
    try:
        verdicts = verify.collect()
    except Exception as e:
        raise _judge_failure(e, device, cids[0] if cids else "?") from e
    finally:
        _JUDGE_CLOCK.seconds += time.perf_counter() - t0
    for (ok, message), cid in zip(verdicts, list(cids) + ["?"] * len(verdicts)):
        if not ok:
            raise KernelFailure("incorrect", one_line(f"case {cid}: {message}"))


def _judge_failure(e: Exception, device: str, cid: str) -> KernelFailure:
    """What a failure to get a verdict (not a wrong output) makes of the job."""
    failure = classify(e, device, f"check on case {cid}")
    if failure.kind in ("crashed", "tampered"):
        return failure
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return KernelFailure("infrastructure", f"case {cid}: check ran out of GPU memory")
    return KernelFailure("incorrect", f"case {cid}: check raised {_describe(e)}")


def judge_output(task, case: dict, salt: int, out: Any, device: str, cid: str) -> None:
    """The verifier's verdict on one output (seed + salt); KernelFailure unless it is right."""
    collect_verdicts(submit_held(task, [Held(case, salt, out, cid)], device), device)


def check_case(task, fn: Callable, case: dict, device: str, salt: int = 0, into: Any = None) -> Any:
    """Run the kernel on one case and have the verifier judge its output (check_steps)."""
    return drive(fn, check_steps(task, case, device, salt, into))


def check_all(task, fn: Callable, cases, device: str, progress: Callable[[str], None] | None = None) -> Any:
    """check_case on every case in order; returns the first case's input (None without cases)."""
    first = None
    for case in cases:
        if progress:
            progress(f"checking {task.case_id(case)}")
        data = check_case(task, fn, case, device)
        first = data if first is None else first
    return first


# ---- the three roles -------------------------------------------------------------------
@contextlib.contextmanager
def triton_launches_suppressed():
    """Within: every Triton launch compiles (and fills the cache) but does not run.

    Compile workers use this on the benchmark shapes, so the measuring process finds the exact
    specialisations in TRITON_CACHE_DIR without the compile workers putting load on the GPU
    it is timing on. Autotuners get a benchmarker that just compiles each config once. A
    launcher that compiles ahead (`kernel.warmup(...)`) and launches the compiled kernel itself
    (`kernel[grid](...)`, as launchers sizing a persistent grid from the kernel's registers do)
    gets a launch that runs nothing: on meta inputs it would run on pointers to nothing.
    """
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    orig_run, orig_bench = JITFunction.run, Autotuner.__dict__.get("do_bench")
    orig_getitem = CompiledKernel.__getitem__

    def run(self, *args, grid, warmup, **kwargs):
        kernel = orig_run(self, *args, grid=grid, warmup=True, **kwargs)
        build_launcher(kernel)
        return kernel

    def compile_only_bench(kernel_call, quantiles=None, **_):
        kernel_call()
        return [0.0] * len(quantiles) if quantiles else 0.0

    def launch_nothing(self, grid):
        return lambda *args, stream=None: None

    JITFunction.run = run
    Autotuner.do_bench = property(lambda self: compile_only_bench)
    CompiledKernel.__getitem__ = launch_nothing
    try:
        yield
    finally:
        JITFunction.run = orig_run
        CompiledKernel.__getitem__ = orig_getitem
        if orig_bench is not None:
            Autotuner.do_bench = orig_bench


_LAUNCHERS_BUILT: set[str] = set()


def build_launcher(kernel: Any) -> None:
    """Build the host-side launcher of a compiled Triton kernel into the Triton cache.

    Triton compiles a small C library per kernel signature (with the system's C compiler) on
    the first launch. Left to the measuring child, that took 7% of its time on an H200 (harness
    5: 46 ms a kernel); built here, the measuring child finds it in the shared cache. Nothing is
    loaded on the GPU. Best effort: a launcher that does not build here is built on first launch."""
    key = getattr(kernel, "hash", None)
    if kernel is None or not isinstance(key, str) or hasattr(kernel, "result"):
        return
    key = f"{key}@{os.environ.get('TRITON_CACHE_DIR', '')}"  # each kernel's cache folder gets its own
    if key in _LAUNCHERS_BUILT:
        return
    _LAUNCHERS_BUILT.add(key)
    try:
        from triton.runtime.driver import driver

        driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception as e:  # noqa: BLE001 - the measuring child builds it on first launch instead
        log.debug("launcher of %s not built ahead: %s", key, e)


# What compile children hand the launcher (set by child.py from the worker's --compile-inputs):
# "device" = real inputs on the GPU (the default: the launcher runs as in the measuring child);
# "meta" = shape-only tensors on PyTorch's meta device, so a compile child allocates nothing on the
# GPU and runs no GPU work at all, and compiles may overlap the timing (worker: unphased). A case
# whose launcher cannot run on meta tensors (it reads values, or mixes devices) is left to the
# measuring child, which compiles it in its warm-up calls, before anything is timed.
COMPILE_INPUTS = "device"
_META_INPUTS: dict[tuple[str, str], Any] = {}


def to_meta(data: Any) -> Any:
    """The same structure with every tensor replaced by a meta tensor of its shape, dtype and
    strides (its data_ptr keeps the storage offset, so Triton specialises alignment alike).

    >>> x = torch.zeros(4, 8, dtype=torch.bfloat16)
    >>> m = to_meta((x, [x[:, 1:]], {"n": 3}))
    >>> m[0].device.type, m[1][0].shape, m[1][0].stride(), m[1][0].data_ptr() % 16, m[2]
    ('meta', torch.Size([4, 7]), (8, 1), 2, {'n': 3})
    """

    def meta_like(t: torch.Tensor) -> torch.Tensor:
        # A meta storage as large as the original, viewed the same way (a plain .to("meta")
        # would drop a view's storage offset, and with it a misaligned pointer's specialisation).
        base = torch.empty(t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype, device="meta")
        return base.as_strided(t.size(), t.stride(), t.storage_offset())

    return map_tensors(data, meta_like)


def meta_input(task, case: dict) -> Any:
    """The case's input as meta tensors, built once per child: the task draws it on the meta
    device (shapes, dtypes and strides, no values: never the GPU, nor the seconds and gigabytes
    trimul's largest case takes on the CPU in each of a dozen compile children)."""
    key = (task.name, task.case_id(case))
    if key not in _META_INPUTS:
        forced = os.environ.get("KERNELCAST_DEVICE")
        os.environ["KERNELCAST_DEVICE"] = "meta"  # tasks place inputs on default_device()
        try:
            _META_INPUTS[key] = to_meta(inputs.generate(task, case))
        finally:
            if forced is None:
                os.environ.pop("KERNELCAST_DEVICE", None)
            else:
                os.environ["KERNELCAST_DEVICE"] = forced
    return clone_data(_META_INPUTS[key])


class GpuLookingMeta(torch.Tensor):
    """A meta tensor that answers `is_cuda` as the GPU input it stands for would.

    A launcher may choose what to compile by where its input lives: the fp8_quant family sets
    `PRE_ROUND = not x.is_cuda`, a constexpr. On plain meta tensors the compile child then built
    the CPU's variant, and the measuring child compiled the GPU's in its checks, ten times the
    check time of the family's other kernels (docs/results/harness.md). Only `is_cuda` changes: its `device` stays meta, so
    whatever the launcher allocates "on x.device" stays shape-only, and Triton specialises its
    pointers alike (the storage offset is the meta tensor's). Ops on it keep the class (torch's
    default `__torch_function__`), so `x.contiguous()` still says it is on the GPU."""

    @property
    def is_cuda(self) -> bool:  # noqa: D401 - a property of torch.Tensor, answered as on the GPU
        return True


def gpu_looking(data: Any) -> Any:
    """The same structure with every (meta) tensor as a GpuLookingMeta over the same storage."""
    return map_tensors(data, lambda t: torch.Tensor._make_subclass(GpuLookingMeta, t))


AUTOTUNE_BUDGET_S = 120.0  # all configs one autotuned kernel tries, per job, in compiles or warm-up calls


class AutotuneWatch:
    """Autotuners report each config they try (a job's progress: "autotune <kernel>: config i/n",
    so a hang names it) and, per job, get AUTOTUNE_BUDGET_S for all their configs: past it the
    next config raises a `timeout` naming the autotune, instead of the job running until its
    step's own limit. Installed once per child, before the integrity baseline, so the patched
    `Autotuner._bench` is the harness's own; each job sets its progress sink with `begin`."""

    def __init__(self, budget_s: float = AUTOTUNE_BUDGET_S):
        self.budget_s = budget_s
        self.progress: Callable[[str], None] | None = None
        self.started: dict[int, float] = {}
        self.tuners: dict[int, Any] = {}  # the autotuners that benchmarked configs in this job

    def begin(self, progress: Callable[[str], None] | None) -> None:
        self.progress, self.started, self.tuners = progress, {}, {}

    def choices(self) -> dict[str, str]:
        """{autotuned kernel: the config it runs now} of every autotuner that tuned in this job."""
        return {getattr(t.base_fn, "__name__", "kernel"): str(getattr(t, "best_config", None))
                for t in self.tuners.values()}

    def install(self) -> None:
        from triton.runtime.autotuner import Autotuner

        watch, original = self, Autotuner._bench

        def bench(tuner, *args, config, **meta):
            name = getattr(tuner.base_fn, "__name__", "kernel")
            first = watch.started.setdefault(id(tuner), time.monotonic())
            watch.tuners[id(tuner)] = tuner
            index = next((i for i, c in enumerate(tuner.configs) if c is config), 0) + 1
            if time.monotonic() - first > watch.budget_s:
                raise KernelFailure("timeout", f"autotune of {name}: its configs took over the {watch.budget_s:.0f} s "
                                               f"budget ({index - 1} of {len(tuner.configs)} tried)")
            if watch.progress is not None:
                watch.progress(f"autotune {name}: config {index}/{len(tuner.configs)}")
            return original(tuner, *args, config=config, **meta)

        Autotuner._bench = bench


AUTOTUNE = AutotuneWatch()


def _compile_case(fn, task, case: dict, job: dict) -> None:
    """Run the launcher on one benchmark case with launches suppressed (see run_compile).

    On meta inputs it runs twice: on meta tensors, then on the same tensors answering `is_cuda`
    as the GPU's do (GpuLookingMeta). A launcher that does not ask compiles nothing new the
    second time (Triton finds its kernel in memory); one that asks gets the GPU's variant built
    here, and one that, told it is on the GPU, asks the device for more than a meta tensor has
    (`torch.cuda.get_device_properties(x.device)`) still has the first run's compile."""
    meta = COMPILE_INPUTS == "meta"
    runs = (lambda: meta_input(task, case), lambda: gpu_looking(meta_input(task, case))) if meta else (
        lambda: make_input(task, case),)
    for data in runs:
        try:
            fn(data())
        except KernelFailure:
            raise  # the autotune budget ran out
        except Exception as e:
            if _is_triton_compile_error(e):
                raise KernelFailure("compile_failed", f"case {task.case_id(case)}: {_describe(e)}") from e
            # Anything else may be an artefact of not launching (or of meta inputs): the GPU stage decides.
            log.debug("warm run of %s on %s inputs: %s", job["kernel_id"], COMPILE_INPUTS, e)


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


def run_compile(job: dict, device: str, progress: Callable[[str], None] | None = None) -> dict:
    """Import the kernel; on a GPU also compile it for every benchmark shape without launching."""
    t0 = time.perf_counter()
    path = job["path"]
    AUTOTUNE.begin(progress)
    use_kernel_cache(job, "TRITON_CACHE_DIR")
    try:
        task, fn = _imported(job)
        source = Path(path).read_text(encoding="utf-8")
        if device == "cuda" and "triton" in source:
            with triton_launches_suppressed():
                for case in task.benchmark_cases:
                    _compile_case(fn, task, case, job)
            if not cuda_healthy(launch=COMPILE_INPUTS != "meta"):
                raise KernelFailure("crashed", "CUDA context broken while compiling", restart=True)
        check_integrity("while compiling")
        result = {"ok": True, "seconds": time.perf_counter() - t0}
    except KernelFailure as f:
        result = _failed(f, t0)
    finally:
        unload_kernel(path)
        if device == "cuda" and COMPILE_INPUTS != "meta":
            release_cuda_memory(keep_bytes=CACHE.max_bytes + 2**30)
    return _checked_after_unload(result)


def run_check(job: dict, device: str) -> dict:
    """Correctness on the task's correctness cases (the `kernelcast check` path)."""
    t0 = time.perf_counter()
    path = job["path"]
    try:
        task, fn = _imported(job)
        first = check_all(task, fn, task.correctness_cases, device)
        # The first case again, on a new seed written into the same buffers: no caching by shape or address.
        check_case(task, fn, task.correctness_cases[0], device, salt=RECHECK_SEED_SALT, into=first)
        check_integrity("after the correctness cases")
        result = {"ok": True, "status": "ok", "failure_kind": None, "error": "ok", "seconds": time.perf_counter() - t0}
    except KernelFailure as f:
        result = _failed(f, t0)
    finally:
        unload_kernel(path)
    return _checked_after_unload(result)


def _checked_after_unload(result: dict) -> dict:
    """`result`, or `tampered` when the process changed once the kernel was unloaded (what its
    finalizers did, when its module was emptied, would otherwise greet the next kernel here)."""
    changed = integrity_changes()
    if changed and result.get("failure_kind") != "tampered":
        message = one_line(f"after it was unloaded: the kernel changed {', '.join(changed)}")
        return {**result, "ok": False, "status": "failed", "failure_kind": "tampered", "error": message,
                "restart": True}
    return result


REF_FIRST = 3  # timings of each reference case when a task is first measured
REF_FIRST_GPUMODE = 1  # GPU MODE's loop already makes up to 100 calls a timing
REF_KEEP = 5  # reference timings kept per case; speedups use their median


class Measurer:
    """The measuring child's state: device, L2 flusher, reference timings, settings."""

    def __init__(self, config: dict):
        self.config = dict(config)
        self.device = config.get("device", "cuda")
        self.protocol = config.get("protocol", "kernelcast")
        self.ref_refresh_s = float(config.get("ref_refresh_s", 180.0))
        # Off by default: generation checks the small cases on the CPU, and on the GPU their new shapes
        # would force fresh JIT compiles inside the timing process.
        self.check_correctness_cases = bool(config.get("check_correctness_cases", False))
        self.tune_first = False  # the job's kernel autotunes: tuned on the benchmark cases before its checks
        self.timed_salts, self.timed_samples = timed_draws(self.device, config)
        # gpumode: each case of the reference is timed right after the kernel's, in the same job
        # (paired_reference_timing), and the row uses that timing. GPU MODE's loop times the host's
        # work with every call; with the reference timed at the start of a job, after the host and
        # GPU sat idle, and the kernel after its checks, identical code read 0.89-1.14 on short,
        # launch-bound cases (docs/protocols.md).
        self.paired_reference = pairs_reference(self.protocol)
        # Diagnostics: each gpumode case's timed calls of both loops, in order, to stderr (the
        # child's log; `worker --call-times`, read by benchmarks.call_times).
        self.call_times = bool(config.get("call_times"))
        max_reps = int(config.get("max_reps") or 0)
        if self.device == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("no CUDA device visible (use --device cpu on a CPU host)")
            from pipelines.profiling.hardware import cuda_fingerprint

            torch.cuda.set_device(0)
            self.hardware = cuda_fingerprint(0)
            self.flusher = L2Flusher(self.hardware.get("l2_cache_bytes") or 64 * 2**20)
            self.cover = LaunchCover()
            s = TimingSettings()
            overrides = {k: config[k] for k in ("min_reps", "max_case_s", "rse_target") if config.get(k) is not None}
            self.settings = TimingSettings(**{**s.__dict__, **overrides, **({"max_reps": max_reps} if max_reps else {})})
        else:
            from pipelines.profiling.hardware import cpu_fingerprint

            self.hardware = cpu_fingerprint()
            self.flusher = None
            self.cover = None
            self.settings = TimingSettings.for_cpu(max_reps or 5)
        # (task, case_id) -> the last REF_KEEP reference timings and when the newest was taken
        self.refs: dict[tuple[str, str], tuple[list[Timing], float]] = {}
        self.flags = snapshot_torch_flags()
        CACHE.max_bytes = int(config.get("input_cache_bytes") or input_cache_bytes(self.device, 0.30, 24 * 2**30))

    def cases(self, task) -> tuple:
        return timed_cases(task, self.device)

    def free_input_cache(self) -> None:
        """After the GPU ran out of memory: drop the kept inputs and keep half as many from now on.

        The cache holds 30% of the GPU; on an 80 GB card, with the verifier's caches and the
        compile children's CUDA contexts, trimul's largest case may then no longer fit. The inputs of the task being
        measured stay whatever the budget, so a smaller one costs only regenerations on task switches.
        """
        CACHE.clear()
        if self.device == "cuda":
            CACHE.max_bytes = max(CACHE.max_bytes // 2, 4 * 2**30)

    def time_steps(self, feed: Feed, turns: Turns | None = None) -> Steps:
        """The timed loop of this child's device and protocol on `feed`, as steps; returns a Timing."""
        if self.device == "cuda":
            return (yield from cuda_steps(feed, self.settings, protocol=self.protocol, flusher=self.flusher,
                                          launch_cover=self.cover, turns=turns))
        return (yield from cpu_steps(feed, self.settings, protocol=self.protocol, turns=turns))

    def time_fn(self, fn: Callable, data: Any) -> Timing:
        """Time a callable of the harness's own (the reference) on `data` as it is."""
        return drive(fn, self.time_steps(plain_feed(data)))

    def warm(self) -> None:
        """Run the timing path once on a callable of our own, before the integrity baseline is
        taken: what torch initialises lazily on first use is then part of the baseline."""
        x = torch.ones(1024, device="cuda" if self.device == "cuda" else "cpu")
        try:
            drive(lambda d: d * 2.0, self.time_steps(plain_feed(x)))
        except GpuShared:
            # First use: lazy CUDA set-up inside the timed window makes the wall clock run far past
            # the events, by hundreds of times. That is what this call is
            # for; the wall-clock check holds from the kernels' calls on.
            pass
        sync(self.device)

    def reference_timings(self, task, progress: Callable[[str], None], fresh: dict | None = None) -> list[dict]:
        """Time the reference where the newest timing of a case is missing or stale; the new
        timings, each with its case id (the parent keeps the book the rows use: audit.py).

        A task's first use times each case REF_FIRST times (REF_FIRST_GPUMODE under gpumode);
        after that one more timing is added whenever the newest is older than ref_refresh_s.
        `fresh` (the parent's view, from its book and the reference cache: case id -> "fresh" |
        "stale") overrides this child's own record: a fresh case is not timed, a stale one once.
        """
        now = time.monotonic()
        cases = self.cases(task)
        keys = [(task.name, task.case_id(c)) for c in cases]
        fresh = fresh if isinstance(fresh, dict) else {}

        def wanted(key) -> int:
            said = fresh.get(key[1])
            if said == "fresh":
                return 0
            if said == "stale":
                return 1
            if key not in self.refs:
                return REF_FIRST_GPUMODE if self.protocol == "gpumode" else REF_FIRST
            return 1 if now - self.refs[key][1] > self.ref_refresh_s else 0

        counts = [wanted(k) for k in keys]
        new: list[dict] = []
        if not any(counts):
            return new
        restore_torch_flags(self.flags)
        warmed = False
        before = {k: self.refs[k] for k in keys if k in self.refs}
        for key, case, n in zip(keys, cases, counts):
            if not n:
                continue
            progress(f"timing reference {key[1]}")
            kept = list(self.refs.get(key, ([], 0.0))[0])
            try:
                data = make_input(task, case)
                for _ in range(n):
                    # The kernel's own feed and loop (timed_feed, timed_case_steps): the same value
                    # copies before each call, the same output samples after it, the same warm-up.
                    feed = self.timed_feed(task, case, data)
                    with collector_paused():
                        t = drive(task.ref_kernel, self.timed_case_steps(feed, first=not warmed))
                    warmed = True
                    kept.append(t)
                    new.append({"case_id": key[1], **t.as_dict()})
                    del feed
                del data
            except Exception as e:
                # The job fails, so the parent never sees this call's timings: forget them here
                # too, or the next job would skip cases the parent's book does not hold and its
                # row would read as a forged reference (`tampered`) on a good kernel.
                for k in keys:
                    if k in before:
                        self.refs[k] = before[k]
                    else:
                        self.refs.pop(k, None)
                failure = classify(e, self.device, f"reference on case {key[1]}")
                raise KernelFailure("infrastructure", failure.message, restart=failure.restart,
                                    out_of_memory=failure.out_of_memory) from e
            self.refs[key] = (kept[-REF_KEEP:], time.monotonic())
        return new

    def measure(self, job: dict, progress: Callable[[str], None]) -> dict:
        """Check and time one kernel: the per-kernel part of a row, as claims the parent audits
        (case_ids, kernel_timings, ref_new; the parent computes the speedups), with the seconds
        each phase took (`phases`)."""
        path = job["path"]
        phases = {"state_check_s": 0.0, "reference_s": 0.0, "import_s": 0.0, "check_s": 0.0, "inputs_s": 0.0, "timing_s": 0.0,
                  "timed_verify_s": 0.0, "recheck_s": 0.0, "verifier_s": 0.0, "unload_s": 0.0}
        result: dict = {"check_s": None, "time_s": None, "ref_new": [], "phases": phases}
        t0 = time.perf_counter()
        AUTOTUNE.begin(progress)
        try:
            t = time.perf_counter()
            check_state_before_kernel()
            phases["state_check_s"] = time.perf_counter() - t
            task = _task_or_failure(job["task"])
            cases = self.cases(task)
            use_kernel_cache(job, "KERNELCAST_TRITON_SHARED")  # triton_cache.SHARED_ENV (Triton-free here)
            t = time.perf_counter()
            if not self.paired_reference:
                result["ref_new"] = self.reference_timings(task, progress, job.get("ref_fresh"))
            phases["reference_s"] = time.perf_counter() - t
            progress("importing kernel")
            t = time.perf_counter()
            self.tune_first = self.device == "cuda" and "autotune" in Path(path).read_text(encoding="utf-8", errors="replace")
            fn = load_kernel(path, task)
            check_integrity("on import")
            phases["import_s"] = time.perf_counter() - t
            t0 = time.perf_counter()
            # The one call site of the kernel: checks, timed calls and re-checks are steps of one
            # generator that timing.drive runs (see _steps).
            timings = drive(fn, self._steps(task, cases, progress, result))
            result.update(status="ok", failure_kind=None, error=None, case_ids=[task.case_id(c) for c in cases],
                          kernel_timings=[t.as_dict() for t in timings])
        except KernelFailure as f:
            result.update(status="failed", failure_kind=f.kind, error=f.message, restart=f.restart)
            if f.out_of_memory:
                self.free_input_cache()
                if job.get("after_out_of_memory"):
                    result["error"] = f"{f.message} (again, with this process's input cache emptied)"
                else:  # the parent measures it once more (worker.OOM_RETRY_KEY)
                    result["out_of_memory"] = True
            if result["check_s"] is None:
                result["check_s"] = time.perf_counter() - t0
        except torch.cuda.OutOfMemoryError as e:
            # The harness's own allocations (a case's input, its timed variants) out of memory:
            # not the kernel's failure; measured once more after the cache is emptied.
            self.free_input_cache()
            result.update(status="failed", failure_kind="infrastructure", restart=False,
                          error=one_line(f"the harness ran out of GPU memory: {_describe(e)}"),
                          out_of_memory=not job.get("after_out_of_memory"))
        finally:
            t = time.perf_counter()
            AUTOTUNE.tuners.clear()  # the kernel's autotuners go with its module
            unload_kernel(path)
            restore_torch_flags(self.flags)
            phases["unload_s"] = time.perf_counter() - t
        return _checked_after_unload(result)

    def timed_feed(self, task, case: dict, data: Any) -> Feed:
        """The feed of one case's timed calls: before each call new values, a transform of one of
        the timed variants drawn for that call (fresh_values.py), a sample of the outputs kept after
        it (for the verifier; the reference's are dropped)."""
        if len(self.timed_salts) <= 8:  # the variants generated here (once per child), not between timed calls
            for s in self.timed_salts:
                CACHE.peek(task, case, s)
        feed = Feed(data, lambda s, case=case: CACHE.peek(task, case, s), self.timed_salts, self.timed_samples,
                    self.device)
        if len(self.timed_salts) <= 8:
            feed.prepare()
        sync(self.device)
        return feed

    def paired_case_steps(self, task, case: dict, feed: Feed, first: bool, phases: dict) -> Steps:
        """The kernel's timed calls of one case and the reference's, by turns of PAIRED_TURN_CALLS
        (gpumode; gpumode_timing.interleaved_steps), until both loops' stopping rules are met
        (gpumode_timing.Turns): the reference on its own input through the same feed and loop, with the
        torch switches of the first reference timing during its turns and the kernel's again
        during the kernel's. Returns (the kernel's Timing, the reference's as a dict)."""
        cid = task.case_id(case)
        data = make_input(task, case)
        ref_feed = self.timed_feed(task, case, data)
        switches = {"kernel": snapshot_torch_flags()}

        def turn(side: str) -> None:
            if side == "reference":
                switches["kernel"] = snapshot_torch_flags()
                restore_torch_flags(self.flags)
            else:
                restore_torch_flags(switches["kernel"])

        seconds: dict[str, float] = {}
        try:
            turns = Turns(PAIRED_TURN_CALLS, log=[] if self.call_times else None)
            kernel_t, ref_t = yield from interleaved_steps(
                self.timed_case_steps(feed, first, turns), self.timed_case_steps(ref_feed, first, turns),
                task.ref_kernel, turn, seconds)
            if turns.log is not None:
                print(CALL_TIMES_TAG + json.dumps({"task": task.name, "case_id": cid, "loops": ["kernel", "reference"],
                                                   "calls": turns.log}), file=sys.stderr, flush=True)
        except ReferenceFailed as e:
            failure = classify(e.__cause__ or e, self.device, f"reference on case {cid}")
            raise KernelFailure("infrastructure", failure.message, restart=failure.restart,
                                out_of_memory=failure.out_of_memory) from e
        finally:
            turn("kernel")
            phases["timing_s"] += seconds.get("kernel", 0.0)
            phases["reference_s"] += seconds.get("reference", 0.0)
        return kernel_t, {"case_id": cid, **ref_t.as_dict()}

    def timed_case_steps(self, feed: Feed, first: bool, turns: Turns | None = None) -> Steps:
        """One case's timed calls as steps, for the kernel and the reference alike: under gpumode
        the warm-up run (`first`: the first case of a measurement) and the obligatory untimed call
        first. Identical code measured differently when the reference skipped what the kernel got
        (GPU MODE's template TriMul, 0.86-0.88 under gpumode): its calls ran on one input left in
        place, the kernel's on values copied in before each call, with output samples cloned after
        it (allocations the reference's loop never made), so both now go through here."""
        if self.protocol == "gpumode":
            if first:
                yield from gpumode_warmup_steps(feed, self.device)
            out = yield feed.fill()  # GPU MODE's obligatory call before the timed loop of a case
            feed.took(out)
            del out
            sync(self.device)
        return (yield from self.time_steps(feed, turns))

    def _steps(self, task, cases: tuple, progress: Callable[[str], None], result: dict) -> Steps:
        """Every call of one kernel's measurement as steps; returns the cases' Timings.

        What the steps learn goes into `result` when they end (or fail), not while the kernel
        runs: `result` is in the frame that called drive, where a kernel reading its callers'
        frames would see how far its measurement has come (checks done, cases timed)."""
        mine = {"phases": dict(result["phases"]), "check_s": None, "time_s": None, "ref_new": []}
        phases = mine["phases"]
        t0 = time.perf_counter()
        extra = tuple(task.correctness_cases) if self.device == "cuda" and self.check_correctness_cases else ()
        verifier_before = _JUDGE_CLOCK.seconds
        try:
            return (yield from self._checked_and_timed(task, cases + extra, cases, progress, mine, t0))
        finally:
            if verify.pending():  # a failure left outputs with the verifier: it finishes them before anything else runs
                with contextlib.suppress(Exception):
                    verify.collect()
            phases["verifier_s"] = _JUDGE_CLOCK.seconds - verifier_before
            result["phases"].update(phases)
            result["ref_new"] += mine["ref_new"]
            result.update({k: mine[k] for k in ("check_s", "time_s", "autotune_json") if mine.get(k) is not None})

    def _checked_and_timed(self, task, checked: tuple, cases: tuple, progress: Callable[[str], None], result: dict,
                           t0: float) -> Steps:
        """The checks, then the timed cases with their re-checks; returns the cases' Timings.

        Each checked output goes to the verifier as soon as the kernel returns it, so the verifier
        judges it while the kernel runs the next case (nothing is timed then); all verdicts are in
        before the first timed call. The re-check outputs and the timed calls' kept outputs are
        held until every case is timed and then shipped together: the verifier's work never runs
        beside a timed call, and one wait serves them all.
        """
        phases = result["phases"]
        if self.tune_first:
            result["autotune_json"] = yield from self._tuning_steps(task, cases, progress)
        cids: list[str] = []
        for case in checked:
            progress(f"checking {task.case_id(case)}")
            held: list[Held] = []
            yield from check_steps(task, case, self.device, held=held)
            cids += submit_held(task, held, self.device)
        progress("verdicts of the checks")
        collect_verdicts(cids, self.device)
        check_integrity("after the correctness cases")
        result["check_s"] = phases["check_s"] = time.perf_counter() - t0

        t_all = time.perf_counter()
        timings = []
        held: list[Held] = []
        which, salt = recheck_salts(self.protocol)
        for i, case in enumerate(cases):
            cid = task.case_id(case)
            t = time.perf_counter()
            data = make_input(task, case)
            feed = self.timed_feed(task, case, data)
            phases["inputs_s"] = phases.get("inputs_s", 0.0) + time.perf_counter() - t
            t = time.perf_counter()
            try:
                progress(f"timing {cid}")
                with collector_paused():
                    if self.paired_reference:
                        kernel_t, ref_t = yield from self.paired_case_steps(task, case, feed, i == 0, phases)
                        timings.append(kernel_t)
                        result["ref_new"].append(ref_t)
                    else:
                        timings.append((yield from self.timed_case_steps(feed, first=i == 0)))
                        phases["timing_s"] += time.perf_counter() - t
                yield from top_up_steps(feed)
            except KernelFailure:
                raise
            except Exception as e:
                raise classify(e, self.device, f"timing case {cid}") from e
            if which == "all" or i == 0:
                t = time.perf_counter()
                progress(f"recheck {cid}")
                yield from check_steps(task, case, self.device, salt=salt, into=data, held=held)  # same buffers, new values
                phases["recheck_s"] += time.perf_counter() - t
            # After the re-check (the verifier's plan puts it first): wrong on new values is
            # `incorrect` there; wrong only when timed is `tampered`.
            kept = feed.take_kept()
            held += [Held(case, k.salt, k.output, f"{cid} (a timed call)", k.draw) for k in kept]
            del feed, data, kept
        t = time.perf_counter()
        progress("verifying the re-checks and timed calls")
        collect_verdicts(submit_held(task, held, self.device), self.device)
        phases["timed_verify_s"] += time.perf_counter() - t
        check_integrity("after timing")
        result["time_s"] = time.perf_counter() - t_all
        return timings


    def _tuning_steps(self, task, cases: tuple, progress: Callable[[str], None]) -> Steps:
        """One untimed call on each benchmark case's inputs, in order, before the checks: an
        autotuner benchmarks its configs there as in a plain process that runs the benchmark, on
        the real inputs with the GPU quiet. Tuned during the checks instead, its benchmarks shared
        the GPU with the verifier judging the previous case's outputs, and a tuner keyed on the
        row length kept the config it chose on a check's input for every case of that length.
        Returns {case id: {kernel: config}} as JSON, or None when no autotuner tuned."""
        chosen: dict[str, dict[str, str]] = {}
        for case in cases:
            cid = task.case_id(case)
            progress(f"autotuning on {cid}")
            data = make_input(task, case)
            sync(self.device)
            try:
                out = yield data
            except KernelFailure:
                raise  # the autotune budget ran out
            except Exception as e:
                raise classify(e, self.device, f"autotuning on case {cid}") from e
            del out, data
            sync(self.device)
            if picks := AUTOTUNE.choices():
                chosen[cid] = picks
        return json.dumps(chosen, sort_keys=True) if chosen else None


class _JudgeClock:
    """Seconds spent waiting for verdicts (shipping an output and the verifier's work)."""

    def __init__(self) -> None:
        self.seconds = 0.0


_JUDGE_CLOCK = _JudgeClock()
