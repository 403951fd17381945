"""MLflow state stays in the store it was given: nothing lands in ./mlruns of the working directory."""

from __future__ import annotations

from pathlib import Path

from models.registry.tracking import log_evaluation, mlflow_experiment


def test_an_evaluation_run_writes_nothing_into_the_working_directory(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    store = tmp_path / "store"
    store.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    uri = f"sqlite:///{store / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = mlflow_experiment(client, uri, "kernelcast-evaluation")
    results = {"baseline:uniform": {"brier": 0.4375, "ece": 0.0}, "baseline:bin_prior": {"brier": 0.5, "ece": 0.3}}
    run_id = log_evaluation(uri, exp, results, "ds-test", ["p1", "p2"], [1, 8], model_ids={}, tags={"k": "v"})
    assert client.get_run(run_id).info.experiment_id == exp
    assert list(cwd.iterdir()) == []  # no ./mlruns: the reference forecasters' models live in the store
    assert not Path(cwd / "mlruns").exists()
    again = log_evaluation(uri, exp, results, "ds-test", ["p1", "p2"], [1, 8], model_ids={}, tags={})
    assert again != run_id and list(cwd.iterdir()) == []
