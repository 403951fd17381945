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
submissions run. This module imports only the standard library and torch (closeness imports
Triton on first use): the GPU worker imports it on a bare host.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from pipelines.tasks import closeness

log = logging.getLogger(__name__)

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
    took a fifth of the measuring child's time (docs/results/harness.md). The values differ between
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


def reference_check(ref_kernel: Callable[[Any], Any],
                    check_against: Callable[[Any, Any, Any], tuple[bool, str]]) -> Callable[[Any, Any], tuple[bool, str]]:
    """A task's check_implementation(data, output): its check_against the reference's output on data."""

    def check_implementation(data: Any, output: Any) -> tuple[bool, str]:
        return check_against(data, output, ref_kernel(data))

    return check_implementation


def allclose_check(
    output: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float, what: str = "output",
    dtype: torch.dtype | None = None, *, fused: bool | None = None,
) -> tuple[bool, str]:
    """Shape/dtype-aware tolerance check with a message a person can act on; with `dtype`, the
    output must also be of that dtype (a kernel returning fp32 for a bf16 task is wrong even
    when its values are close).

    Closeness is torch.isclose on fp32 copies. On CUDA the values are judged by one fused pass
    (`pipelines.tasks.closeness`) where it applies, else by torch ops; both give the same verdict
    and message. `fused` forces one way (True: the fused pass wherever Triton runs the tensors,
    the CPU under TRITON_INTERPRET=1 included; False: torch ops), for tests and benchmarks."""
    if not isinstance(output, torch.Tensor):
        return False, f"{what}: expected a tensor, got {type(output).__name__}"
    if dtype is not None and output.dtype != dtype:
        return False, f"{what}: dtype {output.dtype} != {dtype}"
    if output.shape != expected.shape:
        return False, f"{what}: shape {tuple(output.shape)} != expected {tuple(expected.shape)}"
    if fused is None and closeness.applies(output, expected, rtol, atol):
        try:
            return _fused_verdict(output, expected, rtol, atol, what)
        except Exception:  # e.g. no compiler for this GPU: torch ops give the same verdict
            log.warning("fused closeness check failed; this process judges with torch ops from "
                        "now on", exc_info=True)
            closeness.disable()
    elif fused:
        return _fused_verdict(output, expected, rtol, atol, what)
    return _torch_verdict(output, expected, rtol, atol, what)


def _torch_verdict(output: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float,
                   what: str) -> tuple[bool, str]:
    out = output.detach().float()
    exp = expected.detach().float()
    if not torch.isfinite(out).all() and torch.isfinite(exp).all():
        return False, f"{what}: contains NaN or inf"
    bad = ~torch.isclose(out, exp, rtol=rtol, atol=atol)
    n_bad = int(bad.sum())
    if n_bad:
        idx = bad.nonzero()[0].tolist()
        return False, _off_message(what, n_bad, out.numel(), rtol, atol, idx,
                                   out[tuple(idx)].item(), exp[tuple(idx)].item())
    return True, "ok"


def _fused_verdict(output: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float,
                   what: str) -> tuple[bool, str]:
    """_torch_verdict's answer from one fused pass; on a failure only the first element that is
    off is read back (both values in one copy)."""
    found = closeness.compare(output, expected, rtol, atol)
    if found.output_nonfinite and not found.expected_nonfinite:
        return False, f"{what}: contains NaN or inf"
    if found.n_bad:
        at = found.first_bad
        got, want = torch.stack(
            (output.detach().reshape(-1)[at].float(), expected.detach().reshape(-1)[at].float())
        ).tolist()
        return False, _off_message(what, found.n_bad, output.numel(), rtol, atol,
                                   closeness.unravel(at, output.shape), got, want)
    return True, "ok"


def _off_message(what: str, n_bad: int, numel: int, rtol: float, atol: float, idx: list[int],
                 got: float, want: float) -> str:
    return (
        f"{what}: {n_bad}/{numel} elements off (rtol={rtol}, atol={atol}); first at {idx}: "
        f"got {got:.6g}, expected {want:.6g}"
    )
