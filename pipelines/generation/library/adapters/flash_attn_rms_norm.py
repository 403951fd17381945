"""rms_norm through flash-attention's rms_norm_fn(x, weight, bias=None, eps=...)."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it


def custom_kernel(data):
    x, weight, eps = data
    return rms_norm_fn(x, weight, None, eps=eps)
