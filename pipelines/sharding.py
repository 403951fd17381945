"""Splitting a batch of work into one shard per worker (GPU), balanced across tasks.

Rows are ordered by (task, kernel_id) and dealt out in turn, row i to shard i mod n, so every
shard gets about the same number of kernels of every task (tasks differ by 100x in how long a
kernel takes to measure, so an even count per task is what evens the shards' wall time).

>>> [len(s) for s in shard_indices(7, 3)]
[3, 2, 2]
>>> shard_indices(2, 3)
[[0], [1]]
"""

from __future__ import annotations

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
