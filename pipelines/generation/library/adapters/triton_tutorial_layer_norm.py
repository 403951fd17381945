"""layer_norm through the Triton tutorial's layer_norm(x, normalized_shape, weight, bias, eps)."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it


def custom_kernel(data):
    x, weight, bias, eps = data
    return layer_norm(x, (x.shape[-1],), weight, bias, eps)
