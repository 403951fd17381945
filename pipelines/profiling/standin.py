"""A stand-in GPU for processes that compile and trace kernels without running them.

Kernels from libraries ask the device: at import (`triton.runtime.driver.active.utils.
get_device_properties(...)`, `torch.cuda.get_device_properties(0).multi_processor_count`), at call
(`torch.cuda.is_available()`, `with torch.cuda.device(x.device)`, `torch.empty(n, device="cuda")`),
or by compiling ahead (`kernel.warmup(...)`, then `kernel._init_handles()`, `kernel.n_regs`,
`kernel.metadata.shared` to size a persistent grid, then `kernel[grid](...)`). A compiler
cross-compiles for a target it is not running on; in the same way, `standin_device` answers these
questions with the properties of the GPU a forecast is for, in a process that has none (a CPU host)
or must not touch the one it has (a compile child on a GPU host):

- Triton: the active driver is a `StandinDriver` (the target's properties, streams that are
  numbers, a launcher that runs nothing, binaries "loaded" with their registers and spills read
  from the cubin by cuobjdump);
- torch.cuda: availability, device count and properties, capability, streams, events, device and
  stream contexts, synchronisation, NVTX ranges: answers, no work;
- tensors: every tensor answers `is_cuda` as the GPU's inputs would, and "cuda" means the CPU,
  where the inputs are (fake tensors in the trace of pipelines.forecasting.source_features, real
  ones in a compile on a real input): `device="cuda"` (or a device ordinal, `device=0`)
  allocations and moves to the GPU stay there, and pinning host memory is a no-op.
  `x.device` still says cpu: a launcher that branches on `x.device.type` takes its CPU branch.

Only the standard library, torch and triton are used (the GPU worker's compile children use it).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

GIB = 2**30


@dataclass(frozen=True)
class DeviceSpec:
    """What a stand-in device answers: the figures its CUDA driver reports for a real card."""

    name: str
    capability: tuple[int, int]
    sm_count: int
    total_memory_bytes: int
    l2_cache_bytes: int
    sm_clock_khz: int
    mem_clock_khz: int
    mem_bus_width_bits: int
    shared_per_block_optin: int = 232448  # bytes, sm_90
    shared_per_sm: int = 233472  # bytes, sm_90
    registers_per_sm: int = 65536
    registers_per_block: int = 65536
    max_threads_per_sm: int = 2048
    max_threads_per_block: int = 1024
    warp_size: int = 32

    @property
    def cc(self) -> int:
        return self.capability[0] * 10 + self.capability[1]


# The two cards kernelcast measures on: name, SMs, memory, L2 and clocks as the worker recorded
# them from the CUDA driver and nvidia-smi (data/measurements/h200, data/harness/h100).
H200 = DeviceSpec("NVIDIA H200", (9, 0), 132, 150109880320, 62914560, 1980000, 3201000, 6144)
H100 = DeviceSpec("NVIDIA H100 80GB HBM3", (9, 0), 132, 85017493504, 52428800, 1980000, 2619000, 5120)
DEVICES: dict[str, DeviceSpec] = {"nvidia-h200-sm90": H200, "nvidia-h100-80gb-hbm3-sm90": H100}


def device_for(hardware: str | int | None) -> DeviceSpec:
    """The stand-in for a hardware id (a key of DEVICES), a compute capability (90; another one
    keeps the H200's figures under that capability), or None (the H200).

    >>> device_for(None).name, device_for(90).sm_count, device_for("nvidia-h100-80gb-hbm3-sm90").mem_clock_khz
    ('NVIDIA H200', 132, 2619000)
    """
    if hardware is None or hardware == 90 or hardware == "sm_90":
        return H200
    if isinstance(hardware, str) and hardware in DEVICES:
        return DEVICES[hardware]
    if isinstance(hardware, int):
        found = [d for d in DEVICES.values() if d.cc == hardware]
        if found:
            return found[0]
        # another architecture: its capability (what Triton compiles for) on the H200's figures
        return replace(H200, name=f"sm_{hardware}", capability=(hardware // 10, hardware % 10))
    raise ValueError(f"no stand-in device for {hardware!r}; known: {', '.join(DEVICES)}")


def device_properties(spec: DeviceSpec) -> dict[str, int]:
    """Triton's `driver.active.utils.get_device_properties(device)`: the same keys as its C helper."""
    return {"max_shared_mem": spec.shared_per_block_optin, "max_num_regs": spec.registers_per_block,
            "multiprocessor_count": spec.sm_count, "warpSize": spec.warp_size,
            "sm_clock_rate": spec.sm_clock_khz, "mem_clock_rate": spec.mem_clock_khz,
            "mem_bus_width": spec.mem_bus_width_bits}


def torch_properties(spec: DeviceSpec) -> types.SimpleNamespace:
    """`torch.cuda.get_device_properties(...)`: the attributes launchers read."""
    return types.SimpleNamespace(
        name=spec.name, major=spec.capability[0], minor=spec.capability[1],
        multi_processor_count=spec.sm_count, total_memory=spec.total_memory_bytes,
        L2_cache_size=spec.l2_cache_bytes, warp_size=spec.warp_size,
        max_threads_per_multi_processor=spec.max_threads_per_sm,
        max_threads_per_block=spec.max_threads_per_block,
        regs_per_multiprocessor=spec.registers_per_sm,
        shared_memory_per_block=49152, shared_memory_per_block_optin=spec.shared_per_block_optin,
        shared_memory_per_multiprocessor=spec.shared_per_sm,
        clock_rate=spec.sm_clock_khz, memory_clock_rate=spec.mem_clock_khz,
        memory_bus_width=spec.mem_bus_width_bits, is_integrated=False, is_multi_gpu_board=False,
        uuid="standin", gcnArchName="")


# =============================================================================================
# Triton: the driver
# =============================================================================================

# A launch of a compiled kernel made through the stand-in driver (`kernel[grid](*args)` after
# `warmup`): called as on_launch(compiled_kernel_name, grid, args). The aot capture sets it.
LaunchHook = Callable[[str, tuple[int, int, int], tuple], None]


_RESOURCE_RE = re.compile(
    r"Function\s+(\S+):\s*\n\s*REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)"
)


def cubin_resources(cubin: bytes, workdir: str | None = None) -> tuple[int, int]:
    """(registers, stack bytes) per thread of a cubin, max over its functions, read by the
    cuobjdump Triton ships (`--dump-resource-usage`), as the driver reports them once loaded."""
    from triton import knobs

    with tempfile.TemporaryDirectory(prefix="kernelcast-cubin-", dir=workdir) as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        out = subprocess.run([str(knobs.nvidia.cuobjdump.path), "--dump-resource-usage", path],
                             capture_output=True, text=True, check=True)
    found = _RESOURCE_RE.findall(out.stdout)
    if not found:
        lines = (out.stdout + out.stderr).strip().splitlines()
        raise RuntimeError(f"cuobjdump gave no resource usage: {lines[0] if lines else 'no output'}")
    return max(int(m[1]) for m in found), max(int(m[2]) for m in found)


class StandinDriver:
    """Triton's active driver for a target that is not here (a `DriverBase` in all Triton asks).

    Compiles are Triton's own (`get_current_target` names the stand-in's capability); a compiled
    kernel's binary "loads" with its real register and spill counts; its launches run nothing and
    are reported to `on_launch`."""

    def __init__(self, spec: DeviceSpec, on_launch: LaunchHook | None = None):
        from triton.backends.compiler import GPUTarget
        from triton.backends.nvidia.driver import ty_to_cpp

        self.spec = spec
        self.on_launch = on_launch
        self.target = GPUTarget("cuda", spec.cc, spec.warp_size)
        self._ty_to_cpp = ty_to_cpp
        driver = self

        class Utils:
            @staticmethod
            def get_device_properties(device: Any = 0) -> dict[str, int]:
                return device_properties(spec)

            @staticmethod
            def load_binary(name: str, kernel: bytes, shared: int, device: Any) -> tuple:
                n_regs, stack = cubin_resources(kernel)
                return 0, 0, n_regs, stack // 4, spec.max_threads_per_block

            @staticmethod
            def cuOccupancyMaxActiveClusters(*args: Any) -> int:  # noqa: N802 - Triton's name
                return 1

            @staticmethod
            def set_printf_fifo_size(size: int) -> None:
                return None

            @staticmethod
            def fill_tma_descriptor(*args: Any) -> None:
                return None

        class Launcher:
            def __init__(self, src: Any, metadata: Any):
                self.name = getattr(metadata, "name", "?")

            def __call__(self, grid_x, grid_y, grid_z, stream, function, *args):
                if driver.on_launch is not None:
                    # args: packed metadata, launch metadata, enter hook, exit hook, kernel args
                    driver.on_launch(self.name, (int(grid_x), int(grid_y), int(grid_z)), args[4:])

        self.utils = Utils()
        self.launcher_cls = Launcher

    @staticmethod
    def is_active() -> bool:
        return True

    def map_python_to_cpp_type(self, ty: str) -> str:
        return self._ty_to_cpp(ty)

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cuda", 0)

    def get_device_interface(self):
        return torch.cuda

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device: Any) -> None:
        return None

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_device_capability(self, device: Any = None) -> tuple[int, int]:
        return self.spec.capability

    def get_benchmarker(self):
        return _no_benchmark

    def get_empty_cache_for_benchmark(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int32)

    def clear_cache(self, cache: Any) -> None:
        return None

    def assemble_tensormap_to_arg(self, tensormaps_info: Any, args: Any) -> Any:
        return args


