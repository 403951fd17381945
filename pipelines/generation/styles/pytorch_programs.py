"""PyTorch programs as people write them in model code and libraries, for every task.

Forecasters trained on our template kernels alone learned "Triton is fast, PyTorch is slow".
This style writes plain PyTorch modules that span both ends: fused library calls (F.softmax,
F.rms_norm, F.scaled_dot_product_attention with is_causal=True, torch.addmm, ...) next to manual
maths, native bf16 next to fp32 round trips, in-place and out= next to extra copies, whole-input
calls next to Python loops over blocks, and about one program in ten wrapped in torch.compile.

Each task's compositions live in `pytorch_compositions/<task>.py` (see `compose` there for how a
program is assembled). `generate` spreads its draws over the compositions first (round robin in
a seeded order) and over their knobs second, and keeps only programs whose source is new.
"""

from __future__ import annotations

import functools
import importlib
import json
import random
from typing import Any

from pipelines.generation.styles.pytorch_compositions.compose import TaskSpace, draw, program
from pipelines.tasks import TASK_MODULES
from warehouse.ids import kernel_id, kernel_record

GENERATOR = "pytorch-programs"
GENERATOR_VERSION = "pytorch-programs-1"
LANGUAGE = "pytorch"

COMPILE_EVERY = 10  # one program in ten is compiled: each compile costs seconds on the GPU host
MAX_MISSES = 200  # draws in a row that give no new source before a composition counts as used up


@functools.cache
def space(task: str) -> TaskSpace:
    """The compositions of `task`'s programs.

    Raises:
        ValueError: an unknown task.
    """
    if task not in TASK_MODULES:
        raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(TASK_MODULES)}")
    module = importlib.import_module(f"pipelines.generation.styles.pytorch_compositions.{task}")
    return module.SPACE


def generate(task: str, count: int, seed: int) -> list[dict[str, Any]]:
    """Up to `count` distinct PyTorch programs of `task`, the same list for the same arguments.

    Args:
        task: a task name (pipelines.tasks).
        count: how many programs to return at most (fewer when the compositions run out).
        seed: picks which programs; the order of the list depends on it too.
    Returns:
        KERNEL_BATCH_SCHEMA rows: algorithm is the composition's name, knobs_json every choice
        made (driver, block, compile mode and the composition's own knobs).
    Raises:
        ValueError: an unknown task or a negative count.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    sp = space(task)
    rng = random.Random(f"{GENERATOR_VERSION}/{task}/{seed}")
    active = list(sp.compositions)
    rng.shuffle(active)
    misses = dict.fromkeys((c.name for c in active), 0)
    seen: set[str] = set()
    records: list[dict[str, Any]] = []
    n_compiled = 0
    while len(records) < count and active:
        for comp in list(active):
            if len(records) >= count:
                break
            compiled = comp.compilable and n_compiled < (len(records) + 1) // COMPILE_EVERY
            choices = draw(sp, comp, rng, compiled)
            source = program(sp, comp, choices) if comp.valid is None or comp.valid(choices) else None
            kid = kernel_id(source) if source is not None else None
            if kid is None or kid in seen:
                misses[comp.name] += 1
                if misses[comp.name] >= MAX_MISSES:
                    active.remove(comp)
                continue
            misses[comp.name] = 0
            seen.add(kid)
            n_compiled += compiled
            records.append(_record(task, comp.name, choices, source))
    return records


def _record(task: str, algorithm: str, choices: dict[str, Any], source: str) -> dict[str, Any]:
    return kernel_record(source, task, LANGUAGE, GENERATOR, GENERATOR_VERSION, algorithm,
                         json.dumps(choices, sort_keys=True))
