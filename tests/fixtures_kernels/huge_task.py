"""Test-only task `huge_scale`: y = 2x + 1 with benchmark inputs far bigger than any host's memory.

Its benchmark cases are 1 TiB and 4 TiB float32 vectors: only a trace on fake tensors can call a
kernel on them (tests/forecasting/test_source_features.py), which is the point.
"""

from __future__ import annotations

import torch

from pipelines.tasks.contract import Task, allclose_check, default_device


def generate_input(seed: int, n: int) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(n, generator=g, dtype=torch.float32).to(default_device())


def ref_kernel(data: torch.Tensor) -> torch.Tensor:
    return data * 2.0 + 1.0


def check_implementation(data: torch.Tensor, output) -> tuple[bool, str]:
    return allclose_check(output, ref_kernel(data), rtol=1e-5, atol=1e-5)


TASK = Task(
    name="huge_scale",
    description="Elementwise y = 2x + 1 over a float32 vector of 2^38 or 2^40 elements.",
    generate_input=generate_input,
    ref_kernel=ref_kernel,
    check_implementation=check_implementation,
    correctness_cases=({"n": 1000, "seed": 1},),
    benchmark_cases=({"n": 1 << 38, "seed": 11}, {"n": 1 << 40, "seed": 12}),
    tolerances={"rtol": 1e-5, "atol": 1e-5},
)
