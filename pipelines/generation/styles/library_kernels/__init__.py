"""The program structures of the library-triton style, per task.

`space(task)` gives a task's structures (glue.TaskSpace): the three row-wise tasks share
rowwise.py (their maths differ, their program shapes are the same ones libraries use); every
other task has a module of its own named after it.
"""

from __future__ import annotations

import functools
import importlib

from pipelines.generation.styles.library_kernels.glue import TaskSpace

ROWWISE_TASKS = ("softmax", "rms_norm", "layer_norm")
OWN_MODULE_TASKS = ("cross_entropy", "fp8_quant", "matmul_bias_gelu", "causal_attention", "gdn_chunk_fwd_o", "trimul")
TASKS = (*ROWWISE_TASKS, *OWN_MODULE_TASKS)


@functools.cache
def space(task: str) -> TaskSpace:
    """The structures of `task`.

    Raises:
        ValueError: a task this style does not write.
    """
    if task in ROWWISE_TASKS:
        from pipelines.generation.styles.library_kernels import rowwise

        return rowwise.space(task)
    if task in OWN_MODULE_TASKS:
        return importlib.import_module(f"{__name__}.{task}").space()
    raise ValueError(f"unknown task {task!r}; the library-triton style writes {', '.join(TASKS)}")
