"""PUCT over a kernel archive: the selection rule of the paper's search, as pure functions.

What the paper's public code does (codezakh/gpu-forecasters, src/gpu_forecasters/
max_reward_puct/search.py and ttt_discover/v2/archive/puct_math.py), written anew here:
- score(i) = Q(i) + c * scale * P(i) * sqrt(1 + T) / (1 + n(i)), where Q(i) is the best reward
  among i's children once i was expanded (n(i) > 0) and i's own reward before; P is a rank
  prior over the archive's rewards (rank 0, the best, weighs N, the worst 1, normalised);
  scale is max - min of the rewards of non-root nodes (all nodes while there are none), at
  least 1e-6; T counts expansions.
- a batch of parents is picked greedily by (score, reward) descending, skipping any node that
  is an ancestor or a descendant of one already picked (lineage blocking);
- after a step, each parent with at least one valid child gets m = max(m, best child reward)
  and +1 visit on itself and every ancestor, T += 1; a parent whose children all failed gets
  the visits and T += 1 too, so it stops being picked forever;
- archive admission: the best `k` valid children of each parent, deduplicated, then the whole
  archive truncated by reward to its capacity, the root always kept.

Rewards here are log2 speedups against the task reference, so a doubling is worth the same
at 1x and at 10x.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Node:
    """A kernel in the archive."""

    kernel_id: str
    reward: float  # log2 speedup vs the task reference (a forecast one when not measured)
    parent: str | None
    ancestors: tuple[str, ...]  # parent first, root last
    measured: bool = True  # False: a selective search's trusted forecast


def rank_prior(rewards: np.ndarray) -> np.ndarray:
    """P(i) = (N - rank_i) / sum_j (N - rank_j), rank 0 for the largest reward.

    >>> rank_prior(np.array([0.0, 2.0, 1.0])).tolist()
    [0.16666666666666666, 0.5, 0.3333333333333333]
    """
    n = rewards.size
    if n == 0:
        return np.zeros(0)
    ranks = np.argsort(np.argsort(-rewards, kind="stable"), kind="stable")
    weights = (n - ranks).astype(np.float64)
    return weights / weights.sum()


def reward_scale(rewards: np.ndarray, is_root: np.ndarray) -> float:
    """max - min of the non-root rewards (all rewards while only the root is there), >= 1e-6."""
    pool = rewards[~is_root] if np.any(~is_root) else rewards
    if pool.size == 0:
        return 1.0
    return max(float(pool.max() - pool.min()), 1e-6)


def puct_scores(
    archive: Sequence[Node],
    visits: Mapping[str, int],
    best_child: Mapping[str, float],
    expansions: int,
    root_id: str,
    c_puct: float = 1.0,
) -> np.ndarray:
    """One selection score per archive node (larger is better), in archive order."""
    rewards = np.array([n.reward for n in archive], dtype=np.float64)
    is_root = np.array([n.kernel_id == root_id for n in archive])
    prior = rank_prior(rewards)
    scale = reward_scale(rewards, is_root)
    n_visits = np.array([visits.get(n.kernel_id, 0) for n in archive], dtype=np.float64)
    q = np.array(
        [best_child.get(n.kernel_id, n.reward) if visits.get(n.kernel_id, 0) > 0 else n.reward for n in archive]
    )
    return q + c_puct * scale * prior * math.sqrt(1.0 + expansions) / (1.0 + n_visits)


def lineage(kernel_id: str, archive: Sequence[Node]) -> set[str]:
    """The node, its ancestors and every descendant of it in the archive."""
    by_id = {n.kernel_id: n for n in archive}
    out = {kernel_id} | set(by_id[kernel_id].ancestors if kernel_id in by_id else ())
    out |= {n.kernel_id for n in archive if kernel_id in n.ancestors}
    return out


def select_parents(
    archive: Sequence[Node],
    visits: Mapping[str, int],
    best_child: Mapping[str, float],
    expansions: int,
    root_id: str,
    batch_size: int,
    c_puct: float = 1.0,
    eligible: set[str] | None = None,
) -> list[str]:
    """Up to `batch_size` parents: by (score, reward) descending, lineage-blocked.

    Scores are computed over the whole archive; nodes outside `eligible` (when given: nodes
    with no mutation left to try) are never picked and block nothing. Ties in (score, reward)
    keep archive order (insertion order), so the choice is deterministic.
    """
    if not archive:
        return []
    scores = puct_scores(archive, visits, best_child, expansions, root_id, c_puct)
    rewards = np.array([n.reward for n in archive])
    order = sorted(range(len(archive)), key=lambda i: (-scores[i], -rewards[i], i))
    picked: list[str] = []
    blocked: set[str] = set()
    for i in order:
        node = archive[i]
        if node.kernel_id in blocked or (eligible is not None and node.kernel_id not in eligible):
            continue
        picked.append(node.kernel_id)
        if len(picked) >= batch_size:
            break
        blocked |= lineage(node.kernel_id, archive)
    return picked


def backpropagate(
    parents: Sequence[str],
    best_child_reward: Mapping[str, float],
    archive_by_id: Mapping[str, Node],
    visits: dict[str, int],
    best_child: dict[str, float],
    expansions: int,
) -> int:
    """Update visits and best-child rewards in place after a step; return the new T.

    Args:
        parents: the step's parents.
        best_child_reward: parent id -> best reward among its valid children (absent: none valid).
        archive_by_id: the archive before admission (for the parents' ancestors).
        visits, best_child: n and m of the PUCT score, updated in place.
        expansions: T before the step.
    """
    for pid in parents:
        node = archive_by_id.get(pid)
        if node is None:
            continue
        if pid in best_child_reward:
            y = best_child_reward[pid]
            best_child[pid] = max(best_child.get(pid, y), y)
        for aid in (pid, *node.ancestors):
            visits[aid] = visits.get(aid, 0) + 1
        expansions += 1
    return expansions


def admit(
    archive: list[Node],
    children_by_parent: Mapping[str, Sequence[Node]],
    k: int,
    capacity: int,
    root_id: str,
) -> list[str]:
    """Add the best `k` children of each parent to `archive` (in place); return the ids added.

    Children already in the archive are skipped; when the archive outgrows `capacity`, the
    lowest rewards go (the root stays).
    """
    present = {n.kernel_id for n in archive}
    added: list[str] = []
    for kids in children_by_parent.values():
        ranked = sorted(enumerate(kids), key=lambda t: (-t[1].reward, t[0]))
        for _, child in ranked[:k]:
            if child.kernel_id in present:
                continue
            archive.append(child)
            present.add(child.kernel_id)
            added.append(child.kernel_id)
    if len(archive) > capacity:
        order = sorted(range(len(archive)), key=lambda i: (-archive[i].reward, i))
        keep = {i for i, n in enumerate(archive) if n.kernel_id == root_id}
        for i in order:
            if len(keep) >= capacity:
                break
            keep.add(i)
        archive[:] = [archive[i] for i in sorted(keep)]
    return added
