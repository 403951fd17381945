"""layer_norm through kernl's layer_norm with its single-pass kernel."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it


def custom_kernel(data):
    x, weight, bias, eps = data
    return layer_norm(x, weight, bias, eps, _layer_norm_fwd_fused_single_pass, False)