def _no_benchmark(kernel_call: Callable, *args: Any, quantiles: Any = None, **kwargs: Any) -> Any:
    """A benchmarker that times nothing (an autotuner outside a capture asks it): every config 1 ms."""
    return [1.0] * len(quantiles) if quantiles else 1.0


# =============================================================================================
# torch: torch.cuda and device placement
# =============================================================================================


class _Stream:
    """A stream of the stand-in device: a number, usable as a context and waited on."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any):
        self.device = torch.device("cuda", 0)
        self.cuda_stream = 0
        self.priority = priority

    def wait_stream(self, other: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> Any:
        return event if event is not None else _Event()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


class _Event:
    """An event of the stand-in device: records nothing, times nothing."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing

    def record(self, stream: Any = None) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Any) -> float:
        return 0.0


class _DeviceContext:
    """`torch.cuda.device(i)` and `torch.cuda.device_of(t)`: the one stand-in device is current."""

    def __init__(self, device: Any = None):
        self.idx = 0

    def __enter__(self) -> _DeviceContext:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


def _torch_cuda_answers(spec: DeviceSpec) -> dict[str, Any]:
    """torch.cuda attribute -> the stand-in's answer."""
    props = torch_properties(spec)
    stream = _Stream()
    return {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "_lazy_init": lambda: None,
        "init": lambda: None,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": lambda device: None,
        "get_device_properties": lambda device=None: props,
        "get_device_capability": lambda device=None: spec.capability,
        "get_device_name": lambda device=None: spec.name,
        "get_arch_list": lambda: [f"sm_{spec.cc}"],
        "is_bf16_supported": lambda including_emulation=True: True,
        "synchronize": lambda device=None: None,
        "current_stream": lambda device=None: stream,
        "default_stream": lambda device=None: stream,
        "set_stream": lambda s: None,
        "stream": lambda s=None: contextlib.nullcontext(s),
        "Stream": _Stream,
        "Event": _Event,
        "device": _DeviceContext,
        "device_of": _DeviceContext,
        "empty_cache": lambda: None,
        "mem_get_info": lambda device=None: (spec.total_memory_bytes, spec.total_memory_bytes),
        "memory_allocated": lambda device=None: 0,
        "max_memory_allocated": lambda device=None: 0,
        "memory_reserved": lambda device=None: 0,
        "reset_peak_memory_stats": lambda device=None: None,
        "manual_seed": lambda seed: None,
        "manual_seed_all": lambda seed: None,
        "nvtx": _NVTX,
    }


