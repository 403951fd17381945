"""layer_norm in two Triton launches: per-row mean and 1/std from blocked sums (one program per
row, fp32), then a 2-D grid of (row, column block) programs applies the affine normalisation."""

import torch
import triton
import triton.language as tl

STYLE = "triton_two_kernel"
LANGUAGE = "triton"


@triton.jit
def _stats(x_ptr, mean_ptr, rstd_ptr, N, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    s1 = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        s1 += tl.load(x_ptr + row * stride + cols, mask=cols < N, other=0.0).to(tl.float32)
    mean = tl.sum(s1, axis=0) / N
    # second pass on centred values: no cancellation from E[x^2] - E[x]^2
    s2 = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        m = cols < N
        d = tl.load(x_ptr + row * stride + cols, mask=m, other=0.0).to(tl.float32) - mean
        s2 += tl.where(m, d * d, 0.0)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, 1.0 / tl.sqrt(tl.sum(s2, axis=0) / N + eps))


@triton.jit
def _apply(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, N, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=m, other=0.0).to(tl.float32)
    y = (x - tl.load(mean_ptr + row)) * tl.load(rstd_ptr + row) * w + b
    tl.store(y_ptr + row * stride_y + cols, y.to(tl.bfloat16), mask=m)


def custom_kernel(data):
    x, weight, bias, eps = data
    x = x.contiguous()
    M, N = x.shape
    mean = torch.empty(M, dtype=torch.float32, device=x.device)
    rstd = torch.empty(M, dtype=torch.float32, device=x.device)
    y = torch.empty_like(x)
    _stats[(M,)](x, mean, rstd, N, x.stride(0), eps, BLOCK=min(4096, triton.next_power_of_2(N)), num_warps=8)
    block = min(2048, triton.next_power_of_2(N))
    _apply[(M, triton.cdiv(N, block))](x, weight, bias, y, mean, rstd, N, x.stride(0), y.stride(0),
                                       BLOCK=block, num_warps=4)
    return y
