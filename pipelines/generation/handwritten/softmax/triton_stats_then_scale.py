"""softmax in two Triton launches: one program per row computes the row's max and the inverse of
its exp-sum in blocks (online rescaling), then a 2-D grid of (row, column block) programs writes
exp(x - max) * inv_sum. The second pass reads x again but spreads each row over many programs."""

import torch
import triton
import triton.language as tl

STYLE = "triton_two_kernel"
LANGUAGE = "triton"


@triton.jit
def _row_stats(x_ptr, max_ptr, inv_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = x_ptr + row * stride
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < N, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # lanes still at -inf keep a zero sum (exp(-inf - -inf) would be NaN)
        alpha = tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new))
        s = s * alpha + tl.where(x == float("-inf"), 0.0, tl.exp(x - m_new))
        m = m_new
    row_max = tl.max(m, axis=0)
    total = tl.sum(s * tl.where(m == float("-inf"), 0.0, tl.exp(m - row_max)), axis=0)
    tl.store(max_ptr + row, row_max)
    tl.store(inv_ptr + row, 1.0 / total)


@triton.jit
def _scale(x_ptr, y_ptr, max_ptr, inv_ptr, N, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    y = tl.exp(x - tl.load(max_ptr + row)) * tl.load(inv_ptr + row)
    tl.store(y_ptr + row * stride_y + cols, y.to(tl.bfloat16), mask=mask)


def custom_kernel(data):
    (x,) = data
    x = x.contiguous()
    M, N = x.shape
    row_max = torch.empty(M, dtype=torch.float32, device=x.device)
    inv = torch.empty(M, dtype=torch.float32, device=x.device)
    y = torch.empty_like(x)
    stats_block = min(2048, triton.next_power_of_2(N))
    _row_stats[(M,)](x, row_max, inv, N, x.stride(0), BLOCK=stats_block, num_warps=4)
    block = min(1024, triton.next_power_of_2(N))
    _scale[(M, triton.cdiv(N, block))](x, y, row_max, inv, N, x.stride(0), y.stride(0), BLOCK=block, num_warps=4)
    return y