# torch.cuda.nvtx: profiler ranges around a launch mark nothing without a GPU (torch's raise
# "NVTX functions not installed" in a build without CUDA)
_NVTX = types.SimpleNamespace(range_push=lambda msg: 0, range_pop=lambda: 0, mark=lambda msg: None,
                              range_start=lambda msg: 0, range_end=lambda range_id: None,
                              range=lambda msg, *args, **kwargs: contextlib.nullcontext())


def _is_cuda(device: Any) -> bool:
    """Whether `device` names the GPU: "cuda", "cuda:N", a CUDA torch.device, or a bare ordinal
    (`device=torch.cuda.current_device()`, `.to(0)`), which means the GPU wherever one is."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device == "cuda" or device.startswith("cuda:")
    return isinstance(device, int) and not isinstance(device, bool) and device >= 0


class _Placement(torch.overrides.TorchFunctionMode):
    """"cuda" is where the inputs are: a tensor asked for on the GPU (`device="cuda"`, a
    `torch.device("cuda")`) is made on the CPU, and moves to the GPU (`.cuda()`, `.to("cuda")`)
    keep it there (a cast at most). Under a FakeTensorMode (the trace of
    pipelines.forecasting.source_features) those are fake CPU tensors, which take every view and
    index op; torch's fake CUDA tensors do not in a build without CUDA (indexing, transposes and
    copies raise "not linked with support for cuda devices")."""

    _MOVES = frozenset({"to", "cuda"})

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name == "pin_memory" and args and isinstance(args[0], torch.Tensor):
            return args[0]  # page-locking for faster copies to the GPU: nothing to do where "cuda" is here
        if name in self._MOVES and args and isinstance(args[0], torch.Tensor):
            if _move_target(name, args[1:], kwargs) is not None:
                t = args[0]
                dtype = _move_dtype(args[1:], kwargs) or t.dtype
                return t.to(dtype=dtype) if dtype != t.dtype else t
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def _move_target(name: str, args: tuple, kwargs: dict) -> Any:
    """The CUDA device a `.to(...)` / `.cuda(...)` call moves to, or None."""
    if name == "cuda":
        return torch.device("cuda", 0)
    for a in (*args, kwargs.get("device")):
        if _is_cuda(a):
            return a
    return None


def _move_dtype(args: tuple, kwargs: dict) -> torch.dtype | None:
    if isinstance(kwargs.get("dtype"), torch.dtype):
        return kwargs["dtype"]
    for a in args:
        if isinstance(a, torch.dtype):
            return a
        if isinstance(a, torch.Tensor):
            return a.dtype
    return None


# =============================================================================================
# The context
# =============================================================================================


@contextlib.contextmanager
def standin_device(spec: DeviceSpec = H200, on_launch: LaunchHook | None = None) -> Iterator[StandinDriver]:
    """Inside: Triton's driver and torch.cuda answer as `spec`, and "cuda" tensors are placed as
    the module docstring says. Everything is restored on exit; not thread-safe (one kernel at a
    time per process, as the compile children run them)."""
    from triton.runtime.driver import driver as triton_driver

    standin = StandinDriver(spec, on_launch)
    saved_driver = triton_driver._active
    saved_cuda = {k: getattr(torch.cuda, k) for k in _torch_cuda_answers(spec) if hasattr(torch.cuda, k)}
    added = [k for k in _torch_cuda_answers(spec) if not hasattr(torch.cuda, k)]
    saved_is_cuda = torch.Tensor.__dict__.get("is_cuda")
    triton_driver.set_active(standin)
    for k, v in _torch_cuda_answers(spec).items():
        setattr(torch.cuda, k, v)
    # the class attribute shadows the C property of every tensor, subclasses' own included
    torch.Tensor.is_cuda = property(lambda self: True)
    try:
        with _Placement():
            yield standin
    finally:
        if saved_is_cuda is None:
            del torch.Tensor.is_cuda
        else:
            torch.Tensor.is_cuda = saved_is_cuda
        triton_driver._active = saved_driver
        for k, v in saved_cuda.items():
            setattr(torch.cuda, k, v)
        for k in added:
            delattr(torch.cuda, k)
