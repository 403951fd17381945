"""rms_norm with a persistent Triton grid (two programs per SM) striding over rows; each row is
streamed in 1024-wide chunks twice (sum of squares, then scale and store), so register use does
not grow with N."""

import torch
import triton
import triton.language as tl

STYLE = "triton_persistent"
LANGUAGE = "triton"


@triton.jit
def _rms_persistent(x_ptr, w_ptr, y_ptr, M, N, stride_x, stride_y, eps, CHUNK: tl.constexpr):
    first = tl.program_id(0)
    step = tl.num_programs(0)
    for row in range(first, M, step):
        xrow = x_ptr + row * stride_x
        acc = tl.zeros((CHUNK,), tl.float32)
        for start in range(0, N, CHUNK):
            cols = start + tl.arange(0, CHUNK)
            x = tl.load(xrow + cols, mask=cols < N, other=0.0).to(tl.float32)
            acc += x * x
        inv = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
        for start in range(0, N, CHUNK):
            cols = start + tl.arange(0, CHUNK)
            m = cols < N
            x = tl.load(xrow + cols, mask=m, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
            y = (x * inv).to(tl.bfloat16).to(tl.float32) * w
            tl.store(y_ptr + row * stride_y + cols, y.to(tl.bfloat16), mask=m)


def custom_kernel(data):
    x, weight, eps = data
    x = x.contiguous()
    M, N = x.shape
    y = torch.empty_like(x)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
    _rms_persistent[(min(M, 2 * sms),)](x, weight, y, M, N, x.stride(0), y.stride(0), eps,
                                         CHUNK=1024, num_warps=4)
    return y
