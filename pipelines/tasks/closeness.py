"""One pass over an output and its expected value: what `allclose_check` needs, in two launches.

Motivation: `contract.allclose_check` on CUDA tensors makes float32 copies of both tensors, then
runs isfinite twice, isclose, a negation, a sum and a nonzero, with a host sync after several of
them: many passes over memory for one verdict. Here one Triton kernel reads both tensors once in
their own dtypes (bf16, fp16, fp32, fp8 e4m3), upcasts in registers and writes one row of partial
results per program; a second, one-program kernel folds the rows into four numbers, read back with
one device-to-host copy: how many elements are not close, whether the output and the expected hold
a NaN or an infinity, and the flat (row-major) index of the first element that is not close.
Memory traffic: (itemsize(output) + itemsize(expected)) bytes per element, read once.

Closeness is exactly `torch.isclose(out.float(), exp.float(), rtol, atol)` (equal_nan=False):
equal values (equal infinities included) are close; otherwise a pair is close when |a - b| is
finite and |a - b| <= atol + |rtol * b|, each operation rounded to fp32 as torch's separate
kernels round it. By default Triton 3.6 contracts a product feeding a sum: `atol + rtol *
tl.abs(b)` compiled for sm_90 is one `fma.rn.f32` (FFMA), rounded once, which decides some
boundary values the other way. With the launch option `enable_fp_fusion=False` LLVM emits
`mul.rn.f32` and `add.rn.f32` (explicit rounding, which ptxas never fuses) and ptxas runs with
--fmad=false; `tl.fma` would fuse regardless. The kernel keeps torch's order (the abs between
product and sum already blocks contraction) and launches with fusion off, so that no later edit
brings an FMA back; nothing here calls libdevice, the only place Triton flushes denormals.
tests/tasks/test_closeness.py compiles the kernel for sm_90 and checks the PTX for both.

Only dense row-major tensors of equal shape take this path (a tensor `is_contiguous()` flattens
without a copy, and its flat index is the row-major one torch's nonzero() reports first); anything
else is for the caller's torch path. Triton is imported on first use, so this module imports
where only torch is installed.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass

import torch

# Dtypes read as they are (upcast to fp32 in registers). The tasks' outputs reach allclose_check
# as bf16 or fp32; fp16 and fp8 e4m3 are what a kernel may return instead for an unchecked dtype.
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn)

BLOCK = 4096  # elements per program and loop step: 16 per thread at 8 warps (two 16 B loads of bf16)
NUM_WARPS = 8
# The partials kernel's compile options; enable_fp_fusion=False: no mul + add contracted to an FMA.
COMPILE_OPTIONS = {"num_warps": NUM_WARPS, "enable_fp_fusion": False}
PROGRAMS_PER_SM = 4  # a persistent grid: enough programs in flight to saturate memory bandwidth
MAX_PROGRAMS = 1024  # the finish kernel folds this many rows in one block: one compiled variant
INTERPRETER_PROGRAMS = 4  # under TRITON_INTERPRET=1 (CPU): programs run one after another
N_PARTIALS = 4  # per program: not close, output non-finite, expected non-finite, first not close

_disabled = False  # set by disable(): the fused pass failed once in this process


@dataclass(frozen=True)
class Closeness:
    """What one comparison found.

    n_bad: elements that are not close.
    output_nonfinite / expected_nonfinite: the tensor holds a NaN, +inf or -inf.
    first_bad: flat row-major index of the first element that is not close; None when n_bad is 0.
    """

    n_bad: int
    output_nonfinite: bool
    expected_nonfinite: bool
    first_bad: int | None


def supports(output: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether `compare` can take these tensors, wherever they live: dense row-major strided
    tensors of equal shape on one device, each of a supported dtype."""
    return (
        isinstance(output, torch.Tensor)
        and isinstance(expected, torch.Tensor)
        and output.layout == torch.strided
        and expected.layout == torch.strided
        and output.shape == expected.shape
        and output.device == expected.device
        and output.dtype in SUPPORTED_DTYPES
        and expected.dtype in SUPPORTED_DTYPES
        and output.is_contiguous()
        and expected.is_contiguous()
    )


