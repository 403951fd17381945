"""fp8_quant in PyTorch with the group maximum taken on the bf16 values (exact: |x| and max do not
round) and only the scaled division in fp32, via a reciprocal-free broadcast division."""

import torch

STYLE = "pytorch_decomposed"
LANGUAGE = "pytorch"

GROUP = 128
FP8_MAX = 448.0


def custom_kernel(data):
    (x,) = data
    M, K = x.shape
    xg = x.view(M, K // GROUP, GROUP)
    scales = xg.abs().amax(dim=-1).float().clamp_(min=1e-10).div_(FP8_MAX)
    q = torch.clamp(xg.float() / scales[..., None], -FP8_MAX, FP8_MAX)
    return q.to(torch.float8_e4m3fn).view(M, K), scales
