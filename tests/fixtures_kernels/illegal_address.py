"""An unmasked store 2**40 bytes past the output: an illegal memory access on a GPU."""
import torch
import triton
import triton.language as tl


@triton.jit
def _oob_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    far = offs.to(tl.int64) + (1 << 38)  # elements; times 4 bytes = 1 TiB past the buffer
    tl.store(y_ptr + far, x)


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(data)
    n = data.numel()
    _oob_kernel[(triton.cdiv(n, 1024),)](data, y, n, BLOCK=1024)
    return y
