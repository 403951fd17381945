"""layer_norm through attorch's LayerNormAutoGrad(input, weight, bias, eps)."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it


def custom_kernel(data):
    x, weight, bias, eps = data
    return LayerNormAutoGrad.apply(x, weight, bias, eps)
