"""matmul_bias_gelu through torch.compile (GEMM with the bias and GELU fused as its epilogue),
compiled on the first call."""

import torch
import torch.nn.functional as F

STYLE = "torch_compile"
LANGUAGE = "pytorch"

_compiled = None


def _mbg(a, b, bias):
    return F.gelu(torch.matmul(a, b) + bias, approximate="none")


def custom_kernel(data):
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(_mbg, dynamic=False)
    return _compiled(*data)
