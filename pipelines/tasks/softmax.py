"""Row softmax of a bf16 matrix, fp32 math inside.

The reference is the plain PyTorch expression `torch.softmax(x.float(), dim=-1).to(bf16)`
(KernelBench style): three kernels, upcast -> softmax -> downcast, through an fp32 temporary.
Bytes per element: upcast 2 read + 4 write, softmax 4 + 4, downcast 4 + 2 = 20 B/elt, where a
fused kernel moves 2 + 2 = 4 B/elt, so a fused Triton kernel has up to ~5x of headroom.
"""

from __future__ import annotations

import torch

from pipelines.tasks import rowwise
from pipelines.tasks.contract import (
    Task,
    allclose_check,
    default_device,
    reference_check,
    seeded_generator,
)

RTOL = 2e-2
# Probabilities of a 16k-wide row are ~6e-5: atol must stay far below that to mean anything.
ATOL = 1e-5
ROW_SUM_TOL = 2e-2


def generate_input(seed: int, M: int, N: int) -> tuple[torch.Tensor]:
    """x: (M, N) bf16, N(0, 2^2) logits, drawn on the device the task runs on (seeded_generator)."""
    dev = default_device()
    gen = seeded_generator(seed, dev)
    x = torch.randn(M, N, generator=gen, device=dev, dtype=torch.float32) * 2.0
    return (x.to(torch.bfloat16),)


def ref_kernel(data: tuple[torch.Tensor]) -> torch.Tensor:
    """softmax(x) over the last dim in fp32, rounded to bf16: (M, N) bf16."""
    (x,) = data
    # 20 B/elt over three kernels: x.float() 2R+4W, softmax 4R+4W, .to(bf16) 4R+2W.
    return torch.softmax(x.float(), dim=-1).to(torch.bfloat16)


def check_against(data: tuple[torch.Tensor], output: torch.Tensor, expected) -> tuple[bool, str]:
    """Elementwise close to the reference (rtol 2e-2, atol 1e-5) and every row sums to 1."""
    ok, msg = allclose_check(output, expected, rtol=RTOL, atol=ATOL, dtype=torch.bfloat16)
    if not ok:
        return ok, msg
    row_err = (output.float().sum(-1) - 1.0).abs().max().item()
    if row_err > ROW_SUM_TOL:
        return False, f"output: a row sums to 1 +- {row_err:.3g} (tolerance {ROW_SUM_TOL})"
    return True, "ok"


check_implementation = reference_check(ref_kernel, check_against)


TASK = Task(
    name="softmax",
    description=(
        "Row-wise softmax: given x of shape (M, N) in bfloat16 (row-major, contiguous), return "
        "y = softmax(x, dim=-1) of shape (M, N) in bfloat16, computed in fp32 "
        "(y_ij = exp(x_ij - max_j x_ij) / sum_j exp(x_ij - max_j x_ij)) and rounded once to bf16. "
        "The PyTorch reference is torch.softmax(x.float(), dim=-1).to(torch.bfloat16): three "
        "kernels (upcast, softmax, downcast) through an fp32 (M, N) temporary, about 20 bytes of "
        "HBM traffic per element, where a fused kernel needs only 4 (read 2 B, write 2 B). The "
        "task is memory-bound: each row needs its max and sum before any output can be written, "
        "so a kernel either keeps the row on chip (registers/shared memory) or reads it again. "
        "Benchmark shapes go from 512 to 16384 columns, one of them not a power of two."
    ),
    generate_input=generate_input,
    ref_kernel=ref_kernel,
    check_implementation=check_implementation,
    check_against=check_against,
    correctness_cases=rowwise.CORRECTNESS_CASES,
    # Reference time on an H200 ~ 20 B/elt / 3.5e12 B/s: 8192^2 ~380 us, 2048x16384 ~190 us,
    # 65536x512 ~190 us, 4096x10000 ~230 us.
    benchmark_cases=(
        {"M": 8192, "N": 8192, "seed": 11},
        {"M": 2048, "N": 16384, "seed": 12},
        {"M": 65536, "N": 512, "seed": 13},
        {"M": 4096, "N": 10000, "seed": 14},
    ),
    tolerances={"rtol": RTOL, "atol": ATOL, "row_sum": ROW_SUM_TOL},
)
