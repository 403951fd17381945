"""softmax through attorch's SoftmaxAutoGrad(input, neg=False, log=False) over the last dim."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it


def custom_kernel(data):
    (x,) = data
    return SoftmaxAutoGrad.apply(x, False, False)
