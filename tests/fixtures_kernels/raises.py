import torch


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    raise ValueError("deliberate failure inside custom_kernel")
