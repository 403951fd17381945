"""matmul_bias_gelu: torch.matmul, then GPT-NeoX's fused bias_gelu_impl(y, bias) (TorchScript,
tanh approximation of GELU, within the task's tolerance of the exact one)."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it

import torch


def custom_kernel(data):
    a, b, bias = data
    with torch.no_grad():
        return bias_gelu_impl(torch.matmul(a, b), bias)
