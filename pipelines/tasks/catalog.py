"""The task suite as rows for the warehouse and the CLI, and the references' self-check."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import torch

from pipelines.tasks import all_tasks, get_task
from pipelines.tasks.contract import Task


def task_row(task: Task) -> dict:
    """One `tasks` table row; cases and tolerances as JSON text."""
    return {
        "task": task.name,
        "description": task.description,
        "contract_version": task.contract_version,
        "source": task.source,
        "correctness_cases": json.dumps(list(task.correctness_cases), sort_keys=True),
        "benchmark_cases": json.dumps(list(task.benchmark_cases), sort_keys=True),
        "tolerances": json.dumps(task.tolerances, sort_keys=True),
    }


def task_rows() -> list[dict]:
    return [task_row(t) for t in all_tasks()]


@dataclass(frozen=True)
class SelfCheck:
    task: str
    ok: bool
    message: str
    seconds: float


def reference_self_check(name: str) -> SelfCheck:
    """Run the task's reference on every correctness case and check it against itself.

    Catches a task whose check cannot pass (tolerances, dtype mix-ups) or whose inputs are not
    deterministic by seed. The reference is our own code, so it runs in-process.
    """
    task = get_task(name)
    start = time.perf_counter()
    for case in task.correctness_cases:
        case = dict(case)
        seed = case.pop("seed")
        data = task.generate_input(seed=seed, **case)
        out = task.ref_kernel(data)
        ok, msg = task.check_implementation(task.generate_input(seed=seed, **case), out)
        if not ok:
            return SelfCheck(name, False, f"case {task.case_id({**case, 'seed': seed})}: {msg}", time.perf_counter() - start)
    torch.manual_seed(0)
    return SelfCheck(name, True, "ok", time.perf_counter() - start)
