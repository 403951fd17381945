"""`kernelcast search-sim` and the `search_simulation` asset, on the committed H200 measurements.

Real parts: the committed Parquet files, a DuckDB warehouse they are ingested into, a sqlite
MLflow store, an in-process Dagster materialisation.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest
from typer.testing import CliRunner

from orchestration.cli import app

REPO = Path(__file__).resolve().parents[2]
H200 = "nvidia-h200-sm90"
runner = CliRunner()


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KERNELCAST_DATA", str(REPO / "data"))
    return tmp_path / "home"


def test_search_sim_json_answers_the_contract_on_the_committed_data(home, tmp_path):
    png = tmp_path / "curves.png"
    res = runner.invoke(app, ["search-sim", "--task", "softmax", "--task", "rms_norm", "--seeds", "3", "--json",
                              "--forecaster", "oracle",
                              "--png", str(png)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out["tasks"]) == {"softmax", "rms_norm"}
    for modes in out["tasks"].values():
        assert set(modes) == {"standard", "filtered", "random", "selective"}
        for m in modes.values():
            for key in ("final_best_mean", "final_best_lo", "final_best_hi", "measurements",
                        "candidates_considered", "forecasts"):
                assert m[key] is not None, key
            assert m["final_best_lo"] <= m["final_best_mean"] <= m["final_best_hi"]
            assert m["measurements"] == out["plan"]["budget"]
        assert modes["standard"]["forecasts"] == 0 and modes["filtered"]["forecasts"] > 0
        assert modes["filtered"]["candidates_considered"] > 2 * modes["standard"]["candidates_considered"]
    s = out["summary"]
    assert s["n_tasks"] == 2 and 0 <= s["filtered_beats_standard"] <= 2 and 0 <= s["filtered_beats_random"] <= 2
    assert 0 < out["coverage"]["coverage"] <= 1 and out["source"].endswith("measurements")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args,message", [
    (["--task", "nope"], "unknown task"),
    (["--task", "softmax", "--forecaster", "crystal-ball"], "unknown forecaster"),
    (["--task", "softmax", "--anchor", "sideways"], "anchor must be"),
    (["--source", "warehouse"], "no warehouse"),
])
def test_search_sim_bad_input_is_a_one_line_error(home, args, message):
    res = runner.invoke(app, ["search-sim", *args])
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], res.output


def test_search_simulation_asset_writes_report_curves_and_an_mlflow_run(home):
    from mlflow import MlflowClient

    from assets.search import EVERY_MODE_SPENDS_THE_BUDGET, search_simulation
    from orchestration.cli_search import search_headline
    from orchestration.resources import build_resources
    from orchestration.settings import load_settings
    from warehouse.db import connect
    from warehouse.ingest import ingest_paths

    settings = load_settings("smoke")
    settings.home.mkdir(parents=True, exist_ok=True)
    with connect(settings.warehouse_path) as con:
        ingest_paths(con, sorted((REPO / "data" / "measurements" / "h200").glob("*.parquet")))
    result = dg.materialize([search_simulation], resources=build_resources(settings))
    assert result.success
    mat = result.asset_materializations_for_node("search_simulation")[0]
    meta = {k: v.value for k, v in mat.metadata.items()}
    assert meta["runs"] == 2 * 4 * settings.search.seeds and meta["forecaster"] == "oracle"
    assert 0 < meta["coverage"] <= 1
    report = json.loads(Path(meta["report"]).read_text())
    assert set(report["tasks"]) == set(settings.search.tasks)
    assert Path(meta["curves"]).read_bytes()[:4] == b"\x89PNG"
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {EVERY_MODE_SPENDS_THE_BUDGET: True}
    run = MlflowClient(tracking_uri=settings.mlflow_uri).get_run(meta["mlflow_run_id"])
    assert run.data.metrics["n_tasks"] == 2 and "softmax.filtered.final_best_mean" in run.data.metrics
    lines = search_headline(settings)
    assert lines[0] == "search simulation:" and any("filtered beats standard" in ln for ln in lines)


def test_search_sim_with_the_registered_cost_model_needs_one(home):
    res = runner.invoke(app, ["search-sim", "--task", "softmax", "--seeds", "2", "--forecaster", "kind:cost_model"])
    assert res.exit_code == 2 and "no registered version of kind 'cost_model'" in res.output
    assert "Traceback" not in res.output
