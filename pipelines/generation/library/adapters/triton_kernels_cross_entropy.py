"""cross_entropy through triton-lang/kernels' cross_entropy(logits, indices) as training uses it:
per-row losses forward, backward of their sum for the gradient of the logits."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it

import torch


def custom_kernel(data):
    logits, targets = data
    x = logits.detach().requires_grad_(True)
    with torch.enable_grad():
        losses = cross_entropy(x, targets)
        losses.sum().backward()
    return losses.detach().float(), x.grad
