"""A Triton kernel that never finishes: the loop condition is always true on finite data."""
import torch
import triton
import triton.language as tl


@triton.jit
def _spin_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    k = 0.0
    while tl.load(x_ptr) == tl.load(x_ptr):  # true unless NaN; the store keeps the loop alive
        tl.store(y_ptr + offs, x + k, mask=mask)
        k += 1.0


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(data)
    n = data.numel()
    _spin_kernel[(triton.cdiv(n, 1024),)](data, y, n, BLOCK=1024)
    return y
