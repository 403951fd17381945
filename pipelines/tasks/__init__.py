"""The kernel task suite. `get_task(name)` and `all_tasks()` are the only entry points.

Each task lives in its own module that defines `TASK: Task`. Imports are lazy so that the GPU
worker pays only for the task it runs.
"""

from __future__ import annotations

import importlib

from pipelines.tasks.contract import Case, Task, default_device

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


__all__ = ["Case", "Task", "default_device", "get_task", "all_tasks", "task_names", "TASK_MODULES"]
