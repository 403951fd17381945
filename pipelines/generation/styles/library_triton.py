"""Triton kernels written the way public kernel libraries write them, for every task.

Forecasters learned from our template families; users bring kernels shaped like Liger-Kernel,
unsloth, flash-attention's and flash-linear-attention's Triton ops, Triton's tutorials and the
vLLM/SGLang quantisers: launchers that ask the device (SM count from torch or Triton's driver,
compile-ahead occupancy), persistent grids, autotuned and heuristic meta-parameters, device
guards and contiguity decorators, online, looped, split and unfused reductions, grouped and
persistent tile orders, fused and separate epilogues. The program structures and their knobs
live in `library_kernels/` (glue.py says how a structure is drawn and rendered).

`generate` spreads its draws over a task's structures first (round robin in a seeded order) and
over their knobs second, keeping only programs whose source is new. `source_for_check` renders
a record again for the Triton CPU interpreter (device questions answered by constants, one
autotune config), the same kernels and arithmetic.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any

from pipelines.generation.styles.library_kernels import TASKS, space
from pipelines.generation.styles.library_kernels.glue import draw
from warehouse.ids import kernel_id, kernel_record

GENERATOR = "library-triton"
GENERATOR_VERSION = "library-triton-1"
LANGUAGE = "triton"

MAX_MISSES = 200  # draws in a row that give no new source before a structure counts as used up


def generate(task: str, count: int, seed: int) -> list[dict[str, Any]]:
    """Up to `count` distinct library-style Triton kernels of `task`, the same list for the same
    arguments.

    Args:
        task: a task name (pipelines.tasks).
        count: how many kernels to return at most (fewer when the structures run out).
        seed: picks which kernels; the order of the list depends on it too.
    Returns:
        KERNEL_BATCH_SCHEMA rows: algorithm is the structure's name, knobs_json every choice
        the source depends on.
    Raises:
        ValueError: an unknown task or a negative count.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    sp = space(task)
    rng = random.Random(f"{GENERATOR_VERSION}/{task}/{seed}")
    active = list(sp.structures)
    rng.shuffle(active)
    misses = dict.fromkeys((s.name for s in active), 0)
    seen: set[str] = set()
    records: list[dict[str, Any]] = []
    while len(records) < count and active:
        for structure in list(active):
            if len(records) >= count:
                break
            choices = draw(structure, rng)
            source = None
            if structure.valid is None or structure.valid(choices):
                source = structure.render(choices, False)
            kid = kernel_id(source) if source is not None else None
            if kid is None or kid in seen:
                misses[structure.name] += 1
                if misses[structure.name] >= MAX_MISSES:
                    active.remove(structure)
                continue
            misses[structure.name] = 0
            seen.add(kid)
            records.append(_record(task, structure.name, choices, source))
    return records


def render(task: str, algorithm: str, choices: Mapping[str, Any], for_check: bool = False,
           check_config: int = 0) -> str:
    """The module of one structure of `task` with `choices`.

    Args:
        for_check: the render for the Triton CPU interpreter (constants for device questions,
            plain launches, one autotune config).
        check_config: which autotune config the interpreter's render keeps (modulo their number).
    Raises:
        ValueError: an unknown task or structure.
    """
    sp = space(task)
    if algorithm not in sp.by_name:
        raise ValueError(f"unknown structure {algorithm!r} of {task}; known: {', '.join(sp.by_name)}")
    values = dict(choices)
    if for_check and check_config:
        values["check_config"] = check_config
    source = sp.by_name[algorithm].render(values, for_check)
    return source


def source_for_check(record: Mapping[str, Any], check_config: int = 0) -> str:
    """The interpreter's render of a generated record (its task, algorithm and knobs_json)."""
    if record.get("generator") != GENERATOR:
        raise ValueError(f"not a {GENERATOR} record: generator {record.get('generator')!r}")
    choices = json.loads(record["knobs_json"])
    return render(record["task"], record["algorithm"], _restore(choices), True, check_config)


def _restore(choices: dict[str, Any]) -> dict[str, Any]:
    """JSON turns tuples into lists: knob values that are tuples come back as tuples."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in choices.items()}


def _record(task: str, algorithm: str, choices: dict[str, Any], source: str) -> dict[str, Any]:
    return kernel_record(source, task, LANGUAGE, GENERATOR, GENERATOR_VERSION, algorithm,
                         json.dumps(choices, sort_keys=True))


__all__ = ["GENERATOR", "GENERATOR_VERSION", "LANGUAGE", "TASKS", "generate", "render", "source_for_check"]
