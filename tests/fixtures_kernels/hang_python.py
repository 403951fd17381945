import torch


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    while True:  # never returns
        pass
