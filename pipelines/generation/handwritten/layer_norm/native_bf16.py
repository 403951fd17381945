"""layer_norm as PyTorch's fused op directly on the bf16 tensors (fp32 statistics inside)."""

import torch.nn.functional as F

STYLE = "native_bf16"
LANGUAGE = "pytorch"


def custom_kernel(data):
    x, weight, bias, eps = data
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
