"""layer_norm through flash-attention's layer_norm_fn(x, weight, bias, eps=...)."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it


def custom_kernel(data):
    x, weight, bias, eps = data
    return layer_norm_fn(x, weight, bias, eps=eps)
