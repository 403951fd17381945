"""A toy kernel space for search tests: 8 ordered knobs of 3 values (6,561 points, up to 16
one-choice mutations each) with a known speedup per point, and its measured table.

The speedup of a point is 2 ** (sum_i w_i * v_i + noise), w fixed and noise seeded by the
kernel id, so a search can find better kernels and a forecaster can be right or wrong about
them; about 4% of the points fail, as real kernels do.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from pipelines.generation import registry
from pipelines.generation.space import Family, Knob
from pipelines.search import space
from pipelines.search.events import Outcome
from pipelines.search.table import MeasuredTable

TASK = "toy_search"
KNOBS = tuple(f"K{i}" for i in range(8))
WEIGHTS = np.array([0.55, -0.4, 0.3, 0.25, -0.2, 0.15, 0.5, -0.35])
FAIL_SHARE = 0.04


def _render(v) -> str:
    return f'"""toy kernel {json.dumps(dict(v), sort_keys=True)}"""\nKNOBS = {dict(v)!r}\n'


FAMILY = Family(TASK, "grid", "a toy grid", tuple(Knob(k, (0, 1, 2)) for k in KNOBS), _render)
SEED = ("grid", {k: 1 for k in KNOBS})


def install() -> None:
    """Register the toy space (and forget cached renders of an earlier one)."""
    registry.register_space(TASK, (FAMILY,), SEED)
    space.clear_caches()


def uninstall() -> None:
    registry.unregister_space(TASK)
    space.clear_caches()


def _noise(kernel_id: str) -> tuple[float, float]:
    h = hashlib.sha256(kernel_id.encode()).digest()
    return int.from_bytes(h[:4], "little") / 2**32, int.from_bytes(h[4:8], "little") / 2**32


def toy_table(drop: float = 0.0, seed: int = 0) -> MeasuredTable:
    """The measured table of every toy point; `drop` leaves out that share of them at random
    (never the seed kernel, where every search starts)."""
    rng = np.random.default_rng(seed)
    table = MeasuredTable(hardware_id="toy-hw")
    root = space.root_child(TASK).kernel_id
    for point in registry.iter_points(TASK):
        child = space.child_of(point)
        if drop and rng.random() < drop and child.kernel_id != root:
            continue
        u, n = _noise(child.kernel_id)
        if u < FAIL_SHARE:
            table.add(TASK, Outcome(child.kernel_id, "failed", None, "incorrect"))
            continue
        log2s = float(WEIGHTS @ np.array([point.knobs[k] for k in KNOBS])) - 0.8 + 0.6 * (n - 0.5)
        table.add(TASK, Outcome(child.kernel_id, "ok", 2.0**log2s))
    # lineage: a tree rooted at the seed (the first knob off the seed's value steps back to it)
    for point in registry.iter_points(TASK):
        kid = space.child_of(point).kernel_id
        off = [k for k in KNOBS if point.knobs[k] != 1]
        if kid in table and off:
            parent = registry.KernelPoint(TASK, "grid", {**point.knobs, off[0]: 1})
            table.parent_of[kid] = space.child_of(parent).kernel_id
    return table
