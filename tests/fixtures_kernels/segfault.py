import ctypes

import torch


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    ctypes.string_at(0)  # reads address 0: SIGSEGV
    return data
