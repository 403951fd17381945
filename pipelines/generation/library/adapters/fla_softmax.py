"""softmax through flash-linear-attention's softmax_fwd (rows of the last dim, autotuned num_warps),
its output in the input's dtype as the task's reference gives it."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it


def custom_kernel(data):
    (x,) = data
    return softmax_fwd(x, dtype=x.dtype)
