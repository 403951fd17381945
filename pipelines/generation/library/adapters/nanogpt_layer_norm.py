"""layer_norm through nanoGPT's LayerNorm module (F.layer_norm with an optional bias), used as the
model uses it: built once per width and dtype (the model cast to bf16), the task's weight and
bias as its parameters, inference without grad. nanoGPT fixes eps at 1e-5, the task's eps."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it

import torch

_modules = {}


def custom_kernel(data):
    x, weight, bias, eps = data
    key = (x.shape[-1], weight.dtype, weight.device)
    norm = _modules.get(key)
    if norm is None:
        norm = _modules[key] = LayerNorm(x.shape[-1], bias=True).to(device=weight.device, dtype=weight.dtype)
    norm.weight.data = weight
    norm.bias.data = bias
    with torch.no_grad():
        return norm(x)
