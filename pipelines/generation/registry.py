"""Where each task's kernel space lives, and what a point of it is.

A task's families are in `pipelines.generation.families.<task>` (FAMILIES, SEED). This module
finds them, enumerates their valid points, renders a point into a kernel module and turns it
into a row of the kernel batch (`warehouse.formats.KERNEL_BATCH_SCHEMA`).

`register_space` installs a space in-process (tests, experiments) without a families module.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pipelines.generation.space import Family
from warehouse.ids import kernel_record

FAMILIES_PACKAGE = "pipelines.generation.families"

# Bump whenever the way points become sources changes (rendering, record layout). Family modules
# are content-addressed anyway: a changed template gives new kernel ids.
GENERATOR = "kernelcast-space"
GENERATOR_VERSION = "space-1"

# task -> (families, seed) installed in-process; consulted before the families package.
_REGISTERED: dict[str, tuple[tuple[Family, ...], tuple[str, dict]]] = {}


@dataclass(frozen=True, eq=False)
class KernelPoint:
    """One point of a task's space: an algorithm (family id) and a value for each of its knobs."""

    task: str
    algorithm: str
    knobs: Mapping[str, Any]

    @property
    def key(self) -> tuple[str, str, tuple[tuple[str, Any], ...]]:
        """Hashable identity: (task, algorithm, knob items sorted by name)."""
        return (self.task, self.algorithm, tuple(sorted(self.knobs.items())))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KernelPoint) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def knobs_json(self) -> str:
        return json.dumps(dict(self.knobs), sort_keys=True)


def register_space(task: str, families: tuple[Family, ...], seed: tuple[str, dict]) -> None:
    """Install a space for `task` in this process (overrides the families module)."""
    _check_space(task, tuple(families), seed)
    _REGISTERED[task] = (tuple(families), (seed[0], dict(seed[1])))


def unregister_space(task: str) -> None:
    """Remove an in-process space installed with `register_space` (no-op if absent)."""
    _REGISTERED.pop(task, None)


def _load(task: str) -> tuple[tuple[Family, ...], tuple[str, dict]]:
    if task in _REGISTERED:
        return _REGISTERED[task]
    name = f"{FAMILIES_PACKAGE}.{task}"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            raise ValueError(f"task {task!r} has no kernel families (no module {name})") from None
        raise
    families = tuple(getattr(module, "FAMILIES", ()))
    seed = getattr(module, "SEED", None)
    if not families or seed is None:
        raise ValueError(f"{name} must define FAMILIES (non-empty) and SEED")
    _check_space(task, families, seed)
    return families, (seed[0], dict(seed[1]))


def _check_space(task: str, families: tuple[Family, ...], seed: tuple[str, dict]) -> None:
    algorithms = [f.algorithm for f in families]
    if len(set(algorithms)) != len(algorithms):
        raise ValueError(f"{task}: duplicate family algorithms in {algorithms}")
    if any(f.task != task for f in families):
        raise ValueError(f"{task}: a family declares another task")
    if seed[0] not in algorithms:
        raise ValueError(f"{task}: SEED algorithm {seed[0]!r} is not a family")


def families_for(task: str) -> tuple[Family, ...]:
    """The task's families, in declaration order.

    Raises:
        ValueError: the task has no families module (one line naming the module).
    """
    return _load(task)[0]


def family(task: str, algorithm: str) -> Family:
    """The family `algorithm` of `task`; ValueError naming the known ones otherwise."""
    fams = families_for(task)
    for fam in fams:
        if fam.algorithm == algorithm:
            return fam
    known = ", ".join(f.algorithm for f in fams)
    raise ValueError(f"task {task!r} has no algorithm {algorithm!r}; known: {known}")


def seed_point(task: str) -> KernelPoint:
    """The task's seed kernel (SEED), checked against its family's knobs and constraint."""
    algorithm, knobs = _load(task)[1]
    point = KernelPoint(task, algorithm, dict(knobs))
    if not family(task, algorithm).is_valid(point.knobs):
        raise ValueError(f"{task}: SEED {algorithm} {point.knobs_json()} is not a valid point")
    return point


def middle_values(fam: Family) -> dict[str, Any]:
    """Each knob's middle value (index len//2): a neutral default where no seed value applies."""
    return {k.name: k.values[len(k.values) // 2] for k in fam.knobs}


def iter_family_points(fam: Family) -> Iterator[KernelPoint]:
    """Every valid point of one family, in product order of its knobs."""
    names = [k.name for k in fam.knobs]
    for combo in itertools.product(*(k.values for k in fam.knobs)):
        values = dict(zip(names, combo))
        if fam.is_valid(values):
            yield KernelPoint(fam.task, fam.algorithm, values)


def iter_points(task: str) -> Iterator[KernelPoint]:
    """Every valid point of the task's space, family by family."""
    for fam in families_for(task):
        yield from iter_family_points(fam)


def count_points(task: str) -> int:
    """Number of valid (family, knobs) points of the task (enumerates the products)."""
    return sum(1 for _ in iter_points(task))


def is_valid_point(point: KernelPoint) -> bool:
    """Whether the point names a family of its task and satisfies its knobs and constraint."""
    try:
        fam = family(point.task, point.algorithm)
    except ValueError:
        return False
    return fam.is_valid(point.knobs)


def render_point(point: KernelPoint) -> str:
    """The point's kernel module source.

    Raises:
        ValueError: the point is not valid for its family.
    """
    fam = family(point.task, point.algorithm)
    if not fam.is_valid(point.knobs):
        raise ValueError(f"{point.task}/{point.algorithm}: invalid knobs {point.knobs_json()}")
    return fam.render(dict(point.knobs))


def make_record(
    point: KernelPoint,
    parent_id: str | None = None,
    mutation: str | None = None,
    source: str | None = None,
) -> dict[str, Any]:
    """One kernel batch row (KERNEL_BATCH_SCHEMA) for `point`.

    Args:
        point: the kernel's point.
        parent_id: kernel id of the parent in a lineage, None for a seed.
        mutation: the label of the mutation that produced it from the parent.
        source: the already rendered source, to avoid rendering twice.

    Returns:
        A dict with kernel_id, task, source, language, generator, generator_version, algorithm,
        knobs_json, parent_kernel_id, mutation.
    """
    src = render_point(point) if source is None else source
    return kernel_record(src, point.task, "triton", GENERATOR, GENERATOR_VERSION, point.algorithm,
                         point.knobs_json(), parent_id, mutation)


def point_from_record(record: Mapping[str, Any]) -> KernelPoint:
    """The point a space-generated record came from (its task, algorithm and knobs_json)."""
    if record.get("generator") != GENERATOR:
        raise ValueError(f"kernel {record.get('kernel_id')} was not generated from the space")
    return KernelPoint(record["task"], record["algorithm"], json.loads(record["knobs_json"]))
