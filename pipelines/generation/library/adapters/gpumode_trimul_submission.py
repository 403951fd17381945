"""trimul through GPU MODE's starting submission: it already defines custom_kernel(data) with the
task's layout (it builds its TriMul module on every call and runs the contraction in bf16)."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it

_submission = custom_kernel


def custom_kernel(data):
    return _submission(data)
