"""Sampling kernels from a task's space: a mutation lineage, or a stratified uniform sample.

`generate_lineage` imitates an evolutionary search (the paper's data come from search
lineages): it starts from the task's SEED kernel and keeps mutating kernels it has already made,
so every record has a parent and a mutation label, and parent -> child pairs exist for the
discovery metrics. `sample_uniform` draws points family by family, without lineage.

Both are deterministic: the same (task, count, seed) gives the same kernel ids in the same order.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from pipelines.generation import registry
from pipelines.generation.mutations import neighbours, random_mutation
from pipelines.generation.registry import KernelPoint
from pipelines.generation.space import Family
from warehouse.ids import kernel_id

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (done, total)

# Parent choice: with this probability, one of the RECENT_WINDOW newest kernels (a search keeps
# exploiting its latest improvements); otherwise any kernel made so far (exploration).
RECENT_PROB = 0.5
RECENT_WINDOW = 16
# A family whose knob product is larger than this is sampled by rejection instead of enumerated.
ENUMERATE_LIMIT = 200_000


def generate_lineage(
    task: str,
    count: int,
    seed: int,
    progress: Progress | None = None,
    recent_prob: float = RECENT_PROB,
    recent_window: int = RECENT_WINDOW,
) -> list[dict[str, Any]]:
    """`count` distinct kernels of `task` forming one lineage tree rooted at the SEED kernel.

    Each step picks a parent among the kernels made so far (see RECENT_PROB), applies a random
    one-choice mutation that yields a point not produced before, and keeps the child unless its
    source equals an existing kernel's. A parent with no unproduced neighbour leaves the pool.

    Args:
        task: task name with a kernel space.
        count: number of kernels wanted (>= 1), seed kernel included.
        seed: seed of the numpy Generator; the only randomness.
        progress: called as progress(done, count) after each kernel.
        recent_prob: probability of picking the parent among the newest `recent_window` kernels.
        recent_window: size of that window.

    Returns:
        Records in KERNEL_BATCH_SCHEMA order of creation; the first is the seed (no parent,
        no mutation), every other has parent_kernel_id of an earlier record and a mutation label.

    Raises:
        ValueError: count < 1, or fewer than `count` kernels are reachable from the seed.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    rng = np.random.default_rng(seed)
    root = registry.seed_point(task)
    first = registry.make_record(root)
    records = [first]
    seen_points = {root.key}
    seen_ids = {first["kernel_id"]}
    pool: list[tuple[KernelPoint, str]] = [(root, first["kernel_id"])]  # live parents
    if progress:
        progress(1, count)
    while len(records) < count:
        if not pool:
            raise ValueError(
                f"{task}: only {len(records)} distinct kernels reachable from the seed, {count} asked"
            )
        if rng.random() < recent_prob:
            idx = len(pool) - 1 - int(rng.integers(min(recent_window, len(pool))))
        else:
            idx = int(rng.integers(len(pool)))
        parent, parent_id = pool[idx]
        drawn = random_mutation(parent, rng, exclude=seen_points)
        if drawn is None:
            pool.pop(idx)  # every neighbour already produced: exhausted
            continue
        child, label = drawn
        seen_points.add(child.key)
        source = registry.render_point(child)
        kid = kernel_id(source)
        if kid in seen_ids:
            # another point rendered the same code (e.g. a knob the template ignores here)
            continue
        seen_ids.add(kid)
        records.append(
            registry.make_record(child, parent_id=parent_id, mutation=label, source=source)
        )
        pool.append((child, kid))
        if progress:
            progress(len(records), count)
    log.info("lineage of %d %s kernels (seed %d)", len(records), task, seed)
    return records


def _family_stream(fam: Family, rng: np.random.Generator) -> Iterator[KernelPoint]:
    """The family's valid points in a random order without repeats."""
    if fam.size() <= ENUMERATE_LIMIT:
        points = list(registry.iter_family_points(fam))
        for i in rng.permutation(len(points)):
            yield points[int(i)]
        return
    # too many combinations to list: rejection-sample knob combinations
    seen: set = set()
    misses = 0
    while misses < 10_000:
        values = {k.name: k.values[int(rng.integers(len(k.values)))] for k in fam.knobs}
        point = KernelPoint(fam.task, fam.algorithm, values)
        if point.key in seen or not fam.is_valid(values):
            misses += 1
            continue
        misses = 0
        seen.add(point.key)
        yield point


