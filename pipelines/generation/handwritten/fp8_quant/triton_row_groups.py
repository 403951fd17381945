"""fp8_quant with a 2-D Triton grid: each program quantises a (ROWS, 128) tile, i.e. one group
column of ROWS rows, so a program's loads walk down the rows instead of along one."""

import torch
import triton
import triton.language as tl

STYLE = "triton_row_block"
LANGUAGE = "triton"


@triton.jit
def _e4m3_grid(v):
    # Round fp32 v (|v| <= 448) half-to-even onto the e4m3 grid, staying fp32, so the fp8 cast
    # after it is exact everywhere (the CPU interpreter's own fp8 rounding is not). The grid step
    # is 2^(exponent - 3), never below the subnormal step 2^-9; v / step is then in [8, 16) and
    # adding and removing 1.5 * 2^23 rounds it to an integer, ties to even.
    exponent = (v.to(tl.uint32, bitcast=True) >> 23) & 0xFF
    step_bits = (tl.maximum(exponent, 127 - 9 + 3) - 3) << 23
    step = step_bits.to(tl.float32, bitcast=True)
    return ((v / step + 12582912.0) - 12582912.0) * step


@triton.jit
def _quant_tile(x_ptr, q_ptr, s_ptr, M, stride_x, stride_q, stride_s,
                ROWS: tl.constexpr, GROUP: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    g = tl.program_id(1)
    cols = g * GROUP + tl.arange(0, GROUP)
    rmask = rows < M
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=rmask[:, None], other=0.0)
    x = x.to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-10) / 448.0
    q = tl.minimum(tl.maximum(x / scale[:, None], -448.0), 448.0)
    tl.store(q_ptr + rows[:, None] * stride_q + cols[None, :], _e4m3_grid(q).to(tl.float8e4nv), mask=rmask[:, None])
    tl.store(s_ptr + rows * stride_s + g, scale, mask=rmask)


def custom_kernel(data):
    (x,) = data
    x = x.contiguous()
    M, K = x.shape
    q = torch.empty((M, K), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((M, K // 128), dtype=torch.float32, device=x.device)
    rows = 16
    _quant_tile[(triton.cdiv(M, rows), K // 128)](x, q, s, M, x.stride(0), q.stride(0), s.stride(0),
                                                  ROWS=rows, GROUP=128, num_warps=4)
    return q, s
