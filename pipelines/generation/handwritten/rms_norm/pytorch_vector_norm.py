"""rms_norm through the row's 2-norm: rms = ||x|| / sqrt(N), in fp32, weight applied in bf16."""

import torch

STYLE = "pytorch_decomposed"
LANGUAGE = "pytorch"


def custom_kernel(data):
    x, weight, eps = data
    n = x.shape[-1]
    xf = x.float()
    norm = torch.linalg.vector_norm(xf, ord=2, dim=-1, keepdim=True)
    inv_rms = torch.rsqrt(norm.square_().div_(n).add_(eps))
    # same rounding point as the task: normalised value to bf16, then the bf16 weight
    return weight * (xf * inv_rms).to(torch.bfloat16)
