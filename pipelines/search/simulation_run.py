"""The search simulation as the `search_simulation` asset makes it: simulate on the warehouse's
measured table, write the report and its curves, log one MLflow run."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SearchSimulationRun:
    """What one simulation left: the report, where it was written, the MLflow run that holds it."""

    report: dict[str, Any]
    report_path: Path
    curves_path: Path
    mlflow_run_id: str

    @property
    def short_runs(self) -> list[dict[str, Any]]:
        """The runs that did not spend their whole measurement budget."""
        return [r for r in self.report["runs"] if r["measurements"] != r["budget"]]


def run_search_simulation(
    warehouse_path: str | Path,
    tracking_uri: str,
    experiment_id: str,
    home: Path,
    out_dir: Path,
    search: Any,
    dagster_run_id: str,
    progress: Callable[[int, int], None] | None = None,
) -> SearchSimulationRun:
    """Simulate every mode and seed of `search` on the measured table of its hardware.

    Args:
        warehouse_path: the DuckDB file (opened read-only, only to load the measured table).
        tracking_uri: MLflow tracking URI; `experiment_id` the search experiment in it.
        home: the state folder (registered forecasters and their weights live under it).
        out_dir: where search.json and curves.png go (logged as the run's artifact `search`).
        search: the search settings (tasks, seeds, budget, anchor, hardware_id, forecaster).
        dagster_run_id: the run tagged on the MLflow run.
        progress: called as progress(runs done, runs).
    """
    from models.registry.tracking import log_search_simulation
    from pipelines.search.forecasters import ForecasterContext
    from pipelines.search.registered import register_search_forecasters
    from pipelines.search.report import curves_figure, search_report
    from pipelines.search.simulate import SimulationPlan
    from pipelines.search.table import load_table_warehouse
    from pipelines.tasks import task_names
    from warehouse.db import connect

    register_search_forecasters()
    with connect(str(warehouse_path), read_only=True) as con:
        table = load_table_warehouse(con, search.hardware_id)
    tasks = search.tasks or tuple(t for t in task_names() if t in table.tasks())
    plan = SimulationPlan(tasks=tuple(tasks), seeds=search.seeds, budget=search.budget, anchor=search.anchor,
                          hardware_id=search.hardware_id)
    report = search_report(plan, table, search.forecaster, ForecasterContext(tracking_uri=tracking_uri, home=home),
                           progress=progress)
    out_dir.mkdir(parents=True, exist_ok=True)
    report_path, curves_path = out_dir / "search.json", out_dir / "curves.png"
    report_path.write_text(json.dumps(report, indent=1, default=str))
    curves_path.write_bytes(curves_figure(report))
    run_id = log_search_simulation(
        tracking_uri, experiment_id, report,
        params={"seeds": search.seeds, "budget": search.budget, "anchor": search.anchor, "tasks": ",".join(tasks)},
        tags={"dagster_run_id": dagster_run_id, "kind": "search_simulation", "forecaster": search.forecaster,
              "hardware_id": search.hardware_id},
        report_dir=out_dir, run_name=f"search-{search.hardware_id}-{search.forecaster}")
    return SearchSimulationRun(report, report_path, curves_path, run_id)
