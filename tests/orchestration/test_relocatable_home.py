"""$KERNELCAST_HOME moves: a home built in one folder, copied elsewhere and the original deleted,
forecasts, reports and promotes from the copy, and reads nothing of the old place (MLflow's
artifact locations are re-rooted on open, Dagster's storage is named through $DAGSTER_HOME)."""

from __future__ import annotations

import json
import shutil
import sqlite3

import dagster as dg
import pytest
from typer.testing import CliRunner

from models.registry.tracking import reroot_artifacts
from tests.forecasting.test_forecasting_models import toy_pairs

NAME = "kernelcast-surrogate"


def _locations(db) -> list[str]:
    """Every artifact location MLflow's sqlite store holds."""
    with sqlite3.connect(db) as con:
        return [v for sql in ("SELECT artifact_location FROM experiments", "SELECT artifact_uri FROM runs",
                              "SELECT artifact_location FROM logged_models", "SELECT storage_location FROM model_versions")
                for (v,) in con.execute(sql) if v]


@dg.asset
def tiny_asset() -> int:
    return 1


def _build_home(home):
    """A home as a run leaves it: a registered cost model with its run's artifacts, a report
    table, and a run in the Dagster instance."""
    from models.classical import CostModel
    from models.classical.registry import log_classical
    from orchestration.runner import prepare_home
    from orchestration.settings import load_settings
    from pipelines.evaluation.forecaster_table import TABLE_FILE
    from warehouse.datasets import register_dataset_version
    from warehouse.db import connect

    settings = load_settings("smoke", home=home)
    prepare_home(settings)
    fit, y, l2 = toy_pairs(150, 0)
    model = CostModel(max_iter=20).fit(fit, y, l2)
    model.calibrate(*toy_pairs(40, 1)[:2])
    log_classical(model, settings.mlflow_uri, fit.head(4), NAME, "ds-home", "in_distribution", measurement_ids=[])
    with connect(settings.warehouse_path) as con:
        register_dataset_version(con, "ds-home", "c" * 64, {}, [])
    row = {"name": "baseline:uniform", "kind": "baseline", "split": "in_distribution", "n": 8, "brier": 0.4375,
           "brier_lo": 0.4, "brier_hi": 0.5, "ece": 0.0, "recovered_mean": 0.5}
    (settings.reports_dir / "ds-home").mkdir(parents=True)
    (settings.reports_dir / "ds-home" / TABLE_FILE).write_text(json.dumps(
        {"dataset_version": "ds-home", "held_out_task": None, "forecasters": [row]}))
    with dg.DagsterInstance.get() as instance:
        assert dg.materialize([tiny_asset], instance=instance).success
    return settings


