"""rms_norm as PyTorch's fused op on the bf16 tensors (fp32 statistics inside the op)."""

import torch.nn.functional as F

STYLE = "native_bf16"
LANGUAGE = "pytorch"


def custom_kernel(data):
    x, weight, eps = data
    return F.rms_norm(x, (x.shape[-1],), weight, eps)
