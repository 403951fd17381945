"""The kernel space: algorithm families crossed with launch/algorithm knobs.

A `Family` is one algorithm variant of one task (e.g. softmax "online single pass"). Its knobs
are declared once, here, and used by the sampler and by the mutation operators alike. A point
of the space is (family, knob values); rendering it gives a standalone kernel module (the
GPU MODE contract: it defines `custom_kernel(data)`), whose sha256 is the kernel id.

Each task's families live in `pipelines/generation/families/<task>.py`, which defines
    FAMILIES: tuple[Family, ...]
    SEED: tuple[str, dict]      # (algorithm, knob values) of the task's seed kernel
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

KnobValues = Mapping[str, Any]


@dataclass(frozen=True)
class Knob:
    """One discrete choice. `values` is ordered: a mutation steps to a neighbouring value."""

    name: str  # UPPER_CASE for tl.constexpr meta-parameters, lower_case for algorithm choices
    values: tuple[Any, ...]
    doc: str = ""


@dataclass(frozen=True)
class Family:
    """One algorithm variant of a task and the knobs it exposes."""

    task: str
    algorithm: str  # short stable id, e.g. "online_single_pass"
    summary: str  # one line: what this algorithm does differently; goes into the docstring
    knobs: tuple[Knob, ...]
    render: Callable[[KnobValues], str]  # knob values -> full module source
    # Valid combinations only (e.g. tile sizes that fit shared memory); None = all valid.
    constraint: Callable[[KnobValues], bool] | None = field(default=None)

    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise KeyError(f"{self.task}/{self.algorithm} has no knob {name!r}")

    def is_valid(self, values: KnobValues) -> bool:
        if set(values) != {k.name for k in self.knobs}:
            return False
        if any(values[k.name] not in k.values for k in self.knobs):
            return False
        return self.constraint is None or bool(self.constraint(values))

    def size(self) -> int:
        """Number of knob combinations before the constraint."""
        n = 1
        for k in self.knobs:
            n *= len(k.values)
        return n
