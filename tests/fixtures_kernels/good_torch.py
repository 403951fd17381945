"""tiny_scale in PyTorch, through addcmul-free fused ops."""
import torch


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    return torch.add(data, data).add_(1.0)
