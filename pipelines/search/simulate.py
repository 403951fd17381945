"""The search simulated on the measured space: every mode, several seeds, per task.

Measurements come from the measured table (`SimulatedMeasurer`), so a simulation is a
deterministic function of (plan, table, forecaster). A proposed child the table does not hold is
never skipped: forecasting it is allowed (the forecaster decides what it knows), and measuring it
costs one measurement that yields nothing ("unmeasured"); the coverage report counts both.

Per run: the curve of the best true speedup after each measurement, the final best, candidates
considered (distinct kernels proposed), forecasts spent, candidates considered per measurement,
and the share of measured candidates that improved on their parent. Per task and mode: the mean
final best over seeds with a percentile bootstrap interval of that mean.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipelines.forecasting.base import PairForecaster, RecordsForecaster
from pipelines.search.config import DEFAULT_HARDWARE, MODES, SearchConfig
from pipelines.search.driver import SearchRun, drive
from pipelines.search.forecasters import forecaster_name
from pipelines.search.measure import SimulatedMeasurer
from pipelines.search.table import MeasuredTable


@dataclass(frozen=True)
class SimulationPlan:
    """Which runs a simulation makes: tasks x modes x seeds, one budget, one forecaster."""

    tasks: tuple[str, ...]
    seeds: int = 8
    budget: int = 32
    modes: tuple[str, ...] = MODES
    anchor: str = "reference"
    batch_size: int = 2
    measure_per_parent: int = 4
    proposals_per_parent: int = 16
    admit_per_parent: int = 2
    confidence: float = 0.7
    hardware_id: str = DEFAULT_HARDWARE

    def configs(self, forecaster: str = "") -> list[SearchConfig]:
        """One config per (task, mode, seed), validated."""
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ValueError(f"unknown mode {bad[0]!r}; modes: {', '.join(MODES)}")
        if self.seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {self.seeds}")
        out = []
        for task in self.tasks:
            for mode in self.modes:
                for seed in range(self.seeds):
                    out.append(SearchConfig(
                        task=task, mode=mode, seed=seed, budget=self.budget, batch_size=self.batch_size,
                        measure_per_parent=self.measure_per_parent, proposals_per_parent=self.proposals_per_parent,
                        admit_per_parent=self.admit_per_parent, confidence=self.confidence, anchor=self.anchor,
                        hardware_id=self.hardware_id,
                        forecaster=forecaster if mode in ("filtered", "selective") else "",
                    ).validate())
        return out


def simulate(
    plan: SimulationPlan,
    table: MeasuredTable,
    forecaster: PairForecaster | None,
    progress: Callable[[int, int], None] | None = None,
    forecaster_label: str | None = None,
) -> list[SearchRun]:
    """Run every config of `plan` against `table`.

    Args:
        plan: the runs.
        table: the measured space (outcomes by kernel id).
        forecaster: used by filtered and selective runs (may be None if the plan has neither).
        progress: called as progress(runs done, runs) per task.
        forecaster_label: name recorded in the configs (default: the forecaster's name).

    Returns:
        The finished runs, in plan order.
    """
    label = forecaster_label or (forecaster_name(forecaster) if forecaster is not None else "")
    configs = plan.configs(label)
    runs: list[SearchRun] = []
    measurer = SimulatedMeasurer(table)
    if forecaster is not None:  # runs of a task propose the same kernels: one forecast per pair
        forecaster = RecordsForecaster(forecaster, remember=True)
    from threadpoolctl import threadpool_limits

    # One native thread: a forecast call is a few hundred rows, too small for OpenMP's threads to
    # pay, and on a shared host a thread that loses its core stalls every parallel region.
    with threadpool_limits(1):
        for task in plan.tasks:
            batch = [SearchRun(c, forecaster=forecaster if c.forecasts else None, features=table.features)
                     for c in configs if c.task == task]
            drive(batch, measurer)
            runs += batch
            if progress:
                progress(len(runs), len(configs))
    return runs


def run_summary(run: SearchRun) -> dict[str, Any]:
    """The numbers of one finished run (JSON-able)."""
    s, cfg = run.state, run.config
    measured = s.measured
    n = len(measured)
    return {
        "task": cfg.task, "mode": cfg.mode, "seed": cfg.seed, "forecaster": cfg.forecaster,
        "budget": cfg.budget, "measurements": s.spent,
        "root_speedup": s.best_curve[0] if s.best_curve else None,
        "final_best": s.best_curve[-1] if s.best_curve else None,
        "best_kernel_id": s.best_kernel,
        "curve": list(s.best_curve),
        "candidates_considered": len(s.considered),
        "forecasts": s.forecasts,
        "forecast_errors": s.forecast_errors,
        "considered_per_measurement": len(s.considered) / n if n else None,
        "improved_share": sum(m.improved for m in measured) / n if n else None,
        "failed": sum(m.outcome.status == "failed" for m in measured),
        "unmeasured": sum(m.outcome.status == "unmeasured" for m in measured),
        "trusted": len(s.trusted),
        "finished": s.finished,
    }


def mean_interval(values: Sequence[float], n_boot: int = 2000, level: float = 0.95, seed: int = 0
                  ) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean and a percentile bootstrap interval of it.

    >>> mean_interval([2.0, 2.0, 2.0])
    (2.0, 2.0, 2.0)
    """
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return (float("nan"),) * 3
    rng = np.random.default_rng(seed)
    means = arr[rng.integers(0, arr.size, size=(n_boot, arr.size))].mean(axis=1)
    a = (1.0 - level) / 2.0
    return float(arr.mean()), float(np.quantile(means, a)), float(np.quantile(means, 1.0 - a))


def _mean(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def aggregate(summaries: Sequence[dict[str, Any]], n_boot: int = 2000) -> dict[str, Any]:
    """The search-sim report: per task and mode, and the filtered-vs-controls counts.

    Returns:
        {"tasks": {task: {mode: {final_best_mean, final_best_lo, final_best_hi, measurements,
        candidates_considered, forecasts, considered_per_measurement, improved_share,
        root_speedup, seeds, curve_mean, unmeasured}}}, "summary": {n_tasks,
        filtered_beats_standard, filtered_beats_random, ...}}
    """
    tasks: dict[str, dict[str, Any]] = {}
    groups: dict[tuple[str, str], list[dict]] = {}
    for s in summaries:
        groups.setdefault((s["task"], s["mode"]), []).append(s)
    for (task, mode), rows in groups.items():
        finals = [r["final_best"] for r in rows if r["final_best"] is not None]
        mean, lo, hi = mean_interval(finals, n_boot=n_boot)
        curves = [r["curve"] for r in rows if r["curve"]]
        width = min(len(c) for c in curves) if curves else 0
        tasks.setdefault(task, {})[mode] = {
            "final_best_mean": mean, "final_best_lo": lo, "final_best_hi": hi,
            "measurements": _mean([r["measurements"] for r in rows]),
            "candidates_considered": _mean([r["candidates_considered"] for r in rows]),
            "forecasts": _mean([r["forecasts"] for r in rows]),
            "considered_per_measurement": _mean([r["considered_per_measurement"] for r in rows]),
            "improved_share": _mean([r["improved_share"] for r in rows]),
            "root_speedup": _mean([r["root_speedup"] for r in rows]),
            "unmeasured": _mean([r["unmeasured"] for r in rows]),
            "trusted": _mean([r["trusted"] for r in rows]),
            "seeds": len(rows),
            "curve_mean": np.mean([c[:width] for c in curves], axis=0).tolist() if curves else [],
        }
    return {"tasks": dict(sorted(tasks.items())), "summary": comparison_summary(tasks)}


def comparison_summary(tasks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Counts of tasks where filtered's mean final best is higher than standard's / random's."""

    def beats(a: str, b: str) -> list[str]:
        return sorted(t for t, modes in tasks.items() if a in modes and b in modes
                      and modes[a]["final_best_mean"] > modes[b]["final_best_mean"])

    def compared(a: str, b: str) -> int:
        return sum(1 for modes in tasks.values() if a in modes and b in modes)

    return {
        "n_tasks": len(tasks),
        "filtered_beats_standard": len(beats("filtered", "standard")),
        "filtered_beats_random": len(beats("filtered", "random")),
        "selective_beats_standard": len(beats("selective", "standard")),
        "tasks_compared": compared("filtered", "standard"),
        "tasks_filtered_beats_standard": beats("filtered", "standard"),
        "tasks_filtered_beats_random": beats("filtered", "random"),
    }
