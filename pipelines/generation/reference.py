"""The task's PyTorch reference as a kernel record, so it is measured and stored like any kernel.

Its source is a standalone module whose `custom_kernel(data)` calls the task's `ref_kernel`, so it
runs through the same harness as generated kernels and gets a content-addressed kernel id. The
id changes only when this wrapper or the task module's name changes, not when the reference's
body does: the task's contract_version tracks that.
"""

from __future__ import annotations

from typing import Any

from pipelines.tasks import TASK_MODULES
from warehouse.ids import kernel_record

GENERATOR = "reference"
GENERATOR_VERSION = "reference-1"

_TEMPLATE = '''"""PyTorch reference of task `{task}`, wrapped as a kernel module.

custom_kernel(data) is the task's ref_kernel(data): the anchor every speedup is measured against.
"""

from {module} import TASK as _TASK


def custom_kernel(data):
    return _TASK.ref_kernel(data)
'''


def reference_source(task: str) -> str:
    """Source of the reference kernel module of `task`.

    Raises:
        ValueError: unknown task.
    """
    if task not in TASK_MODULES:
        raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(TASK_MODULES)}")
    return _TEMPLATE.format(task=task, module=TASK_MODULES[task])


def reference_record(task: str) -> dict[str, Any]:
    """KERNEL_BATCH_SCHEMA row of the task's reference (language 'pytorch', no parent).

    >>> reference_record("softmax")["algorithm"]
    'reference'
    """
    source = reference_source(task)
    return kernel_record(source, task, "pytorch", GENERATOR, GENERATOR_VERSION, "reference", "{}")
