"""The search-simulation report: one call that simulates and summarises, its figure and tables.

`search_report` is what the `search_simulation` asset and `kernelcast search-sim` call:
resolve the forecaster, simulate every run of the plan on the measured table, then aggregate
(per task and mode: final best with a bootstrap interval over seeds, measurements, candidates
considered, forecasts, candidates per measurement, improved share) and add the coverage.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from typing import Any

import numpy as np

from pipelines.search.config import MODES
from pipelines.search.coverage import coverage
from pipelines.search.forecasters import ForecasterContext, resolve_forecaster
from pipelines.search.simulate import SimulationPlan, aggregate, run_summary, simulate
from pipelines.search.table import MeasuredTable

MODE_LABELS = {
    "standard": "standard (4/parent, all measured)",
    "filtered": "surrogate-filtered (16 forecast, top 4 measured)",
    "random": "random-filtered (16, 4 at random)",
    "selective": "selective (confident trusted)",
}


def search_report(
    plan: SimulationPlan,
    table: MeasuredTable,
    forecaster: str,
    context: ForecasterContext | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Simulate `plan` on `table` with the named forecaster and summarise.

    Args:
        plan: tasks, seeds, budget, modes.
        table: the measured space (tasks without measurements there are refused).
        forecaster: a name `resolve_forecaster` knows ("oracle", "uniform", "bin-prior",
            "file:PATH", or a registered prefix such as "models:/...").
        context: passed to the resolver (the table is filled in).
        progress: progress(runs done, runs).

    Returns:
        aggregate()'s {"tasks", "summary"} plus "coverage", "plan", "forecaster" and "runs"
        (one summary per run, curves included).

    Raises:
        ValueError: an unknown task/forecaster, or a task with no measurement in the table.
    """
    missing = [t for t in plan.tasks if t not in table.tasks()]
    if missing:
        raise ValueError(f"no measurements of task {missing[0]!r} on {table.hardware_id or 'this hardware'}")
    ctx = dataclasses.replace(context or ForecasterContext(), table=table)
    needs = any(m in ("filtered", "selective") for m in plan.modes)
    fc = resolve_forecaster(forecaster, ctx) if needs else None
    runs = simulate(plan, table, fc, progress=progress, forecaster_label=forecaster)
    summaries = [run_summary(r) for r in runs]
    report = aggregate(summaries)
    report.update(coverage=coverage(runs, table), plan=dataclasses.asdict(plan), forecaster=forecaster,
                  hardware_id=table.hardware_id, runs=summaries)
    return report


def _band(curves: list[list[float]], n_boot: int = 500, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    arr = np.asarray(curves, dtype=np.float64)
    rng = np.random.default_rng(seed)
    boots = arr[rng.integers(0, arr.shape[0], size=(n_boot, arr.shape[0]))].mean(axis=1)
    return arr.mean(axis=0), np.quantile(boots, 0.025, axis=0), np.quantile(boots, 0.975, axis=0)


def curves_figure(report: dict[str, Any]) -> bytes:
    """PNG: per task, mean best true speedup vs GPU measurements per mode (95% bootstrap band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(report["tasks"])
    ncol = min(3, max(1, len(tasks)))
    nrow = -(-len(tasks) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.2 * nrow), squeeze=False)
    for ax, task in zip(axes.flat, tasks):
        for mode in MODES:
            curves = [r["curve"] for r in report["runs"] if r["task"] == task and r["mode"] == mode and r["curve"]]
            if not curves:
                continue
            width = min(len(c) for c in curves)
            mean, lo, hi = _band([c[:width] for c in curves])
            xs = np.arange(width)
            ax.plot(xs, mean, label=MODE_LABELS[mode], lw=1.6)
            ax.fill_between(xs, lo, hi, alpha=0.15)
        ax.set_title(task, fontsize=10)
        ax.set_xlabel("GPU measurements", fontsize=8)
        ax.set_ylabel("best speedup vs reference", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    plan = report["plan"]
    fig.suptitle(f"budgeted search, simulated on the measured space ({report.get('hardware_id') or ''}): "
                 f"forecaster {report['forecaster']}, {plan['seeds']} seeds, budget {plan['budget']}, "
                 f"anchor {plan['anchor']}; coverage {report['coverage']['coverage']:.3f}", fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def comparison_lines(report: dict[str, Any]) -> list[str]:
    """A short text table within 100 columns: per task, each mode's mean final best [interval],
    then the counts and the coverage, one line each."""
    head = f"{'task':<16}" + "".join(f"{m:>21}" for m in MODES)
    lines = [head]
    for task, modes in report["tasks"].items():
        cells = []
        for m in MODES:
            r = modes.get(m)
            cells.append(f"{r['final_best_mean']:.3f} [{r['final_best_lo']:.2f},{r['final_best_hi']:.2f}]"
                         if r else "-")
        lines.append(f"{task[:16]:<16}" + "".join(f"{c:>21}" for c in cells))
    s, cov = report["summary"], report["coverage"]
    lines.append(f"filtered beats standard on {s['filtered_beats_standard']}/{s['n_tasks']} tasks, "
                 f"random-filtered on {s['filtered_beats_random']}/{s['n_tasks']} "
                 f"({report['plan']['seeds']} seeds, budget {report['plan']['budget']})")
    lines.append(f"forecaster {report['forecaster']}: coverage {cov['coverage']:.3f} of proposed children, "
                 f"{cov['measured_coverage']:.3f} of measured ones")
    return lines


def markdown_table(report: dict[str, Any]) -> str:
    """Per task and mode: final best [95% interval], candidates considered, forecasts, improved share."""
    rows = ["| task | mode | final best | 95% interval | measurements | considered | per measurement "
            "| forecasts | improved share |", "|---|---|---|---|---|---|---|---|---|"]
    for task, modes in report["tasks"].items():
        for m, r in modes.items():
            rows.append(
                f"| {task} | {m} | {r['final_best_mean']:.3f} | [{r['final_best_lo']:.3f}, {r['final_best_hi']:.3f}] "
                f"| {r['measurements']:.0f} | {r['candidates_considered']:.1f} | {r['considered_per_measurement']:.2f} "
                f"| {r['forecasts']:.1f} | {r['improved_share']:.3f} |")
    return "\n".join(rows)


def contract_json(report: dict[str, Any]) -> dict[str, Any]:
    """The `kernelcast search-sim --json` answer: tasks -> modes -> the contract's keys (and a
    few more), the summary counts, and the coverage."""
    keys = ("final_best_mean", "final_best_lo", "final_best_hi", "measurements", "candidates_considered",
            "forecasts", "considered_per_measurement", "improved_share", "root_speedup", "seeds")
    return {
        "tasks": {t: {m: {k: r[k] for k in keys} for m, r in modes.items()} for t, modes in report["tasks"].items()},
        "summary": {k: v for k, v in report["summary"].items()},
        "coverage": {k: v for k, v in report["coverage"].items() if k != "by_task"},
        "forecaster": report["forecaster"],
        "plan": report["plan"],
    }
