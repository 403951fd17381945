"""layer_norm through torch.compile (Inductor fuses upcast, statistics and affine), compiled on
the first call."""

import torch

STYLE = "torch_compile"
LANGUAGE = "pytorch"

_compiled = None


def _layer_norm(x, weight, bias, eps: float):
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    centred = xf - mean
    var = (centred * centred).mean(-1, keepdim=True)
    return (centred * torch.rsqrt(var + eps) * weight.float() + bias.float()).to(torch.bfloat16)


def custom_kernel(data):
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(_layer_norm, dynamic=False)
    x, weight, bias, eps = data
    return _compiled(x, weight, bias, eps)
