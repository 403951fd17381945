"""Splitting a batch of work into one shard per worker (GPU), balanced.

Kernels to measure: rows are ordered by (task, kernel_id) and dealt out in turn, row i to shard
i mod n, so every shard gets about the same number of kernels of every task (tasks differ by
100x in how long a kernel takes to measure, so an even count per task is what evens the
shards' wall time).

Pairs to forecast: one forward pass per pair, whose cost grows with the prompt's length (real
prompts run from a few hundred to several thousand tokens), so items are weighed and dealt
heaviest first to the lightest shard (`balanced_shards`).

>>> [len(s) for s in shard_indices(7, 3)]
[3, 2, 2]
>>> shard_indices(2, 3)
[[0], [1]]
>>> balanced_shards(["a", "b", "c", "d"], [5, 1, 4, 2], 2)
[[0, 1], [2, 3]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl


def shard_indices(n_items: int, n_shards: int) -> list[list[int]]:
    """Row indices of each non-empty shard, row i in shard i mod n_shards.

    Args:
        n_items: rows to split.
        n_shards: workers available (at least 1).
    Returns:
        At most n_shards lists of indices; a shard that would be empty is left out.
    Raises:
        ValueError: n_shards < 1.
    """
    if n_shards < 1:
        raise ValueError(f"need at least one shard, got {n_shards}")
    shards = [list(range(i, n_items, n_shards)) for i in range(n_shards)]
    return [s for s in shards if s]


def split_batch(frame: pl.DataFrame, n_shards: int) -> list[pl.DataFrame]:
    """A kernel batch (kernel_id, task, ...) split into at most n_shards balanced batches.

    Args:
        frame: the batch; needs columns task and kernel_id.
        n_shards: workers available.
    Returns:
        The non-empty shards, each sorted like the input order (task, kernel_id).
    """
    ordered = frame.sort("task", "kernel_id")
    return [ordered[idx] for idx in shard_indices(ordered.height, n_shards)]


def balanced_shards(keys: Sequence[str], weights: Sequence[float], n_shards: int) -> list[list[int]]:
    """Indices of n_shards shards of about equal total weight, the same for the same input.

    Heaviest item first (ties by key), each to the shard with the least weight so far (ties:
    fewer items, then the lower index). The heaviest and lightest shards then differ by at most
    one item's weight.

    Args:
        keys: a unique, stable name per item (a pair id): the order of ties.
        weights: an item's cost (a prompt's length), one per key.
        n_shards: workers available (at least 1).
    Returns:
        Exactly n_shards lists of indices into keys, each ascending; some may be empty when
        there are fewer items than shards.
    Raises:
        ValueError: n_shards < 1, keys and weights of different lengths, or a repeated key.
    """
    if n_shards < 1:
        raise ValueError(f"need at least one shard, got {n_shards}")
    if len(keys) != len(weights):
        raise ValueError(f"{len(keys)} keys but {len(weights)} weights")
    if len(set(keys)) != len(keys):
        seen: set = set()
        twice = next(k for k in keys if k in seen or seen.add(k))
        raise ValueError(f"key {twice!r} repeats: each item needs a unique key")
    loads = [(0.0, 0, i) for i in range(n_shards)]  # (weight so far, items, shard index)
    shards: list[list[int]] = [[] for _ in range(n_shards)]
    for item in sorted(range(len(keys)), key=lambda i: (-weights[i], keys[i])):
        weight, count, index = min(loads)
        shards[index].append(item)
        loads[index] = (weight + weights[item], count + 1, index)
    return [sorted(s) for s in shards]
