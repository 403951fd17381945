"""rms_norm through the model's RMSNorm module, used as a model uses it: built once per width, eps
and dtype (the model cast to bf16), the task's weight as its parameter, inference without grad."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it

import torch

_modules = {}


def custom_kernel(data):
    x, weight, eps = data
    key = (x.shape[-1], eps, weight.dtype, weight.device)
    norm = _modules.get(key)
    if norm is None:
        norm = _modules[key] = RMSNorm(x.shape[-1], eps=eps).to(device=weight.device, dtype=weight.dtype)
    norm.weight.data = weight
    with torch.no_grad():
        return norm(x)
