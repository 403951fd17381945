"""`run_search_simulation` without Dagster: the committed H200 measurements in a real DuckDB file,
a real sqlite MLflow store."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow import MlflowClient

from models.registry.tracking import prepare_store
from orchestration.settings import SearchSettings
from pipelines.search.simulation_run import run_search_simulation
from warehouse.db import connect
from warehouse.ingest import ingest_paths

REPO = Path(__file__).resolve().parents[2]


def test_the_simulation_writes_its_report_and_logs_one_run(tmp_path):
    db, uri = tmp_path / "warehouse.duckdb", f"sqlite:///{tmp_path / 'mlflow.db'}"
    with connect(db) as con:
        ingest_paths(con, sorted((REPO / "data" / "measurements" / "h200").glob("*.parquet")))
    (experiment,) = prepare_store(uri, ["kernelcast-search"])
    search = SearchSettings(tasks=("softmax",), seeds=2, budget=8, forecaster="oracle")
    seen = []
    sim = run_search_simulation(db, uri, experiment, tmp_path, tmp_path / "out", search, "dagster-run-1",
                                progress=lambda done, n: seen.append((done, n)))
    assert seen == [(8, 8)] and len(sim.report["runs"]) == 8 and sim.short_runs == []
    assert json.loads(sim.report_path.read_text())["summary"]["n_tasks"] == 1
    assert sim.curves_path.read_bytes()[:4] == b"\x89PNG"
    run = MlflowClient(tracking_uri=uri).get_run(sim.mlflow_run_id)
    assert run.info.run_name == "search-nvidia-h200-sm90-oracle"
    assert run.data.tags["dagster_run_id"] == "dagster-run-1" and run.data.tags["kind"] == "search_simulation"
    assert run.data.params == {"seeds": "2", "budget": "8", "anchor": "reference", "tasks": "softmax"}
    mode = sim.report["tasks"]["softmax"]["filtered"]
    assert run.data.metrics["softmax.filtered.final_best_mean"] == mode["final_best_mean"]
    assert run.data.metrics["coverage"] == sim.report["coverage"]["coverage"]
    artifacts = {a.path for a in MlflowClient(tracking_uri=uri).list_artifacts(sim.mlflow_run_id, "search")}
    assert artifacts == {"search/search.json", "search/curves.png"}
