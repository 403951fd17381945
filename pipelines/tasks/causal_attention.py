"""Task `causal_attention`: softmax(q k^T / sqrt(D), causal) v for bf16 (B, H, S, D) tensors.

Reference memory traffic per (batch, head): the explicit formulation materialises the S x S score
matrix in bf16 (matmul output), then in fp32 (scale, mask, softmax each read and write it), then the
probabilities in bf16 for the second matmul: roughly 30 * S^2 bytes per head against 8 * S * D bytes
of real inputs and outputs. A flash-style kernel keeps scores on chip and skips the masked half.
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
    "Causal self-attention forward: given q, k, v of shape (B, H, S, D) in bfloat16 (contiguous), "
    "compute out = softmax(q @ k^T * D**-0.5 with positions j > i masked out) @ v, returned as a "
    "bfloat16 (B, H, S, D) tensor. Inputs are a tuple (q, k, v). Useful work is about 2*B*H*S^2*D "
    "FLOPs (half of the dense 4*B*H*S^2*D, thanks to the causal mask). The PyTorch reference is "
    "the explicit math, not a fused attention: a bf16 batched matmul writes the full S x S scores, "
    "which are scaled, masked and softmaxed in fp32 as separate kernels, cast to bf16 and "
    "multiplied by v, so it moves O(B*H*S^2) bytes through global memory several times. Results "
    f"are compared with rtol={RTOL}, atol={ATOL}. Benchmark shapes (B, H, S, D): (4, 16, 2048, 64), "
    "(4, 16, 2048, 128), (1, 32, 4096, 128) and (8, 16, 1024, 64)."
)


def generate_input(seed: int, B: int, H: int, S: int, D: int) -> tuple[torch.Tensor, ...]:
    """q, k, v as standard normal bf16 tensors of shape (B, H, S, D)."""
    dev = default_device()
    gen = seeded_generator(seed, dev)
    return tuple(
        torch.randn(B, H, S, D, generator=gen, device=dev).to(dtype=torch.bfloat16).contiguous()
        for _ in range(3)
    )


def ref_kernel(data: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Explicit attention: bf16 scores, fp32 scale/mask/softmax, bf16 probabilities @ v."""
    q, k, v = data
    S, D = q.shape[-2], q.shape[-1]
    scores = torch.matmul(q, k.transpose(-2, -1)).float() * (
        1.0 / math.sqrt(D)
    )  # (B, H, S, S) fp32
    causal = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1)  # True above the diagonal
    scores = scores.masked_fill(causal, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs.to(v.dtype), v)  # (B, H, S, D) bf16


def check_against(data, output, expected) -> tuple[bool, str]:
    """Compare with the reference in fp32 at bf16-level tolerances."""
    return allclose_check(output, expected, rtol=RTOL, atol=ATOL, dtype=torch.bfloat16)


check_implementation = reference_check(ref_kernel, check_against)


TASK = Task(
    name="causal_attention",
    description=DESCRIPTION,
    generate_input=generate_input,
    ref_kernel=ref_kernel,
    check_implementation=check_implementation,
    check_against=check_against,
    correctness_cases=(
        {"B": 1, "H": 2, "S": 50, "D": 32, "seed": 21},
        {"B": 2, "H": 1, "S": 37, "D": 64, "seed": 22},
        {"B": 1, "H": 1, "S": 64, "D": 16, "seed": 23},
    ),
    benchmark_cases=(
        {"B": 4, "H": 16, "S": 2048, "D": 64, "seed": 1},
        {"B": 4, "H": 16, "S": 2048, "D": 128, "seed": 2},
        {"B": 1, "H": 32, "S": 4096, "D": 128, "seed": 3},
        {"B": 8, "H": 16, "S": 1024, "D": 64, "seed": 4},
    ),
    tolerances={"rtol": RTOL, "atol": ATOL},
    source="kernelcast",
)
