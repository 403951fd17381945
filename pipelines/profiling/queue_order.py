"""The order a worker (or the measuring service) measures kernels in.

The measuring child and the verifier keep each task's benchmark inputs in an input cache
(inputs.InputCache): per case the input itself, its re-check seed and the timed variants. The
cache evicts by task, so a queue that alternates tasks regenerates every input of each kernel's
task on the CPU (about a second a case, in both processes): on one H200 (2026-12-02) a batch of
nine tasks taken one kernel each in turn measured 231 kernels per hour, the same harness on
tasks in chunks 2,076. So kernels go in runs of one task, in the order each task first appears
(the measuring service: one run per task, the task being measured now first; the batch worker:
tasks take turns in runs of TASK_CHUNK, so a run stopped by its time budget still covers every
task and each task's inputs are generated once per run, not per kernel).

`torch.compile` kernels go last: Inductor compiles each shape in the first checked call (70 s
or more on the H200, the GPU idle meanwhile), so a run stopped by its time budget loses those
rather than the many kernels that would have been measured in the same time.

Imports only the standard library.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# `torch.compile(` or `@torch.compile` and the `compile` of `from torch import compile`; Inductor's
# own entry points too. A plain substring test: the order is a throughput choice, never a verdict.
_COMPILE = re.compile(r"\btorch\s*\.\s*compile\b|\btorch\._dynamo\b|\btorch\._inductor\b|from\s+torch\s+import\s+[^\n]*\bcompile\b")


TASK_CHUNK = 64  # the batch worker's run length per task (scripts/build_gpu_batches.py writes chunks of 48)


def uses_torch_compile(source: str | None) -> bool:
    """Whether a kernel's source calls torch.compile (or Dynamo/Inductor directly).

    >>> uses_torch_compile("@torch.compile\\ndef f(x): ..."), uses_torch_compile("import triton")
    (True, False)
    """
    return bool(source) and _COMPILE.search(source) is not None


def order_kernels(kernels: Iterable[dict], first_task: str | None = None, chunk: int | None = None) -> list[dict]:
    """`kernels` grouped by task (tasks in order of first appearance, `first_task` first), the
    batch's order kept within a task, torch.compile kernels after all others (grouped alike).

    With `chunk`, tasks take turns in runs of that many kernels instead of one run each: a run cut
    short by its time budget still measures every task (the batch builders interleave tasks for
    that), and the caches regenerate a task's inputs once per run of `chunk`, not per kernel.

    >>> ks = [{"task": "a", "source": ""}, {"task": "b", "source": ""}, {"task": "a", "source": "torch.compile(f)"},
    ...       {"task": "a", "source": "x"}, {"task": "b", "source": "y"}, {"task": "a", "source": "z"}]
    >>> [(k["task"], k["source"]) for k in order_kernels(ks)]
    [('a', ''), ('a', 'x'), ('a', 'z'), ('b', ''), ('b', 'y'), ('a', 'torch.compile(f)')]
    >>> [k["source"] for k in order_kernels(ks, chunk=2)]
    ['', 'x', '', 'y', 'z', 'torch.compile(f)']
    >>> [k["task"] for k in order_kernels(ks, first_task="b")][:2]
    ['b', 'b']
    """
    items = list(kernels)
    rank: dict[str, int] = {} if first_task is None else {first_task: -1}
    for k in items:
        rank.setdefault(k.get("task"), len(rank))

    def arrange(idx: list[int]) -> list[int]:
        groups: dict[str, list[int]] = {}
        for i in sorted(idx, key=lambda i: (rank[items[i].get("task")], i)):
            groups.setdefault(items[i].get("task"), []).append(i)
        if chunk is None:
            return [i for g in groups.values() for i in g]
        out: list[int] = []
        step = max(1, int(chunk))
        for start in range(0, max((len(g) for g in groups.values()), default=0), step):
            for g in groups.values():
                out += g[start:start + step]
        return out

    compiled = [uses_torch_compile(k.get("source")) for k in items]
    order = arrange([i for i in range(len(items)) if not compiled[i]]) + arrange([i for i in range(len(items)) if compiled[i]])
    return [items[i] for i in order]
