"""The evaluation run in MLflow: it stays in the store it was given (nothing lands in ./mlruns of
the working directory), names every forecaster's metrics after it, and has the registered
versions it scored as its model inputs."""

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
    results = {"in_distribution": {"baseline:uniform": {"brier": 0.4375, "ece": 0.0},
                                   "baseline:bin_prior": {"brier": 0.5, "ece": 0.3}}}
    run_id = log_evaluation(uri, exp, results, "ds-test", ["p1", "p2"], [1, 8], model_ids={}, tags={"k": "v"})
    assert client.get_run(run_id).info.experiment_id == exp
    assert list(cwd.iterdir()) == []  # no ./mlruns: the reference forecasters' models live in the store
    assert not Path(cwd / "mlruns").exists()
    again = log_evaluation(uri, exp, results, "ds-test", ["p1", "p2"], [1, 8], model_ids={}, tags={})
    assert again != run_id and list(cwd.iterdir()) == []


def test_the_evaluation_run_names_each_forecaster_s_metrics_and_inputs_the_versions_it_scored(tmp_path):
    import mlflow
    from mlflow import MlflowClient

    from models.registry.versions import model_id_of, register_logged_model

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    training = mlflow_experiment(client, uri, "kernelcast-training")
    mlflow.set_tracking_uri(uri)
    versions = {}
    for name, kind in (("kernelcast-surrogate", "cost_model"), ("kernelcast-surrogate-held-out", "text_model")):
        model = mlflow.create_external_model(name=kind, experiment_id=training)
        versions[name] = register_logged_model(uri, f"models:/{model.model_id}", name, kind=kind)
    main, held = (f"models:/kernelcast-surrogate/{versions['kernelcast-surrogate']}",
                  f"models:/kernelcast-surrogate-held-out/{versions['kernelcast-surrogate-held-out']}")
    results = {
        "in_distribution": {"baseline:uniform": {"n": 8, "brier": 0.4375, "nll": 2.0794, "ece": 0.0},
                            main: {"n": 8, "brier": 0.30, "nll": 1.5, "ece": 0.05, "crps": float("nan")}},
        "held_out_task": {"baseline:uniform|held_out_task": {"n": 6, "brier": 0.4375}, held: {"n": 6, "brier": 0.41}},
        "held_out_style:pytorch-programs": {main: {"n": 4, "brier": 0.35, "crps": 0.2}},
    }
    model_ids = {main: model_id_of(uri, versions["kernelcast-surrogate"]),
                 held: model_id_of(uri, versions["kernelcast-surrogate-held-out"], "kernelcast-surrogate-held-out")}
    evaluation = mlflow_experiment(client, uri, "kernelcast-evaluation")
    run = client.get_run(log_evaluation(uri, evaluation, results, "ds-1", ["p1"], [3], model_ids, {}))
    v = versions["kernelcast-surrogate"]
    assert run.data.metrics == {
        "baseline-uniform/n": 8.0, "baseline-uniform/brier": 0.4375, "baseline-uniform/nll": 2.0794,
        "baseline-uniform/ece": 0.0,
        f"surrogate-{v}/n": 8.0, f"surrogate-{v}/brier": 0.30, f"surrogate-{v}/nll": 1.5, f"surrogate-{v}/ece": 0.05,
        "held_out_task/baseline-uniform/n": 6.0, "held_out_task/baseline-uniform/brier": 0.4375,
        f"held_out_task/held-out-{versions['kernelcast-surrogate-held-out']}/n": 6.0,
        f"held_out_task/held-out-{versions['kernelcast-surrogate-held-out']}/brier": 0.41,
        f"held_out_style-pytorch-programs/surrogate-{v}/n": 4.0,  # the other splits: a few metrics, no CRPS
        f"held_out_style-pytorch-programs/surrogate-{v}/brier": 0.35,
    }
    assert "brier" not in run.data.metrics  # no run-level value that is whichever forecaster came last
    # its inputs: the registered versions it scored and the reference forecaster's stand-in model
    inputs = {m.model_id for m in run.inputs.model_inputs}
    assert set(model_ids.values()) < inputs and len(inputs) == 3
    [reference] = inputs - set(model_ids.values())
    assert mlflow.get_logged_model(reference).name == "baseline-uniform"
    # each registered version's own page shows its scores from this run
    logged = mlflow.get_logged_model(model_ids[main])
    assert {m.key: m.value for m in logged.metrics} == {f"surrogate-{v}/n": 8.0, f"surrogate-{v}/brier": 0.30,
                                                         f"surrogate-{v}/nll": 1.5, f"surrogate-{v}/ece": 0.05,
                                                         f"held_out_style-pytorch-programs/surrogate-{v}/n": 4.0,
                                                         f"held_out_style-pytorch-programs/surrogate-{v}/brier": 0.35}
