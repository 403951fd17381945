"""A softmax submission in GPU MODE's style: `task` types, `utils` helpers, a Triton kernel.
(Written for kernelcast's tests.)"""
import torch
import triton
import triton.language as tl
from task import input_t, output_t
from utils import set_seed

set_seed(0)  # harmless global state a submission may touch at import


@triton.jit
def _softmax_rows(x_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(y_ptr + row * stride + offs, (e / tl.sum(e, axis=0)).to(tl.bfloat16), mask=mask)


def custom_kernel(data: input_t) -> output_t:
    (x,) = data
    y = torch.empty_like(x)
    _softmax_rows[(x.shape[0],)](x, y, x.shape[1], x.stride(0), BLOCK=triton.next_power_of_2(x.shape[1]))
    return y
