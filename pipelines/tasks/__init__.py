"""The kernel task suite. `get_task(name)` and `all_tasks()` are the only entry points.

Each task lives in its own module that defines `TASK: Task`. Imports are lazy so that the GPU
worker pays only for the task it runs, and a process that only names tasks pays for none.
"""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipelines.tasks.contract import Case, Task, default_device

# The contract (and torch with it) loads on first use: a process that only names tasks (the
# forecast command checking --task, a reader handing kernels to its children) does not pay it.
_CONTRACT = ("Case", "Task", "default_device")


def __getattr__(name: str) -> Any:
    if name in _CONTRACT:
        return getattr(importlib.import_module("pipelines.tasks.contract"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# name -> module; order is the display order.
TASK_MODULES: dict[str, str] = {
    "softmax": "pipelines.tasks.softmax",
    "rms_norm": "pipelines.tasks.rms_norm",
    "layer_norm": "pipelines.tasks.layer_norm",
    "fp8_quant": "pipelines.tasks.fp8_quant",
    "matmul_bias_gelu": "pipelines.tasks.matmul_bias_gelu",
    "causal_attention": "pipelines.tasks.causal_attention",
    "cross_entropy": "pipelines.tasks.cross_entropy",
    "trimul": "pipelines.tasks.trimul",
    "gdn_chunk_fwd_o": "pipelines.tasks.gdn_chunk_fwd_o",
}


def task_names() -> list[str]:
    return list(TASK_MODULES)


def get_task(name: str) -> Task:
    """The task called `name`; a ValueError naming the known tasks otherwise."""
    if name not in TASK_MODULES:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASK_MODULES)}")
    return importlib.import_module(TASK_MODULES[name]).TASK


def all_tasks() -> list[Task]:
    return [get_task(n) for n in TASK_MODULES]


def prompt_source(task: str, source: str, generator: str | None) -> str:
    """The code a language model reads for a kernel: the reference's PyTorch body for the reference.

    The task reference is stored as a thin wrapper module; the prompt shows the reference's actual
    code instead. Here, with the tasks, because the training rows (pipelines.surrogates) and the
    forecasts (pipelines.forecasting.lm_forecasts) must show the same code.
    """
    if generator == "reference" and task in TASK_MODULES:
        module = importlib.import_module(TASK_MODULES[task])
        return inspect.getsource(module.ref_kernel)
    return source


__all__ = ["Case", "Task", "default_device", "get_task", "all_tasks", "task_names", "prompt_source", "TASK_MODULES"]
