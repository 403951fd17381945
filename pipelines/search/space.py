"""The generator's mutation graph as the search sees it: kernels named by id, rendered on demand.

A kernel of the search is a point of the task's space (pipelines/generation: family + knob
values); its source is `registry.render_point` and its id the sha256 of that source. Family
templates list knobs in the order of the point's dict, and `registry.point_from_record` (which
reads the sorted `knobs_json`) would change that order, and with it the id, for some families.
Points here are therefore always put in the family's declaration order first: the order the
sampler and `mutations.neighbours` produce, so ids match the generator's and the committed data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from pipelines.generation import registry
from pipelines.generation.mutations import neighbours
from pipelines.generation.registry import KernelPoint
from pipelines.search.events import Child

# Compile features a kernel mapping may carry for a forecaster (aot.compile_many's columns).
FEATURE_KEYS = ("n_regs", "n_spills", "shared_bytes", "n_kernels", "n_launches")


def canonical(point: KernelPoint) -> KernelPoint:
    """The same point with knobs in its family's declaration order."""
    fam = registry.family(point.task, point.algorithm)
    return KernelPoint(point.task, point.algorithm, {k.name: point.knobs[k.name] for k in fam.knobs})


@lru_cache(maxsize=200_000)
def _render(task: str, algorithm: str, knobs_json: str) -> tuple[str, str]:
    """(source, kernel id) of a point; cached because searches revisit neighbourhoods."""
    point = canonical(KernelPoint(task, algorithm, json.loads(knobs_json)))
    record = registry.make_record(point)
    return record["source"], record["kernel_id"]


def child_of(point: KernelPoint, mutation: str | None = None) -> Child:
    """The Child (with kernel id) of a point."""
    point = canonical(point)
    _, kid = _render(point.task, point.algorithm, point.knobs_json())
    return Child(kid, point.algorithm, point.knobs_json(), mutation)


def root_child(task: str) -> Child:
    """The task's seed kernel, where every search starts."""
    return child_of(registry.seed_point(task))


@lru_cache(maxsize=50_000)
def _neighbours(task: str, algorithm: str, knobs_json: str) -> tuple[Child, ...]:
    point = canonical(KernelPoint(task, algorithm, json.loads(knobs_json)))
    out: list[Child] = []
    seen: set[str] = set()
    for nb, label in neighbours(point):
        child = child_of(nb, label)
        if child.kernel_id not in seen:  # two points may render the same code
            seen.add(child.kernel_id)
            out.append(child)
    return tuple(out)


def children(task: str, parent: Child) -> tuple[Child, ...]:
    """Every one-choice mutation of `parent`, deduplicated by kernel id, in the generator's order."""
    return _neighbours(task, parent.algorithm, parent.knobs_json)


def kernel_record(
    task: str,
    child: Child,
    parent_id: str | None = None,
    features: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The kernel mapping a forecaster or the worker sees (KERNEL_BATCH_SCHEMA columns, plus
    compile features when `features` knows the kernel).

    Raises:
        ValueError: the rendered source does not hash to the child's id (a changed template).
    """
    source, kid = _render(task, child.algorithm, child.knobs_json)
    if kid != child.kernel_id:
        raise ValueError(f"{task}/{child.algorithm} {child.knobs_json} renders to {kid}, not {child.kernel_id}")
    record: dict[str, Any] = {
        "kernel_id": kid,
        "task": task,
        "source": source,
        "language": "triton",
        "generator": registry.GENERATOR,
        "generator_version": registry.GENERATOR_VERSION,
        "algorithm": child.algorithm,
        "knobs_json": child.knobs_json,  # sorted keys (KernelPoint.knobs_json)
        "parent_kernel_id": parent_id,
        "mutation": child.mutation,
    }
    if features and kid in features:
        record.update({k: features[kid].get(k) for k in FEATURE_KEYS})
    return record


def clear_caches() -> None:
    """Forget rendered sources and neighbourhoods (after `registry.register_space` changes a task)."""
    _render.cache_clear()
    _neighbours.cache_clear()


def reference_kernel(task: str) -> dict[str, Any]:
    """The task's PyTorch reference as a kernel mapping: the anchor of every score.

    A task without a reference module (an in-process test space) gets a stand-in named
    'reference:<task>' with no source.
    """
    from pipelines.generation.reference import reference_record
    from pipelines.tasks import TASK_MODULES

    if task in TASK_MODULES:
        return reference_record(task)
    return {"kernel_id": f"reference:{task}", "task": task, "source": "", "language": "pytorch",
            "generator": "reference", "generator_version": "", "algorithm": "reference", "knobs_json": "{}",
            "parent_kernel_id": None, "mutation": None}
