import torch


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    return data * 2.0  # forgets the + 1
