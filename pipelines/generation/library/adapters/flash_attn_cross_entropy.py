"""cross_entropy through flash-attention's cross_entropy_loss as training uses it: the forward
gives per-row losses, backward of their sum gives the gradient of the logits (bf16)."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it

import torch


def custom_kernel(data):
    logits, targets = data
    x = logits.detach().requires_grad_(True)
    with torch.enable_grad():
        losses, _ = cross_entropy_loss(x, targets)
        losses.sum().backward()
    return losses.detach().float(), x.grad
