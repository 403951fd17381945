"""softmax through the Triton tutorial's one-row-per-program softmax(x) of 2023: bf16 in, bf16 out, as the task."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it


def custom_kernel(data):
    (x,) = data
    return softmax(x)
