"""Kernels in the styles people write, outside the template families: each style a generator of
its own, so the evaluation can hold one style out and a forecaster is scored on code it never saw.

A style module defines
    GENERATOR          the generator name written into every record (e.g. "pytorch-programs")
    GENERATOR_VERSION  bumped when the generated code changes
    generate(task, count, seed) -> list[dict]
                       up to `count` distinct kernel records (KERNEL_BATCH_SCHEMA columns) of one
                       task, the same list for the same arguments on every machine

`python -m pipelines.generation.styles --out B.parquet` writes a worker batch of every style.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

# style module -> generator name; modules import on first use (each pulls in its templates)
STYLE_MODULES: dict[str, str] = {
    "pytorch_programs": "pytorch-programs",
    "library_triton": "library-triton",
}
# Their kernels are learned from (unlike rewrites, hand-written and fetched kernels, which only
# score forecasters); each is also held out in turn to score forecasters on a style they never saw.
STYLE_GENERATORS: tuple[str, ...] = tuple(STYLE_MODULES.values())


def style_module(name: str) -> ModuleType:
    """The style module `name` (a key of STYLE_MODULES)."""
    if name not in STYLE_MODULES:
        raise KeyError(f"unknown style {name!r}; styles: {', '.join(STYLE_MODULES)}")
    return importlib.import_module(f"{__name__}.{name}")


def generators() -> dict[str, Callable[[str, int, int], list[dict[str, Any]]]]:
    """Generator name -> its generate(task, count, seed)."""
    return {gen: style_module(mod).generate for mod, gen in STYLE_MODULES.items()}
