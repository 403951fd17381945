"""The compile role: a kernel imported and compiled for every benchmark shape, with nothing launched.

Compile children run ahead of the measuring child, so it finds each kernel's Triton specialisations
(and their launchers) in the cache instead of compiling inside its checks: every Triton launch
compiles but runs nothing (`triton_launches_suppressed`), on the benchmark inputs on the GPU or, with
COMPILE_INPUTS = "meta", on shape-only meta tensors that put no work on the GPU while it times.
Harness code the integrity watch covers (integrity.HARNESS_MODULES).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pipelines.profiling import inputs
from pipelines.profiling.inputs import (
    CACHE,
    clone_data,
    make_input,
    map_tensors,
)
from pipelines.profiling.kernel_loading import (
    AUTOTUNE,
    KernelFailure,
    _checked_after_unload,
    _describe,
    _failed,
    _imported,
    _is_triton_compile_error,
    check_integrity,
    cuda_healthy,
    keep_tuning_in_memory,
    unload_kernel,
    use_kernel_cache,
)

log = logging.getLogger(__name__)


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


@contextlib.contextmanager
def triton_launches_suppressed():
    """Within: every Triton launch compiles (and fills the cache) but does not run.

    Compile workers use this on the benchmark shapes, so the measuring process finds the exact
    specialisations in TRITON_CACHE_DIR without the compile workers putting load on the GPU
    it is timing on. Autotuners get a benchmarker that just compiles each config once, and keep
    what they then choose to themselves (its timings are not timings): nothing goes to, or comes
    from, the autotune results on disk (kernel_loading.keep_tuning_in_memory). A
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
    keep_tuning_in_memory()  # for good: a choice made on stand-in timings never reaches the disk
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
