"""LayerNorm of a bf16 matrix with bf16 weight and bias, eps = 1e-5.

The reference is `F.layer_norm(x.float(), (N,), weight.float(), bias.float(), eps).to(bf16)`:
PyTorch's fused fp32 LayerNorm between an upcast and a downcast, three kernels and about
20 B of HBM traffic per element (upcast 2R+4W, layer_norm 4R+4W, downcast 4R+2W) against
4 B/elt for a fused bf16-in/bf16-out kernel: up to ~5x of headroom.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipelines.tasks import rowwise
from pipelines.tasks.contract import (
    Task,
    allclose_check,
    default_device,
    reference_check,
    seeded_generator,
)

EPS = 1e-5
RTOL = 2e-2
ATOL = 2e-2


def generate_input(seed: int, M: int, N: int):
    """(x (M, N) bf16 ~ 0.5 + N(0,1), weight (N,) ~ 1 + N(0, 0.1^2), bias (N,) ~ N(0, 0.1^2), eps).

    The non-zero mean makes a kernel that forgets to centre x (or mixes up mean and variance) fail.
    """
    dev = default_device()
    gen = seeded_generator(seed, dev)
    x = 0.5 + torch.randn(M, N, generator=gen, device=dev, dtype=torch.float32)
    w = 1.0 + 0.1 * torch.randn(N, generator=gen, device=dev, dtype=torch.float32)
    b = 0.1 * torch.randn(N, generator=gen, device=dev, dtype=torch.float32)
    bf = torch.bfloat16
    return x.to(bf), w.to(bf), b.to(bf), EPS


def ref_kernel(data) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias in fp32 (biased var), rounded to bf16."""
    x, weight, bias, eps = data
    n = x.shape[-1]
    # 20 B/elt: x.float() 2R+4W, layer_norm 4R+4W, .to(bf16) 4R+2W.
    y = F.layer_norm(x.float(), (n,), weight.float(), bias.float(), eps)
    return y.to(torch.bfloat16)


def check_against(data, output: torch.Tensor, expected) -> tuple[bool, str]:
    """Elementwise close to the reference, rtol = atol = 2e-2, bf16 output."""
    return allclose_check(output, expected, rtol=RTOL, atol=ATOL, dtype=torch.bfloat16)


check_implementation = reference_check(ref_kernel, check_against)


TASK = Task(
    name="layer_norm",
    description=(
        "LayerNorm: given x of shape (M, N) in bfloat16 (row-major, contiguous), weight and bias of "
        "shape (N,) in bfloat16 and eps = 1e-5, return y = (x - mean_j x) / sqrt(var_j x + eps) * "
        "weight + bias (biased variance) of shape (M, N) in bfloat16, statistics and normalisation "
        "in fp32. The PyTorch reference is F.layer_norm(x.float(), (N,), weight.float(), "
        "bias.float(), eps).to(bf16): an upcast kernel, PyTorch's fused fp32 LayerNorm and a "
        "downcast, about 20 bytes of HBM traffic per element where a fused kernel needs 4 (read "
        "2 B, write 2 B; weight and bias stay in cache). Memory-bound; each row needs mean and "
        "variance (two reductions, or one pass of sum and sum of squares, or Welford) before its "
        "outputs. Benchmark rows are 4096 to 16384 wide, one width (5120) not a power of two."
    ),
    generate_input=generate_input,
    ref_kernel=ref_kernel,
    check_implementation=check_implementation,
    check_against=check_against,
    correctness_cases=rowwise.CORRECTNESS_CASES,
    # Reference on an H200 ~ 20 B/elt / 3.5e12 B/s: 8192^2 ~380 us, 16384x4096 ~380 us,
    # 2048x16384 ~190 us, 6144x5120 ~180 us.
    benchmark_cases=rowwise.NORM_BENCHMARK_CASES,
    tolerances={"rtol": RTOL, "atol": ATOL},
)