def sample_uniform(
    task: str, count: int, seed: int, progress: Progress | None = None
) -> list[dict[str, Any]]:
    """`count` distinct kernels drawn uniformly within families, families in equal shares.

    Families are visited round-robin, each yielding its next point of a random permutation, so
    any prefix is stratified too; a family that runs out leaves its share to the others. No
    lineage: parent_kernel_id and mutation are None.

    Args:
        task: task name with a kernel space.
        count: number of kernels wanted.
        seed: seed of the numpy Generator.
        progress: called as progress(done, count).

    Returns:
        Records in KERNEL_BATCH_SCHEMA; fewer than `count` only if the space is smaller.
    """
    return _sample_families(task, registry.families_for(task), count, seed, progress)


# Algorithms added to reach the speedup bins the first H200 round left empty (2026-11-29):
# grid-capped persistent kernels for the slow end (bins 1-4) of the memory-bound tasks, a
# Hopper-tuned fused matmul for bins 6+ of matmul_bias_gelu, and trimul's naive unfused kernel
# (its small-tile points measured ~0.12x, bin 1). gdn_chunk_fwd_o had nothing between 0.7x and 2x
# (bins 4-6): a capped-grid fused kernel and two PyTorch-fp32 partial ports (unmeasured, aimed there).
BIN_FILL_ALGORITHMS: dict[str, tuple[str, ...]] = {
    "softmax": ("grid_capped_online",),
    "rms_norm": ("grid_capped_two_pass",),
    "layer_norm": ("grid_capped_sum_sumsq",),
    "fp8_quant": ("grid_capped_tiles",),
    "cross_entropy": ("grid_capped_online",),
    "matmul_bias_gelu": ("hopper_tuned_fused",),
    "trimul": ("unfused_cuda_core",),
    "gdn_chunk_fwd_o": ("grid_capped_fused", "torch_intra_triton_inter", "torch_terms_triton_gate"),
}


def sample_algorithms(
    task: str,
    count: int,
    seed: int,
    algorithms: tuple[str, ...] | list[str] | None = None,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """`count` distinct kernels of `task` drawn only from the families named in `algorithms`.

    Same stratified draw as `sample_uniform` (families in equal shares, uniform within a
    family, no lineage), restricted to the given algorithms; deterministic in (task, count,
    seed, algorithms).

    Args:
        task: task name with a kernel space.
        count: number of kernels wanted.
        seed: seed of the numpy Generator.
        algorithms: family ids of the task, e.g. ("grid_capped_two_pass",); None takes
            BIN_FILL_ALGORITHMS[task].
        progress: called as progress(done, count).

    Returns:
        Records in KERNEL_BATCH_SCHEMA (parent_kernel_id and mutation None); fewer than
        `count` only if those families hold fewer distinct kernels.

    Raises:
        ValueError: an algorithm is not a family of the task, or none is given.
    """
    names = tuple(BIN_FILL_ALGORITHMS.get(task, ()) if algorithms is None else algorithms)
    if not names:
        raise ValueError(f"{task}: no algorithms given (and none in BIN_FILL_ALGORITHMS)")
    families = tuple(registry.family(task, name) for name in dict.fromkeys(names))
    return _sample_families(task, families, count, seed, progress)


def _sample_families(
    task: str,
    families: tuple[Family, ...],
    count: int,
    seed: int,
    progress: Progress | None,
) -> list[dict[str, Any]]:
    """Round-robin over `families`, each yielding its next point of a random permutation."""
    rng = np.random.default_rng(seed)
    streams = [_family_stream(fam, rng) for fam in families]
    records: list[dict[str, Any]] = []
    seen_ids: set[str] = set()
    while len(records) < count and streams:
        for stream in list(streams):
            if len(records) >= count:
                break
            point = next(stream, None)
            if point is None:
                streams.remove(stream)
                continue
            record = registry.make_record(point)
            if record["kernel_id"] in seen_ids:
                continue
            seen_ids.add(record["kernel_id"])
            records.append(record)
            if progress:
                progress(len(records), count)
    if len(records) < count:
        log.warning("%s: space holds only %d distinct kernels, %d asked", task, len(records), count)
    return records


def reachable_count(task: str, limit: int | None = None) -> int:
    """Number of points reachable from the SEED by one-choice mutations (breadth-first).

    Args:
        task: task name with a kernel space.
        limit: stop counting once this many are found (the walk can be long for big spaces).

    Returns:
        The count (at most `limit` when given).
    """
    root = registry.seed_point(task)
    seen = {root.key}
    queue = deque([root])
    while queue:
        if limit is not None and len(seen) >= limit:
            return limit
        for child, _ in neighbours(queue.popleft()):
            if child.key not in seen:
                seen.add(child.key)
                queue.append(child)
    return len(seen) if limit is None else min(len(seen), limit)
