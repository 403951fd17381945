import torch

def custom_kernel(data: torch.Tensor) -> torch.Tensor
    return data * 2 + 1
