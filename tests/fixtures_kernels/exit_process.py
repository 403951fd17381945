import os

import torch


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    os._exit(3)  # takes the whole process down, no exception
