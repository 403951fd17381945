"""RMSNorm of a bf16 matrix with a bf16 weight, eps = 1e-6.

The reference is the plain, unfused PyTorch expression of Hugging Face's LlamaRMSNorm:
    h = x.float(); var = h.pow(2).mean(-1, keepdim=True); h = h * rsqrt(var + eps)
    y = weight * h.to(bf16)
Six kernels and about 36 B of HBM traffic per element (upcast 2R+4W, pow 4R+4W, mean 4R,
scale 4R+4W, downcast 4R+2W, weight multiply 2R+2W) against 4 B/elt for a fused kernel, so a
fused Triton kernel has up to ~9x of headroom.
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

EPS = 1e-6
RTOL = 2e-2
ATOL = 2e-2


def generate_input(seed: int, M: int, N: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(x (M, N) bf16 ~ N(0,1), weight (N,) bf16 ~ 1 + N(0, 0.1^2), eps), drawn on the task's device."""
    dev = default_device()
    gen = seeded_generator(seed, dev)
    x = torch.randn(M, N, generator=gen, device=dev, dtype=torch.float32)
    w = 1.0 + 0.1 * torch.randn(N, generator=gen, device=dev, dtype=torch.float32)
    return x.to(torch.bfloat16), w.to(torch.bfloat16), EPS


def ref_kernel(data: tuple[torch.Tensor, torch.Tensor, float]) -> torch.Tensor:
    """weight * (x / sqrt(mean(x^2) + eps)) in fp32, rounded to bf16 before the weight: (M, N) bf16."""
    x, weight, eps = data
    h = x.float()  # 2R + 4W B/elt
    var = h.pow(2).mean(-1, keepdim=True)  # 4R + 4W, then 4R
    h = h * torch.rsqrt(var + eps)  # 4R + 4W
    return weight * h.to(torch.bfloat16)  # 4R + 2W, then 2R + 2W


def check_against(data, output: torch.Tensor, expected) -> tuple[bool, str]:
    """Elementwise close to the reference, rtol = atol = 2e-2, bf16 output."""
    return allclose_check(output, expected, rtol=RTOL, atol=ATOL, dtype=torch.bfloat16)


check_implementation = reference_check(ref_kernel, check_against)


TASK = Task(
    name="rms_norm",
    description=(
        "RMSNorm: given x of shape (M, N) in bfloat16 (row-major, contiguous), weight of shape (N,) "
        "in bfloat16 and eps = 1e-6, return y = weight * (x / sqrt(mean_j(x_ij^2) + eps)) of shape "
        "(M, N) in bfloat16, with the reduction and normalisation in fp32. The PyTorch reference is "
        "the unfused Hugging Face LlamaRMSNorm expression (h = x.float(); var = h.pow(2).mean(-1); "
        "h = h * rsqrt(var + eps); weight * h.to(bf16)): six kernels and about 36 bytes of HBM "
        "traffic per element, where a fused kernel reads x once (2 B), writes y once (2 B) and "
        "re-reads the small weight vector from cache. Memory-bound; each row needs one reduction "
        "(sum of squares) before its outputs can be written. Benchmark rows are 4096 to 16384 wide, "
        "one width (5120) not a power of two."
    ),
    generate_input=generate_input,
    ref_kernel=ref_kernel,
    check_implementation=check_implementation,
    check_against=check_against,
    correctness_cases=rowwise.CORRECTNESS_CASES,
    # Reference on an H200 ~ 36 B/elt / 3.5e12 B/s: 8192^2 ~690 us, 16384x4096 ~690 us,
    # 2048x16384 ~345 us, 6144x5120 ~320 us.
    benchmark_cases=rowwise.NORM_BENCHMARK_CASES,
    tolerances={"rtol": RTOL, "atol": ATOL},
)
