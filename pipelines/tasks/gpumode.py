"""GPU MODE's submission contract: the `task`, `utils` and `reference` modules a submission imports.

A GPU MODE problem directory holds, beside the submission, `task.py` (the type names
`input_t`, `output_t` and the `TestSpec` of a case), `utils.py` (helpers: see gpumode_utils) and
`reference.py` (`generate_input(**spec)`, `ref_kernel`, `check_implementation`). Submissions
import them as top-level modules:

    from task import input_t, output_t, TestSpec
    from utils import make_match_reference, DisableCuDNNTF32, set_seed

`install(task)` puts modules of those names for one kernelcast task into `sys.modules`, so such a
submission imports unmodified; the harness calls it before importing each kernel. The type names
follow GPU MODE's (TypeVars bound to the data's layout); `TestSpec` lists the case's keys.

Imports only the standard library, numpy and torch.
"""

from __future__ import annotations

import sys
import types
from typing import Any, TypedDict, TypeVar

import torch

from pipelines.tasks import gpumode_utils
from pipelines.tasks.contract import Task

Tensor = torch.Tensor
# task -> (input layout, output layout): what GPU MODE's TypeVars are bound to.
LAYOUTS: dict[str, tuple[Any, Any]] = {
    "trimul": (tuple[Tensor, Tensor, dict[str, Tensor], dict], tuple[Tensor, dict]),
    "softmax": (tuple[Tensor], Tensor),
    "rms_norm": (tuple[Tensor, Tensor, float], Tensor),
    "layer_norm": (tuple[Tensor, Tensor, Tensor, float], Tensor),
    "fp8_quant": (tuple[Tensor], tuple[Tensor, Tensor]),
    "matmul_bias_gelu": (tuple[Tensor, Tensor, Tensor], Tensor),
    "causal_attention": (tuple[Tensor, Tensor, Tensor], Tensor),
    "cross_entropy": (tuple[Tensor, Tensor], tuple[Tensor, Tensor]),
    "gdn_chunk_fwd_o": (tuple, Tensor),
}
MODULE_NAMES = ("task", "utils", "reference")


def task_module(task: Task) -> types.ModuleType:
    """The `task` module of one task: input_t, output_t, TestSpec."""
    module = types.ModuleType("task", f"GPU MODE type names of kernelcast task {task.name}.")
    in_layout, out_layout = LAYOUTS.get(task.name, (Any, Any))
    module.input_t = TypeVar("input_t", bound=in_layout)
    module.output_t = TypeVar("output_t", bound=out_layout)
    cases = task.correctness_cases or task.benchmark_cases
    fields = {k: type(v) for k, v in (cases[0] if cases else {}).items()}
    module.TestSpec = TypedDict("TestSpec", fields)  # noqa: UP013 - keys come from data
    return module


def reference_module(task: Task) -> types.ModuleType:
    """The `reference` module of one task: generate_input(**spec), ref_kernel, check_implementation."""
    module = types.ModuleType("reference", f"GPU MODE reference of kernelcast task {task.name}.")

    def generate_input(**spec):
        return task.generate_input(**spec)

    module.generate_input = generate_input
    module.ref_kernel = task.ref_kernel
    module.check_implementation = task.check_implementation
    return module


def install(task: Task) -> None:
    """Make `task`, `utils` and `reference` importable for a submission of `task`."""
    sys.modules["task"] = task_module(task)
    sys.modules["utils"] = gpumode_utils
    sys.modules["reference"] = reference_module(task)


def uninstall() -> None:
    for name in MODULE_NAMES:
        sys.modules.pop(name, None)