@pytest.mark.slow
def test_a_copied_home_forecasts_reports_and_promotes_with_the_original_gone(tmp_path, monkeypatch):
    from orchestration.cli import app
    from orchestration.settings import load_settings

    old, new = tmp_path / "first", tmp_path / "moved" / "home"
    monkeypatch.setenv("KERNELCAST_HOME", str(old))
    monkeypatch.setenv("DAGSTER_HOME", str(old / "dagster"))
    _build_home(old)
    assert any(str(old) in loc for loc in _locations(old / "mlflow.db"))  # MLflow stores absolute paths
    shutil.copytree(old, new)
    shutil.rmtree(old)

    monkeypatch.setenv("KERNELCAST_HOME", str(new))
    monkeypatch.setenv("DAGSTER_HOME", str(new / "dagster"))
    settings = load_settings("smoke")
    anchor, cand = tmp_path / "a.py", tmp_path / "c.py"
    anchor.write_text("def custom_kernel(data):\n    return data[0] * 2\n")
    cand.write_text("def custom_kernel(data):\n    return data[0] + data[0]\n")
    res = CliRunner().invoke(app, ["forecast", "--task", "softmax", "--anchor", str(anchor), "--candidate", str(cand),
                                   "--model", f"models:/{NAME}/1", "--profile", "smoke", "--json", "--allow-incorrect"])
    assert res.exit_code == 0, res.output
    (out,) = json.loads(res.stdout[res.stdout.index("["):])
    assert out["kind"] == "cost_model" and abs(sum(out["p"]) - 1) < 1e-6
    rep = CliRunner().invoke(app, ["report", "--profile", "smoke", "--json"])
    assert rep.exit_code == 0, rep.output
    assert json.loads(rep.stdout)["forecasters"][0]["name"] == "baseline:uniform"
    promoted = CliRunner().invoke(app, ["promote", "--version", "1", "--profile", "smoke", "--json"])
    assert promoted.exit_code == 0, promoted.output
    assert json.loads(promoted.stdout)["version"] == 1

    # Nothing points at the old place; new runs write under the copy.
    locations = _locations(new / "mlflow.db")
    assert locations and not any(str(old) in loc for loc in locations)
    assert all(loc.startswith((new / "mlartifacts").as_uri()) for loc in locations
               if "mlartifacts" in loc), locations
    assert not old.exists()
    from mlflow import MlflowClient

    from models.registry.tracking import log_training_data, mlflow_experiment

    client = MlflowClient(settings.mlflow_uri)
    run = client.create_run(mlflow_experiment(client, settings.mlflow_uri, "kernelcast-training"))
    log_training_data(settings.mlflow_uri, run.info.run_id, "ds-home", ["m-1"])
    assert (new / "mlartifacts").as_uri() in client.get_run(run.info.run_id).info.artifact_uri
    assert list((new / "mlartifacts").rglob("measurement_ids.txt"))
    # The Dagster instance of the copy holds the run made before the move.
    with dg.DagsterInstance.get() as instance:
        assert instance.root_directory == str(new / "dagster") and len(instance.get_runs()) == 1
    assert not old.exists()


def test_reroot_rewrites_only_locations_inside_another_mlartifacts(tmp_path):
    from mlflow import MlflowClient

    from models.registry.tracking import mlflow_experiment

    store = tmp_path / "a"
    store.mkdir()
    uri = f"sqlite:///{store / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = mlflow_experiment(client, uri, "kernelcast-training")
    client.create_run(exp)
    assert reroot_artifacts(uri) == 0  # already its own
    moved = tmp_path / "b"
    shutil.copytree(store, moved)
    moved_uri = f"sqlite:///{moved / 'mlflow.db'}"
    with sqlite3.connect(moved / "mlflow.db") as con:  # a location outside any mlartifacts/ stays
        con.execute("UPDATE runs SET artifact_uri = 'file:///elsewhere/runs/x'")
    assert reroot_artifacts(moved_uri) == 1  # the experiment's location
    locs = _locations(moved / "mlflow.db")
    assert (moved / "mlartifacts").as_uri() in locs and "file:///elsewhere/runs/x" in locs
    assert not any(str(store) in loc for loc in locs)
    assert reroot_artifacts(moved_uri) == 0


def test_the_default_experiment_is_retired_once_ours_exists(tmp_path):
    from mlflow import MlflowClient

    from models.registry.tracking import mlflow_experiment, prepare_store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ids = prepare_store(uri)
    client = MlflowClient(uri)
    names = [e.name for e in client.search_experiments()]
    assert sorted(names) == ["kernelcast-evaluation", "kernelcast-training"]  # no Default
    assert mlflow_experiment(client, uri, "kernelcast-training") == ids[0]


def test_run_links_follow_the_ui_port(monkeypatch):
    from models.registry.tracking import MLFLOW_PORT_ENV, experiments_url, run_url

    monkeypatch.delenv(MLFLOW_PORT_ENV, raising=False)
    assert run_url("r1") == "http://127.0.0.1:5000/#/runs/r1?workflowType=machine_learning"
    monkeypatch.setenv(MLFLOW_PORT_ENV, "5123")
    assert run_url("r1", "4") == "http://127.0.0.1:5123/#/experiments/4/runs/r1?workflowType=machine_learning"
    assert experiments_url() == "http://127.0.0.1:5123/#/experiments?workflowType=machine_learning"
    monkeypatch.setenv(MLFLOW_PORT_ENV, "not-a-port")
    assert run_url("r1").startswith("http://127.0.0.1:5000/")
