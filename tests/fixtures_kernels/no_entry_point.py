import torch


def kernel(data: torch.Tensor) -> torch.Tensor:  # wrong name: the contract wants custom_kernel
    return data * 2 + 1
