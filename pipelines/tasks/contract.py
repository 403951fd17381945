"""The kernel task contract, as GPU MODE's reference-kernels use it.

A task gives:
    generate_input(seed, **case) -> data       deterministic by seed, on `default_device()`
    ref_kernel(data) -> output                 the PyTorch reference
    check_implementation(data, output) -> (ok, message)
    check_against(data, output, expected) -> (ok, message)   optional: the same check, given
                                               ref_kernel(data) (verifiers compute it once)
plus small correctness cases (CPU, Triton interpreter, seconds) and benchmark cases (GPU,
well over 50 microseconds each on an H100-class GPU).

A kernel is a Python module that defines `custom_kernel(data) -> output`, so unmodified GPU MODE
submissions run. This module imports only the standard library and torch: the GPU worker
imports it on a bare host.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

Case = dict[str, Any]


def default_device() -> str:
    """Where task inputs live: "cuda" on a GPU host, else "cpu" (the Triton interpreter).

    KERNELCAST_DEVICE overrides (e.g. "cpu" to force interpreter checks on a GPU host; "meta" for
    shapes alone, as the compile children use them).
    """
    forced = os.environ.get("KERNELCAST_DEVICE")
    if forced:
        return forced
    return "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"


def seeded_generator(seed: int, device: str) -> torch.Generator:
    """The random generator a task's inputs on `device` are drawn from, seeded.

    Drawn where they are used: on a GPU host the measuring child and the verifier each generate
    every input they check or time, and drawing the benchmark shapes on the CPU and copying them
    took a fifth of the measuring child's time on an H200 (harness 5). The values differ between
    devices, never between runs or processes on one device; on the CPU they are what
    `torch.Generator().manual_seed(seed)` gives. On "meta" (shapes only: the compile children)
    a CPU generator, which meta factories accept and never draw from."""
    return torch.Generator(device="cpu" if device == "meta" else device).manual_seed(seed)


@dataclass(frozen=True)
class Task:
    """One kernel task. `name` is the stable id used in every table."""

    name: str
    description: str  # one paragraph; the surrogate reads it
    generate_input: Callable[..., Any]
    ref_kernel: Callable[[Any], Any]
    check_implementation: Callable[[Any, Any], tuple[bool, str]]
    correctness_cases: tuple[Case, ...]
    benchmark_cases: tuple[Case, ...]
    tolerances: dict[str, float] = field(default_factory=dict)  # e.g. {"rtol": 2e-2, "atol": 2e-2}
    contract_version: int = 1
    source: str = "kernelcast"  # where the task comes from: "gpumode", "paper", "kernelcast"
    # check_implementation with the reference's output given: (data, output, expected) -> (ok,
    # message), the same verdict as check_implementation(data, output) when expected is
    # ref_kernel(data). A verifier that checks many outputs of one input runs the reference once.
    check_against: Callable[[Any, Any, Any], tuple[bool, str]] | None = None

    def case_id(self, case: Case) -> str:
        """A stable, readable id of a case, e.g. 'M=4096,N=4096,seed=1'."""
        return ",".join(f"{k}={case[k]}" for k in sorted(case))


def allclose_check(
    output: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float, what: str = "output",
    dtype: torch.dtype | None = None,
) -> tuple[bool, str]:
    """Shape/dtype-aware tolerance check with a message a person can act on; with `dtype`, the
    output must also be of that dtype (a kernel returning fp32 for a bf16 task is wrong even
    when its values are close)."""
    if not isinstance(output, torch.Tensor):
        return False, f"{what}: expected a tensor, got {type(output).__name__}"
    if dtype is not None and output.dtype != dtype:
        return False, f"{what}: dtype {output.dtype} != {dtype}"
    if output.shape != expected.shape:
        return False, f"{what}: shape {tuple(output.shape)} != expected {tuple(expected.shape)}"
    out = output.detach().float()
    exp = expected.detach().float()
    if not torch.isfinite(out).all() and torch.isfinite(exp).all():
        return False, f"{what}: contains NaN or inf"
    bad = ~torch.isclose(out, exp, rtol=rtol, atol=atol)
    n_bad = int(bad.sum())
    if n_bad:
        idx = bad.nonzero()[0].tolist()
        return False, (
            f"{what}: {n_bad}/{out.numel()} elements off (rtol={rtol}, atol={atol}); first at {idx}: "
            f"got {out[tuple(idx)].item():.6g}, expected {exp[tuple(idx)].item():.6g}"
        )
    return True, "ok"
