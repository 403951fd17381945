"""Test-only task `tiny_scale`: y = 2x + 1 on a float32 vector (memory-bound, 8 bytes per element).

Not in the registry: tests and the fault-injection script load it through
KERNELCAST_TASK_MODULES. Correctness cases are ragged and tiny (interpreter-friendly); benchmark
cases move 128-512 MiB, far over the H200's 60 MB L2 and well past 50 us.
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
    name="tiny_scale",
    description="Elementwise y = 2x + 1 over a float32 vector.",
    generate_input=generate_input,
    ref_kernel=ref_kernel,
    check_implementation=check_implementation,
    correctness_cases=({"n": 1000, "seed": 1}, {"n": 37, "seed": 2}),
    benchmark_cases=({"n": 1 << 24, "seed": 11}, {"n": 1 << 26, "seed": 12}),
    tolerances={"rtol": 1e-5, "atol": 1e-5},
)

# kernel file -> (failure kind expected on cuda, kinds accepted on cpu); None = status ok
EXPECTED: dict[str, tuple[str | None, tuple[str | None, ...]]] = {
    "good_triton.py": (None, (None,)),
    "good_torch.py": (None, (None,)),
    "syntax_error.py": ("compile_failed", ("compile_failed",)),
    "no_entry_point.py": ("compile_failed", ("compile_failed",)),
    "bad_triton.py": ("compile_failed", ("compile_failed",)),
    "wrong_result.py": ("incorrect", ("incorrect",)),
    "cache_by_shape.py": ("incorrect", ("incorrect",)),
    "raises.py": ("runtime_error", ("runtime_error",)),
    "hang_python.py": ("timeout", ("timeout",)),
    "hang_triton.py": ("timeout", ("timeout",)),
    "exit_process.py": ("crashed", ("crashed",)),
    "segfault.py": ("crashed", ("crashed",)),
    "illegal_address.py": ("crashed", ("crashed", "runtime_error")),  # interpreter: may raise instead
}
