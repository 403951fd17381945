"""Layer norm over rows, autotuned over warps and keyed on the row width, with a heuristic that
picks the block from the width, launched on the current stream."""

import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({}, num_warps=w) for w in (2, 4, 8, 16)], key=["n_cols"])
@triton.heuristics({"BLOCK": lambda args: triton.next_power_of_2(args["n_cols"])})
@triton.jit
def _layer_norm_rows(x_ptr, w_ptr, b_ptr, y_ptr, n_cols, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride + cols, (d * rstd * w + b).to(tl.bfloat16), mask=mask)


def custom_kernel(data):
    x, weight, bias, eps = data
    y = torch.empty_like(x)
    stream = torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        _layer_norm_rows[(x.shape[0],)](x, weight, bias, y, x.shape[1], x.stride(0), eps)
    return y
