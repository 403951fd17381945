"""Shared test setup: CPU hosts run Triton kernels through its interpreter; state goes to tmp."""

import os

import torch

if not torch.cuda.is_available():
    # Must be set before any @triton.jit function is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")
