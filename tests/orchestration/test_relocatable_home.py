"""$KERNELCAST_HOME moves: a home built in one folder, copied elsewhere and the original deleted,
forecasts, reports and promotes from the copy, and reads nothing of the old place (MLflow's
artifact locations are relative to the home, Dagster's storage is named through $DAGSTER_HOME)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from typer.testing import CliRunner

from models.registry import HOME_ARTIFACT_ROOT
from tests.forecasting.test_forecasting_models import toy_pairs

NAME = "kernelcast-surrogate"
REPO = Path(__file__).resolve().parents[2]


def _locations(tracking_uri: str) -> list[str]:
    """Every artifact location the store holds, read through MLflow: its experiments', runs',
    logged models' and model versions'."""
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    exps = client.search_experiments(view_type=ViewType.ALL)
    ids = [e.experiment_id for e in exps]
    runs = client.search_runs(ids, run_view_type=ViewType.ALL)
    models = client.search_logged_models(ids)
    versions = client.search_model_versions()
    return ([e.artifact_location for e in exps if e.experiment_id != "0"] + [r.info.artifact_uri for r in runs]
            + [m.artifact_location for m in models] + [v.source for v in versions])


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
    built = _build_home(old)
    before = _locations(built.mlflow_uri)
    assert before and all(loc.startswith(HOME_ARTIFACT_ROOT) for loc in before
                          if not loc.startswith("models:/")), before  # no absolute path of the first home
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
    locations = _locations(settings.mlflow_uri)
    assert locations and not any(str(old) in loc for loc in locations)
    assert not old.exists()
    from mlflow import MlflowClient

    from models.registry.tracking import log_training_data, mlflow_experiment

    client = MlflowClient(settings.mlflow_uri)
    run = client.create_run(mlflow_experiment(client, settings.mlflow_uri, "kernelcast-training"))
    log_training_data(settings.mlflow_uri, run.info.run_id, "ds-home", ["m-1"])
    assert client.get_run(run.info.run_id).info.artifact_uri.startswith(HOME_ARTIFACT_ROOT + "/")
    assert list((new / "mlartifacts").rglob("measurement_ids.txt"))
    # The Dagster instance of the copy holds the run made before the move.
    with dg.DagsterInstance.get() as instance:
        assert instance.root_directory == str(new / "dagster") and len(instance.get_runs()) == 1
    assert not old.exists()


def test_a_copied_store_reads_and_writes_its_own_artifacts(tmp_path):
    """The store alone (no home around it): copied, the original deleted, its run's artifact is
    read from the copy and a new one lands there; the rows are the same before and after."""
    from models.registry.tracking import mlflow_experiment, tracking_client

    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    uri = f"sqlite:///{first / 'mlflow.db'}"
    client = tracking_client(uri)
    run = client.create_run(mlflow_experiment(client, uri, "kernelcast-training"))
    client.log_text(run.info.run_id, "m-1\n", "measurement_ids.txt")
    assert list((first / "mlartifacts").rglob("measurement_ids.txt"))
    rows = _locations(uri)
    shutil.copytree(first, second)
    shutil.rmtree(first)

    # A new process opens the copy, as after a move (MLflow caches a run's artifact repository
    # per run id for the life of a process).
    moved = f"sqlite:///{second / 'mlflow.db'}"
    script = ("import sys, mlflow; from models.registry.tracking import tracking_client; "
              "c = tracking_client(sys.argv[1]); print(mlflow.artifacts.load_text(f'runs:/{sys.argv[2]}/measurement_ids.txt'), end=''); "
              "c.log_text(sys.argv[2], 'later', 'later.txt')")
    done = subprocess.run([sys.executable, "-c", script, moved, run.info.run_id], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "m-1\n"
    assert [p.read_text() for p in (second / "mlartifacts").rglob("later.txt")] == ["later"]
    assert not first.exists() and _locations(moved) == rows


def test_a_home_location_needs_a_home_store():
    """A `kernelcast-home:` location read without a home's sqlite store, or climbing out of the
    home, is refused with a one-line error."""
    from mlflow.exceptions import MlflowException

    from models.registry.home_artifacts import resolve

    assert resolve("kernelcast-home:/mlartifacts/1/r/artifacts", "sqlite:////h/mlflow.db") == \
        "file:///h/mlartifacts/1/r/artifacts"
    with pytest.raises(MlflowException, match="is not a home's sqlite"):
        resolve("kernelcast-home:/mlartifacts/1", "http://127.0.0.1:5000")
    with pytest.raises(MlflowException, match="outside the home"):
        resolve("kernelcast-home:/mlartifacts/../../etc", "sqlite:////h/mlflow.db")


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
