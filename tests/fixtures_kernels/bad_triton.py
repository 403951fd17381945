"""Fails in Triton's front end: an undefined name inside the kernel."""
import torch
import triton
import triton.language as tl


@triton.jit
def _bad_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, undefined_name * 2.0, mask=offs < n)  # noqa: F821


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(data)
    n = data.numel()
    _bad_kernel[(triton.cdiv(n, 1024),)](data, y, n, BLOCK=1024)
    return y
