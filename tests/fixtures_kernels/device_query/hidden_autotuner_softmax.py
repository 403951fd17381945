"""Row softmax whose autotuner no module global names: the `triton.autotune` object is built on
the first call inside a function and reached through a decorator of the module's own, and it keeps
its choice in Triton's cache on disk (`cache_results=True`, as flash-linear-attention's softmax
does), keyed on the row width. Correct on a GPU; the harness must find the autotuner when it runs,
tune it on the real inputs and record what it chose (tests/profiling/test_autotune_discovery.py)."""

import functools

import torch
import triton
import triton.language as tl

WARPS = (2, 4, 8)


@triton.jit
def _softmax_rows(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * n_cols + cols, (e / tl.sum(e, axis=0)).to(tl.bfloat16), mask=mask)


_TUNED: dict[str, object] = {}


def _tuned_rows():
    """The autotuned kernel, built once, on first use (nothing at import names an Autotuner)."""
    if "rows" not in _TUNED:
        configs = [triton.Config({}, num_warps=w) for w in WARPS]
        _TUNED["rows"] = triton.autotune(configs=configs, key=["n_cols"], cache_results=True)(_softmax_rows)
    return _TUNED["rows"]


def _contiguous_inputs(fn):
    """A wrapper of the kind libraries put around their launchers."""

    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args))

    return wrapper


@_contiguous_inputs
def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _tuned_rows()[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


def custom_kernel(data):
    (x,) = data
    return softmax_rows(x)
