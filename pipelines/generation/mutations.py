"""Mutation operators over the kernel space: one choice changed at a time.

A child differs from its parent in exactly one choice:
- a constexpr knob (UPPER_CASE) stepped to an adjacent value of its ordered domain
  ("BLOCK_N:256->512");
- an algorithm knob (lower_case, categorical) set to any other value ("exp_fn:exp->exp2");
- the family switched ("algorithm:two_pass->online_single_pass"): knob values the two families
  share are kept, the others come from the task's SEED when the target is the seed family,
  else the knob's middle value; if that is invalid, the target's own defaults alone are tried.
Children that violate the target family's constraint are skipped.

Everything is deterministic: `neighbours` has a fixed order and `random_mutation` draws only from
the numpy Generator it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from pipelines.generation import registry
from pipelines.generation.registry import KernelPoint


def _fmt(value: Any) -> str:
    return str(value)


def _family_defaults(task: str, algorithm: str) -> dict[str, Any]:
    """Default knob values for a family: the SEED's when it is the seed family, else middles."""
    fam = registry.family(task, algorithm)
    seed = registry.seed_point(task)
    if seed.algorithm == algorithm:
        return dict(seed.knobs)
    return registry.middle_values(fam)


def knob_neighbours(point: KernelPoint) -> list[tuple[KernelPoint, str]]:
    """Children that change one knob of the point's own family (valid ones only)."""
    fam = registry.family(point.task, point.algorithm)
    out: list[tuple[KernelPoint, str]] = []
    for knob in fam.knobs:
        current = point.knobs[knob.name]
        idx = knob.values.index(current)
        if knob.name.isupper():
            # ordered domain (tile sizes, warps, stages): only adjacent steps, as a tuner would
            targets = [knob.values[i] for i in (idx - 1, idx + 1) if 0 <= i < len(knob.values)]
        else:
            # categorical algorithm choice: every other option is one step away
            targets = [v for v in knob.values if v != current]
        for value in targets:
            knobs = {**point.knobs, knob.name: value}
            if fam.is_valid(knobs):
                child = KernelPoint(point.task, point.algorithm, knobs)
                out.append((child, f"{knob.name}:{_fmt(current)}->{_fmt(value)}"))
    return out


def family_switches(point: KernelPoint) -> list[tuple[KernelPoint, str]]:
    """Children that switch to another family of the task, keeping shared knob values."""
    out: list[tuple[KernelPoint, str]] = []
    for fam in registry.families_for(point.task):
        if fam.algorithm == point.algorithm:
            continue
        defaults = _family_defaults(point.task, fam.algorithm)
        kept = {
            k.name: point.knobs[k.name]
            for k in fam.knobs
            if k.name in point.knobs and point.knobs[k.name] in k.values
        }
        for knobs in ({**defaults, **kept}, defaults):
            if fam.is_valid(knobs):
                child = KernelPoint(point.task, fam.algorithm, knobs)
                out.append((child, f"algorithm:{point.algorithm}->{fam.algorithm}"))
                break
    return out


def neighbours(point: KernelPoint) -> list[tuple[KernelPoint, str]]:
    """Every one-choice child of `point` with its mutation label, in a fixed order.

    Args:
        point: a valid point of its task's space.

    Returns:
        [(child, label)], knob changes first (family knob order), then family switches (family
        order). Every child is valid and differs from the parent.
    """
    if not registry.is_valid_point(point):
        raise ValueError(f"{point.task}/{point.algorithm}: not a valid point {point.knobs_json()}")
    return knob_neighbours(point) + family_switches(point)


def random_mutation(
    point: KernelPoint, rng: np.random.Generator, exclude: set | None = None
) -> tuple[KernelPoint, str] | None:
    """One neighbour drawn uniformly, or None when there is none left.

    Args:
        point: the parent.
        rng: the only source of randomness.
        exclude: point keys not to return (children already produced).
    """
    options = neighbours(point)
    if exclude:
        options = [(c, m) for c, m in options if c.key not in exclude]
    if not options:
        return None
    return options[int(rng.integers(len(options)))]


class Mutator(Protocol):
    """What a search loop needs from a mutation operator: a parent record in, a child record out
    (None when it has nothing to offer). `SpaceMutator` and `llm_mutator.LLMMutator` both fit."""

    def mutate(self, parent: Mapping[str, Any], rng: np.random.Generator) -> dict | None: ...


class SpaceMutator:
    """Random one-choice mutations of space-generated kernels, as kernel batch records."""

    def mutate(self, parent: Mapping[str, Any], rng: np.random.Generator) -> dict | None:
        """A child record of `parent` (a KERNEL_BATCH_SCHEMA row from the space), or None."""
        drawn = random_mutation(registry.point_from_record(parent), rng)
        if drawn is None:
            return None
        child, label = drawn
        return registry.make_record(child, parent_id=parent["kernel_id"], mutation=label)


def changed_choices(parent: KernelPoint, child: KernelPoint) -> list[str]:
    """Names of the choices that differ ('algorithm' for a family switch); for tests and audits."""
    if parent.algorithm != child.algorithm:
        return ["algorithm"]
    return sorted(k for k in parent.knobs if parent.knobs[k] != child.knobs.get(k))


__all__ = [
    "Mutator",
    "SpaceMutator",
    "changed_choices",
    "family_switches",
    "knob_neighbours",
    "neighbours",
    "random_mutation",
]
