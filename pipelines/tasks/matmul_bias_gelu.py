"""Task `matmul_bias_gelu`: out = gelu(A @ B + bias), exact (erf) GELU, bf16 in and out.

Reference memory traffic (M x N output, bf16 = 2 bytes): the matmul reads A and B once each
(cuBLAS tiles them) and writes M*N*2 bytes; the bias add reads and writes M*N*2 bytes again; the
GELU reads and writes them a third time. A fused epilogue saves 4 * M * N bytes of traffic, which
matters when K is small relative to M and N (low arithmetic intensity).
"""

from __future__ import annotations

import math

import torch

from pipelines.tasks.contract import (
    Task,
    allclose_check,
    default_device,
    reference_check,
    seeded_generator,
)

RTOL = 2e-2
ATOL = 2e-2

DESCRIPTION = (
    "Fused linear layer with GELU: given A of shape (M, K), B of shape (K, N) and bias of shape "
    "(N,), all bfloat16 and contiguous, compute out = gelu(A @ B + bias) with the exact erf GELU "
    "0.5*x*(1+erf(x/sqrt(2))), returned as a bfloat16 (M, N) tensor. Inputs are a tuple (A, B, "
    "bias). The matmul costs 2*M*N*K FLOPs (tensor-core bound for large K); the PyTorch reference "
    "runs it with cuBLAS and then applies the bias add and the GELU as two separate elementwise "
    "kernels, so it moves the M*N output through global memory three times (about 10*M*N bytes "
    "beyond the matmul). Accumulation must be at least fp32-accurate; results are compared with "
    f"rtol={RTOL}, atol={ATOL}. Benchmark shapes (M x N x K): 4096x4096x4096, 8192x8192x2048 and "
    "two small-K ones, 16384x4096x512 and 8192x8192x256, where the epilogue traffic is a large "
    "share of the reference's time."
)


def generate_input(
    seed: int, M: int, N: int, K: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A (M, K), B (K, N), bias (N,) in bf16; B is scaled by 1/sqrt(K) so outputs are O(1)."""
    dev = default_device()
    gen = seeded_generator(seed, dev)
    a = torch.randn(M, K, generator=gen, device=dev)
    b = torch.randn(K, N, generator=gen, device=dev) / math.sqrt(K)
    bias = torch.randn(N, generator=gen, device=dev)
    return tuple(t.to(dtype=torch.bfloat16).contiguous() for t in (a, b, bias))


def ref_kernel(data: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Unfused PyTorch: cuBLAS matmul, then bias add, then exact GELU (three kernels)."""
    a, b, bias = data
    out = torch.matmul(a, b)  # (M, N) bf16, fp32 accumulation inside cuBLAS
    out = out + bias  # second pass over (M, N)
    return torch.nn.functional.gelu(out, approximate="none")  # third pass


def check_against(data, output, expected) -> tuple[bool, str]:
    """Compare with the reference in fp32 at bf16-level tolerances."""
    return allclose_check(output, expected, rtol=RTOL, atol=ATOL, dtype=torch.bfloat16)


check_implementation = reference_check(ref_kernel, check_against)


TASK = Task(
    name="matmul_bias_gelu",
    description=DESCRIPTION,
    generate_input=generate_input,
    ref_kernel=ref_kernel,
    check_implementation=check_implementation,
    check_against=check_against,
    correctness_cases=(
        {"M": 37, "N": 45, "K": 70, "seed": 11},
        {"M": 64, "N": 32, "K": 48, "seed": 12},
        {"M": 19, "N": 80, "K": 33, "seed": 13},
    ),
    benchmark_cases=(
        {"M": 4096, "N": 4096, "K": 4096, "seed": 1},
        {"M": 8192, "N": 8192, "K": 2048, "seed": 2},
        {"M": 16384, "N": 4096, "K": 512, "seed": 3},
        {"M": 8192, "N": 8192, "K": 256, "seed": 4},
    ),
    tolerances={"rtol": RTOL, "atol": ATOL},
    source="kernelcast",
)