def applies(output: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> bool:
    """Whether the fused comparison should judge these tensors: both on one CUDA device,
    `supports` them, tolerances torch.isclose accepts (it raises on negative ones, and so must the
    caller's torch path), compiled Triton available (under the interpreter torch is faster), and
    not `disable`d."""
    return (
        not _disabled
        and supports(output, expected)
        and output.device.type == "cuda"
        and rtol >= 0
        and atol >= 0
        and os.environ.get("TRITON_INTERPRET") != "1"
        and _triton_installed()
    )


def disable() -> None:
    """Make `applies` answer False from now on in this process (the caller saw `compare` fail:
    one failure, e.g. no compiler for this GPU, is enough to know the next calls would fail too)."""
    global _disabled
    _disabled = True


def compare(output: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float,
            block: int = BLOCK, programs: int | None = None) -> Closeness:
    """Count the elements of `output` not close to `expected`, as torch.isclose on fp32 copies.

    Runs where Triton runs these tensors: a CUDA device, or the CPU under TRITON_INTERPRET=1.

    Args:
        output, expected: tensors `supports` accepts.
        rtol, atol: torch.isclose's tolerances (non-negative).
        block: elements per program and loop step (a power of two; tests make it small).
        programs: size of the persistent grid; by default a few per SM (4 under the interpreter).

    Returns:
        A Closeness, read back with one device-to-host copy.
    """
    if not supports(output, expected):
        raise ValueError("compare takes contiguous tensors of equal shape, one device and dtypes "
                         f"among {SUPPORTED_DTYPES}")
    n = output.numel()
    if n == 0:
        return Closeness(0, False, False, None)
    partials_kernel, finish_kernel = _kernels()
    n_programs = min(programs or _default_programs(output.device), -(-n // block), MAX_PROGRAMS)
    partials = torch.empty((n_programs, N_PARTIALS), dtype=torch.int64, device=output.device)
    result = torch.empty(N_PARTIALS, dtype=torch.int64, device=output.device)
    partials_kernel[(n_programs,)](
        output.detach().reshape(-1), expected.detach().reshape(-1), partials, n,
        float(rtol), float(atol), BLOCK=block, **COMPILE_OPTIONS,
    )
    finish_kernel[(1,)](partials, result, n_programs, n, P_BLOCK=MAX_PROGRAMS)
    n_bad, out_nonfinite, exp_nonfinite, first = result.tolist()  # the one device-to-host copy
    return Closeness(n_bad, bool(out_nonfinite), bool(exp_nonfinite), first if n_bad else None)


def unravel(flat: int, shape: torch.Size) -> list[int]:
    """The index list of a flat row-major index, as `tensor.nonzero()` rows give it.

    >>> unravel(7, torch.Size((2, 3, 2)))
    [1, 0, 1]
    >>> unravel(0, torch.Size(()))
    []
    """
    idx = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        idx.append(i)
    return idx[::-1]


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _default_programs(device: torch.device) -> int:
    if device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return PROGRAMS_PER_SM * _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return INTERPRETER_PROGRAMS


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.cache
def _kernels():
    """The two kernels, defined on first use so that importing this module needs no Triton."""
    import triton
    import triton.language as tl

    @triton.jit
    def closeness_partials(
        # pointers: (n,) flat views in their own dtypes; (n_programs, 4) int64 partial results
        out_ptr, exp_ptr, partials_ptr,
        # size
        n,
        # tolerances, fp32 as torch rounds them for fp32 tensors
        rtol, atol,
        # meta-parameters
        BLOCK: tl.constexpr,
    ):
        # -- map program to tiles: a persistent grid, program p of P takes tiles p, p + P, p + 2P, ...
        pid = tl.program_id(0)
        n_programs = tl.num_programs(0)
        lanes = tl.arange(0, BLOCK)
        n_bad = tl.zeros((BLOCK,), dtype=tl.int32)  # per lane
        out_nonfinite = tl.zeros((BLOCK,), dtype=tl.int32)
        exp_nonfinite = tl.zeros((BLOCK,), dtype=tl.int32)
        first = tl.full((BLOCK,), n, dtype=tl.int64)  # n: none yet
        # int64 starts: tensors past 2**31 elements
        for start in range(pid.to(tl.int64) * BLOCK, n, n_programs.to(tl.int64) * BLOCK):
            offs = start + lanes
            mask = offs < n
            # -- read each tensor once, upcast in registers (exact for every supported dtype); bf16
            #    by its bits, the top half of an fp32: Triton 3.6's interpreter converts bf16
            #    subnormals wrongly, and on a GPU the shift is what the conversion does anyway.
            #    (Inline: the interpreter runs a kernel without its closure, so no helper function.)
            a = tl.load(out_ptr + offs, mask=mask, other=0.0)
            if a.dtype == tl.bfloat16:
                a = (a.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
            else:
                a = a.to(tl.float32)
            b = tl.load(exp_ptr + offs, mask=mask, other=0.0)
            if b.dtype == tl.bfloat16:
                b = (b.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
            else:
                b = b.to(tl.float32)
            # -- torch.isclose: equal, or finite |a - b| within atol + rtol * |b|; one rounding
            #    per operation (the launch forbids contracting the product and sum into an FMA)
            diff = tl.abs(a - b)
            allowed = atol + tl.abs(rtol * b)
            close = (a == b) | ((diff < float("inf")) & (diff <= allowed))  # NaN fails both
            bad = mask & ~close  # masked lanes read 0 == 0: close
            n_bad += bad.to(tl.int32)
            out_nonfinite |= (~(tl.abs(a) < float("inf"))).to(tl.int32)  # NaN and +-inf
            exp_nonfinite |= (~(tl.abs(b) < float("inf"))).to(tl.int32)
            first = tl.minimum(first, tl.where(bad, offs, n))
        # -- one row of partial results per program
        row = partials_ptr + pid * 4
        tl.store(row + 0, tl.sum(n_bad.to(tl.int64), axis=0))
        tl.store(row + 1, tl.max(out_nonfinite, axis=0).to(tl.int64))
        tl.store(row + 2, tl.max(exp_nonfinite, axis=0).to(tl.int64))
        tl.store(row + 3, tl.min(first, axis=0))

    @triton.jit(do_not_specialize=["n_programs", "n"])  # one variant for every tensor
    def closeness_finish(
        # pointers: (n_programs, 4) int64 partial results in; (4,) int64 result out
        partials_ptr, result_ptr,
        # sizes
        n_programs, n,
        # meta-parameters
        P_BLOCK: tl.constexpr,  # MAX_PROGRAMS, a power of two >= n_programs
    ):
        rows = tl.arange(0, P_BLOCK)
        mask = rows < n_programs
        row = partials_ptr + rows * 4
        tl.store(result_ptr + 0, tl.sum(tl.load(row + 0, mask=mask, other=0), axis=0))
        tl.store(result_ptr + 1, tl.max(tl.load(row + 1, mask=mask, other=0), axis=0))
        tl.store(result_ptr + 2, tl.max(tl.load(row + 2, mask=mask, other=0), axis=0))
        first = tl.load(row + 3, mask=mask, other=0)
        tl.store(result_ptr + 3, tl.min(tl.where(mask, first, n), axis=0))

    return closeness_partials, closeness_finish
