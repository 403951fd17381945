"""Does the measured space carry the simulation? Coverage, and the batch that closes the gaps.

Coverage is the share of proposed children (every mode, seed and task of a simulation, each
child counted once per run that proposed it) that have a measurement in the table. A filtered
search forecasts 16 mutations of each parent it expands, which is about the whole neighbourhood
(13-18 one-choice mutations per kernel in these spaces), so the simulation needs the complete
neighbourhoods of every parent any run visits.

Which parents a run visits depends on the outcomes of the children it measures, so measuring
today's unmeasured children changes tomorrow's paths. `frontier` therefore iterates: simulate;
collect the unmeasured children; give them plausible outcomes (`Imputer`: a child's speedup is
its parent's times a log-ratio drawn from the task's measured parent -> child pairs, or a
failure at the task's failure rate); simulate again on the augmented table; and so on. The
union of what any round proposed is the reachable frontier for those budgets; its order is the
priority (children today's runs need first, then those more rounds and runs reached, earlier
steps first), so a GPU run cut short still measures what matters most.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.forecasting.base import PairForecaster
from pipelines.search import space
from pipelines.search.driver import SearchRun
from pipelines.search.events import Child, Outcome, Proposed
from pipelines.search.simulate import SimulationPlan, simulate
from pipelines.search.table import MeasuredTable


@dataclass
class FrontierEntry:
    """An unmeasured child some run proposed."""

    task: str
    child: Child
    parent: str  # the first parent seen proposing it (its lineage in the batch)
    first_round: int  # 0: proposed on the real table; r: only after r rounds of imputation
    hits: int  # (scenario, round, run) triples that proposed it
    first_step: int  # earliest step it was proposed at

    def priority(self, task_order: Sequence[str], cost: Mapping[str, float] | None = None) -> tuple:
        """Sort key: earlier rounds first, then proposals per second of GPU time (hits / the
        task's cost per kernel), then earlier steps."""
        per_s = self.hits / ((cost or {}).get(self.task) or 1.0)
        return (self.first_round, -per_s, self.first_step, task_order.index(self.task), self.child.kernel_id)


def proposed(runs: Sequence[SearchRun]) -> list[tuple[str, Child, str, int]]:
    """(task, child, parent, step) of every Proposed child, once per run."""
    out = []
    for run in runs:
        seen: set[str] = set()
        for e in run.log.read():
            if isinstance(e, Proposed):
                for c in e.children:
                    if c.kernel_id not in seen:
                        seen.add(c.kernel_id)
                        out.append((run.config.task, c, e.parent, e.step))
    return out


def coverage(runs: Sequence[SearchRun], table: MeasuredTable) -> dict[str, Any]:
    """Share of proposed children with a measurement, overall and per task; and among the
    children sent to (simulated) measurement, the share the table held.

    Returns:
        {"proposed", "covered", "coverage", "measured", "measured_covered", "measured_coverage",
         "unmeasured_distinct", "by_task": {task: {...same keys}}}
    """
    per: dict[str, dict[str, Any]] = {}
    for task, child, _, _ in proposed(runs):
        d = per.setdefault(task, {"proposed": 0, "covered": 0, "measured": 0, "measured_covered": 0,
                                  "missing": set()})
        d["proposed"] += 1
        if child.kernel_id in table:
            d["covered"] += 1
        else:
            d["missing"].add(child.kernel_id)
    for run in runs:
        d = per.setdefault(run.config.task, {"proposed": 0, "covered": 0, "measured": 0, "measured_covered": 0,
                                             "missing": set()})
        for m in run.state.measured:
            d["measured"] += 1
            d["measured_covered"] += m.outcome.status != "unmeasured"

    def finish(d: dict[str, Any]) -> dict[str, Any]:
        return {
            "proposed": d["proposed"], "covered": d["covered"],
            "coverage": d["covered"] / d["proposed"] if d["proposed"] else None,
            "measured": d["measured"], "measured_covered": d["measured_covered"],
            "measured_coverage": d["measured_covered"] / d["measured"] if d["measured"] else None,
            "unmeasured_distinct": len(d["missing"]),
        }

    total = {"proposed": 0, "covered": 0, "measured": 0, "measured_covered": 0, "missing": set()}
    for d in per.values():
        for k in ("proposed", "covered", "measured", "measured_covered"):
            total[k] += d[k]
        total["missing"] |= d["missing"]
    return {**finish(total), "by_task": {t: finish(d) for t, d in sorted(per.items())}}


class Imputer:
    """Plausible outcomes for unmeasured kernels, from the table's measured lineage.

    Per task: the log2 ratios child/parent of measured parent -> child pairs (both correct),
    grouped by the parent's speedup bin, and the share of children of correct parents that
    failed. A child of a parent in bin b draws a ratio of that bin's pairs (all of the task's
    pairs when the bin has fewer than `min_pairs`); the result is clamped to the task's measured
    range, so imputed paths never run off to speedups nothing measured has shown. Draws are
    seeded by (salt, kernel id): a kernel gets one imputed outcome whichever run asks.
    """

    def __init__(self, table: MeasuredTable, min_pairs: int = 20):
        from models.bins import speedup_to_bin

        self._bin = speedup_to_bin
        self.min_pairs = min_pairs
        self.ratios: dict[tuple[str, int | None], np.ndarray] = {}
        self.fail_rate: dict[str, float] = {}
        self.range: dict[str, tuple[float, float]] = {}
        ratios: dict[tuple[str, int | None], list[float]] = {}
        fails: dict[str, list[bool]] = {}
        for kid, pid in table.parent_of.items():
            child, parent = table.get(kid), table.get(pid)
            if child is None or parent is None or not parent.ok:
                continue
            task = table.task_of[kid]
            fails.setdefault(task, []).append(not child.ok)
            if child.ok:
                r = math.log2(child.speedup / parent.speedup)
                ratios.setdefault((task, None), []).append(r)
                ratios.setdefault((task, speedup_to_bin(parent.speedup)), []).append(r)
        for key, vals in ratios.items():
            self.ratios[key] = np.asarray(vals)
        for task, vals in fails.items():
            self.fail_rate[task] = float(np.mean(vals))
        for kid, out in table.outcomes.items():
            if out.ok:
                task = table.task_of[kid]
                lo, hi = self.range.get(task, (out.speedup, out.speedup))
                self.range[task] = (min(lo, out.speedup), max(hi, out.speedup))

    def outcome(self, task: str, kernel_id: str, parent_speedup: float, salt: int) -> Outcome:
        digest = hashlib.sha256(f"{salt}:{kernel_id}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        if rng.random() < self.fail_rate.get(task, 0.0):
            return Outcome(kernel_id, "failed", None, "imputed")
        ratios = self.ratios.get((task, self._bin(parent_speedup)))
        if ratios is None or ratios.size < self.min_pairs:
            ratios = self.ratios.get((task, None), np.zeros(1))
        lo, hi = self.range.get(task, (parent_speedup, parent_speedup))
        s = parent_speedup * 2.0 ** float(ratios[int(rng.integers(ratios.size))])
        return Outcome(kernel_id, "ok", float(min(max(s, lo), hi)))


ForecasterFactory = Callable[[MeasuredTable], PairForecaster | None]


def frontier(
    scenarios: Sequence[tuple[SimulationPlan, ForecasterFactory]],
    table: MeasuredTable,
    rounds: int = 3,
    cost: Mapping[str, float] | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[FrontierEntry], list[dict[str, Any]]]:
    """The unmeasured children the scenarios' runs may propose, in priority order.

    Args:
        scenarios: (plan, forecaster factory) pairs whose proposals all count, e.g. the same
            plan with the oracle and with the uniform forecaster (a real forecaster's picks lie
            between knowing everything and knowing nothing) or with both anchors. A factory
            builds the forecaster for a (possibly augmented) table.
        table: the measured space.
        rounds: imputation rounds after the first simulation on the real table.
        cost: GPU seconds per kernel by task (heavier tasks get a lower priority per hit).
        progress: called with a line per round.

    Returns:
        (entries sorted by priority, one dict per round: round, runs, new entries, coverage of
        that round's proposals by the real table).
    """
    entries: dict[str, FrontierEntry] = {}
    imputer = Imputer(table)
    augmented = table.copy()
    stats = []
    tasks: list[str] = []
    for plan, _ in scenarios:
        tasks += [t for t in plan.tasks if t not in tasks]
    for r in range(rounds + 1):
        new = n_runs = proposed_n = covered = 0
        for plan, factory in scenarios:
            runs = simulate(plan, augmented, factory(augmented))
            n_runs += len(runs)
            for task, child, parent, step in proposed(runs):
                proposed_n += 1
                if child.kernel_id in table:
                    covered += 1
                    continue
                e = entries.get(child.kernel_id)
                if e is None:
                    entries[child.kernel_id] = FrontierEntry(task, child, parent, r, 1, step)
                    new += 1
                else:
                    e.hits += 1
                    e.first_step = min(e.first_step, step)
        cov = covered / proposed_n if proposed_n else 1.0
        stats.append({"round": r, "runs": n_runs, "new": new, "entries": len(entries), "coverage": cov})
        if progress:
            progress(f"round {r}: {n_runs} runs, {new} new unmeasured children ({len(entries)} in all); "
                     f"the measured table covers {cov:.3f} of this round's proposals")
        # an outcome for every entry so far, parents before children (entries in discovery order)
        for kid, e in entries.items():
            if kid in augmented:
                continue
            parent = augmented.get(e.parent)
            base = parent.speedup if parent is not None and parent.ok else 1.0
            augmented.add(e.task, imputer.outcome(e.task, kid, base, salt=r))
        if r > 0 and new == 0:
            break
    return sorted(entries.values(), key=lambda e: e.priority(tasks, cost)), stats


def coverage_if_measured(runs: Sequence[SearchRun], table: MeasuredTable, entries: Sequence[FrontierEntry],
                         sizes: Sequence[int]) -> dict[int, float]:
    """Coverage of these runs' proposals if the first n entries were measured too, per n."""
    props = [c.kernel_id for _, c, _, _ in proposed(runs)]
    out = {}
    for n in sizes:
        extra = {e.child.kernel_id for e in entries[:n]}
        out[n] = sum(1 for k in props if k in table or k in extra) / len(props) if props else 1.0
    return out


def task_costs(results: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Mean measuring seconds per kernel by task, from worker result rows (time_s)."""
    sums: dict[str, list[float]] = {}
    for r in results:
        if r.get("time_s") is not None:
            sums.setdefault(r["task"], []).append(float(r["time_s"]))
    return {t: float(np.mean(v)) for t, v in sums.items()}


def frontier_records(entries: Sequence[FrontierEntry]) -> list[dict[str, Any]]:
    """Kernel batch rows (KERNEL_BATCH_SCHEMA) of the entries, lineage kept."""
    return [space.kernel_record(e.task, e.child, parent_id=e.parent) for e in entries]


def write_frontier_batch(entries: Sequence[FrontierEntry], out_dir: Path, limit: int | None = None
                         ) -> dict[str, Any]:
    """Write the frontier as kernel batches for the GPU worker.

    Files:
        <out_dir>/kernels.parquet        every entry (lineage: parent_kernel_id, mutation): the
                                         --kernels file of scripts/commit_measurements.py
        <out_dir>/neighbourhood.parquet  the first `limit` entries in priority order: the
                                         worker's --batch

    Returns:
        {"entries", "batch", "by_task": {task: n in batch}, "by_round": {round: n in batch}}
    """
    from pipelines.search.measure import write_kernel_batch

    out_dir = Path(out_dir)
    records = frontier_records(entries)
    take = records if limit is None else records[:limit]
    write_kernel_batch(records, out_dir / "kernels.parquet")
    write_kernel_batch(take, out_dir / "neighbourhood.parquet")
    by_task: dict[str, int] = {}
    by_round: dict[int, int] = {}
    for e in entries[: len(take)]:
        by_task[e.task] = by_task.get(e.task, 0) + 1
        by_round[e.first_round] = by_round.get(e.first_round, 0) + 1
    return {"entries": len(records), "batch": len(take), "by_task": by_task, "by_round": by_round}
