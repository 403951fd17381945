"""Right on first sight of a shape, then returns the cached answer: must not pass."""
import torch

_cache: dict = {}


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    key = (tuple(data.shape), data.dtype)
    if key not in _cache:
        _cache[key] = data * 2.0 + 1.0
    return _cache[key]
