"""The helpers GPU MODE problems ship as `utils.py`, so submissions that import them run unmodified.

A GPU MODE submission may `from utils import make_match_reference, verbose_allclose,
DisableCuDNNTF32, set_seed, clear_l2_cache, ...`; `pipelines.tasks.gpumode.install` makes this
module importable as `utils`. Written here from the behaviour GPU MODE documents for each helper
(gpu-mode/reference-kernels, problems/*/utils.py), not copied:

- verbose_allclose(received, expected, rtol, atol, max_print) -> (ok, reasons): a mismatch is an
  element with |received - expected| > atol + rtol * |expected| (in float32), or NaN / +inf / -inf
  in one tensor but not the other; equal NaNs and equal infinities match. Shapes must agree.
- match_reference / make_match_reference: run the reference on the data, compare with
  verbose_allclose, return (ok, reasons joined by a literal backslash-n).
- DisableCuDNNTF32: cuDNN TF32 off and cuDNN deterministic inside the block. It does not touch
  cuBLAS's TF32 switch (torch.backends.cuda.matmul.allow_tf32), as GPU MODE's does not.
- DeterministicContext: that, plus torch.use_deterministic_algorithms(True).
- clear_l2_cache / clear_l2_cache_large: write a device buffer larger than the L2 cache.

Imports only the standard library, numpy and torch (the GPU worker imports this on a bare host).
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

L2_FLUSH_BYTES = 256 * 2**20  # larger than any current GPU's L2 (H200: 60 MB)


def set_seed(seed: int = 42) -> None:
    """Seed Python's, numpy's and torch's (CPU and every CUDA device) global generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def get_device(use_cuda: bool = True) -> torch.device:
    """cuda when asked for and present, else mps when present, else cpu."""
    if use_cuda and torch.cuda.is_available():
        return torch.device("cuda")
    if use_cuda and getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _mismatch_report(mismatched: torch.Tensor, received: torch.Tensor, expected: torch.Tensor,
                     max_print: int) -> list[str]:
    count = int(mismatched.count_nonzero().item())
    lines = [f"Number of mismatched elements: {count}"]
    for index in torch.nonzero(mismatched)[:max_print].tolist():
        i = tuple(index)
        lines.append(f"ERROR at {i}: {received[i]} {expected[i]}")
    if count > max_print:
        lines.append(f"... and {count - max_print} more mismatched elements.")
    return lines


@torch.no_grad()
def verbose_allclose(received: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-05, atol: float = 1e-08,
                     max_print: int = 5) -> tuple[bool, list[str]]:
    """Elementwise closeness with GPU MODE's rule (module docstring); (ok, reasons).

    >>> verbose_allclose(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")]))
    (True, ['Maximum error: nan'])
    >>> verbose_allclose(torch.ones(2), torch.zeros(2))[1][0]
    'Number of mismatched elements: 2'
    """
    if received.shape != expected.shape:
        return False, ["SIZE MISMATCH"]
    diff = (received.to(torch.float32) - expected.to(torch.float32)).abs()
    tolerance = atol + rtol * expected.abs()
    mismatched = diff > tolerance
    for same in (torch.isnan, torch.isposinf, torch.isneginf):
        mismatched |= same(received) ^ same(expected)
    if bool(mismatched.any()):
        return False, _mismatch_report(mismatched, received, expected, max_print)
    return True, [f"Maximum error: {torch.max(diff)}" if diff.numel() else "Maximum error: 0"]


@torch.no_grad()
def verbose_allequal(received: torch.Tensor, expected: torch.Tensor, max_print: int = 5) -> tuple[bool, list[str]]:
    """Exact equality; (ok, reasons) with the first mismatches."""
    mismatched = torch.not_equal(received, expected)
    if bool(mismatched.any()):
        return False, _mismatch_report(mismatched, received, expected, max_print)
    return True, []


def match_reference(data, output, reference, rtol: float = 1e-05, atol: float = 1e-08) -> tuple[bool, str]:
    """Compare `output` with `reference(data)`; GPU MODE's default check_implementation."""
    return match_expected(output, reference(data), rtol=rtol, atol=atol)


def match_expected(output, expected, rtol: float = 1e-05, atol: float = 1e-08) -> tuple[bool, str]:
    """match_reference with the reference's output given (a verifier computes it once per input)."""
    good, reasons = verbose_allclose(output, expected, rtol=rtol, atol=atol)
    return good, "\\n".join(reasons) if reasons else ""


def make_match_reference(reference, **kwargs):
    """check_implementation(data, output) that compares with `reference` (see match_reference)."""

    def check(data, output):
        return match_reference(data, output, reference=reference, **kwargs)

    return check


class DisableCuDNNTF32:
    """Inside the block: cuDNN TF32 off and cuDNN deterministic (cuBLAS TF32 untouched)."""

    def __enter__(self):
        self.saved = (torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic)
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.deterministic = True
        return self

    def __exit__(self, exc_type, exc, tb):
        torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic = self.saved
        return False


class DeterministicContext:
    """DisableCuDNNTF32 plus torch.use_deterministic_algorithms(True) inside the block."""

    def __enter__(self):
        self.saved = (torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic,
                      os.environ.get("CUBLAS_WORKSPACE_CONFIG", ""))
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True)
        return self

    def __exit__(self, exc_type, exc, tb):
        torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic, cublas = self.saved
        torch.use_deterministic_algorithms(False)
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = cublas
        return False


def clear_l2_cache(nbytes: int = L2_FLUSH_BYTES) -> None:
    """Evict the L2 cache by writing a device buffer larger than it (no-op without CUDA)."""
    if torch.cuda.is_available():
        buf = torch.empty(nbytes // 8, dtype=torch.int64, device="cuda")
        buf.fill_(42)
        del buf


def clear_l2_cache_large() -> None:
    """clear_l2_cache with a 1 GiB buffer."""
    clear_l2_cache(2**30)
