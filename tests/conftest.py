"""Shared test setup: CPU hosts run Triton kernels through its interpreter; state goes to tmp."""

import os

import torch

if not torch.cuda.is_available():
    # Must be set before any @triton.jit function is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")

    from pipelines.tasks.interpreter_fixes import patch_triton_interpreter

    patch_triton_interpreter()  # bf16 tl.dot is wrong in Triton 3.6's interpreter
