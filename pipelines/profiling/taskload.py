"""Resolve a task by name, in the parent and in every sandboxed child.

The registry in `pipelines.tasks` is the normal source. `KERNELCAST_TASK_MODULES` adds or
overrides tasks without touching the registry, which is how tests and one-off experiments
bring their own task: a `;`-separated list of `name=target`, where target is a dotted module
name or a path to a `.py` file; the module must define `TASK`. Children inherit the variable
from the parent's environment, so one setting reaches every process of a run.

    KERNELCAST_TASK_MODULES="tiny_add=/path/to/tiny_task.py" python -m pipelines.profiling.worker ...
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

ENV_VAR = "KERNELCAST_TASK_MODULES"

_loaded: dict[str, Any] = {}


def extra_task_modules() -> dict[str, str]:
    """The `name -> module or file` overrides from KERNELCAST_TASK_MODULES."""
    raw = os.environ.get(ENV_VAR, "").strip()
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in raw.split(";"))):
        name, sep, target = item.partition("=")
        if not sep or not name.strip() or not target.strip():
            raise ValueError(f"{ENV_VAR}: expected 'name=module_or_file.py', got {item!r}")
        out[name.strip()] = target.strip()
    return out


def module_from_file(path: str | os.PathLike, name: str):
    """The module in the file `path`, run and registered as `name` (a file outside every
    package: a test task, the fixture kernels).

    Raises:
        ValueError: `path` is no loadable Python file.
    """
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot load {str(path)!r} as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and Triton look modules up by name
    spec.loader.exec_module(module)
    return module


def _import_target(name: str, target: str):
    if target.endswith(".py"):
        return module_from_file(target, f"kernelcast_extra_task_{name}")
    return importlib.import_module(target)


def load_task(name: str):
    """The `Task` called `name`: an override from KERNELCAST_TASK_MODULES, else the registry."""
    if name in _loaded:
        return _loaded[name]
    extra = extra_task_modules()
    if name in extra:
        task = _import_target(name, extra[name]).TASK
    else:
        from pipelines.tasks import get_task

        task = get_task(name)
    _loaded[name] = task
    return task
