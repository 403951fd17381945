"""calibration_report, utility_report and model_promotion on a warehouse written by hand (as the
forecasts asset would): every split's page and table, the empty external split named, and
promotion weighing source_only. Real parts: a DuckDB file, a sqlite MLflow store, Dagster in
process; the forecasts are written, not made, so nothing is trained."""

from __future__ import annotations

import json

import dagster as dg
import polars as pl
import pytest
from asset_runs import materialize, materialized

from models.bins import speedup_to_bin

NAME = "kernelcast-surrogate"
P = [f"p{i}" for i in range(1, 9)]


def _peaked(y: int, peak: float) -> list[float]:
    p = [(1 - peak) / 7] * 8
    p[y - 1] = peak
    return p


@pytest.mark.slow
def test_reports_and_promotion_over_the_splits(tmp_path, monkeypatch):
    import mlflow

    from models.registry.tracking import mlflow_experiment
    from models.registry.versions import alias_version, register_logged_model
    from orchestration.definitions import build_defs
    from orchestration.settings import load_settings
    from warehouse.datasets import write_dataset
    from warehouse.db import connect
    from warehouse.forecasts import write_forecast_listing, write_forecasts

    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KERNELCAST_LIBRARY_DIR", raising=False)
    settings = load_settings("smoke")
    uri = settings.mlflow_uri
    mlflow.set_tracking_uri(uri)
    experiment = mlflow_experiment(mlflow.MlflowClient(uri), uri, "kernelcast-training")
    versions = [register_logged_model(uri, f"models:/{mlflow.create_external_model(name=f'm{i}', experiment_id=experiment).model_id}",
                                      NAME, kind="cost_model") for i in range(2)]
    v1, v2 = versions
    pairs = []
    for i in range(32):
        s = 2.0 ** ((i % 8) - 3.5)
        pairs.append({"pair_id": f"p{i:02d}", "task": "softmax" if i % 2 else "rms_norm", "hardware_id": "h",
                      "anchor_kernel_id": "ref", "candidate_kernel_id": f"k{i}", "speedup": s,
                      "true_bin": speedup_to_bin(s), "pair_type": "reference", "split": "eval"})
    pairs = pl.DataFrame(pairs)
    rows = []
    for pid, y in pairs.select("pair_id", "true_bin").rows():
        for ref, p in (("baseline:uniform", [1 / 8] * 8), ("baseline:oracle", _peaked(y, 1.0)),
                       (f"models:/{NAME}/{v1}", _peaked(y, 0.5)), (f"models:/{NAME}/{v1}|source_only", _peaked(y, 0.4)),
                       (f"models:/{NAME}/{v2}", _peaked(y, 0.7)),  # better in distribution ...
                       (f"models:/{NAME}/{v2}|source_only", _peaked(y, 0.2))):  # ... worse from source alone
            rows.append({"pair_id": pid, "model_ref": ref, "parse_ok": True, "predicted_bin": int(max(range(8), key=p.__getitem__)) + 1,
                         "p": p, "raw_sum": 1.0})
    settings.warehouse_path.parent.mkdir(parents=True, exist_ok=True)
    with connect(settings.warehouse_path) as con:
        write_dataset(con, "ds-t", "d", {}, [], pairs)
        write_forecasts(con, pl.DataFrame(rows))
    folder = settings.reports_dir / "ds-t"
    folder.mkdir(parents=True)
    ids = pairs["pair_id"].to_list()
    listing = {"held_out_task": None, "pairs": {"in_distribution": ids, "source_only": ids, "held_out_task": [], "external": []},
               "empty": {"held_out_task": "no held-out task", "external": "no kernel outside the templates"},
               "forecasters": [{"model_ref": r, "kind": "baseline", "split": s, "source": "reference", "run_id": ""}
                               for r in ("baseline:uniform", "baseline:oracle") for s in ("in_distribution", "source_only")]}
    with connect(settings.warehouse_path) as con:
        write_forecast_listing(con, "ds-t", listing)

    defs = build_defs(settings)
    instance = dg.DagsterInstance.ephemeral()
    run = materialize(defs, dg.AssetSelection.assets("calibration_report", "utility_report", "model_promotion"), instance)
    assert run.success, [e.message for e in run.all_events if e.is_failure]
    assert materialized(run) == {"calibration_report", "utility_report", "model_promotion"}
    table = json.loads((folder / "forecasters.table.json").read_text())
    assert set(table["pages"]) == {"in_distribution", "source_only"} and table["report"] == "reports/ds-t/index.html"
    assert table["empty_splits"] == {"held_out_task": "no held-out task", "external": "no kernel outside the templates"}
    assert table["evaluation_run_id"] and f"/runs/{table['evaluation_run_id']}" in table["evaluation_run_url"]
    by = {(r["split"], r["name"]): r for r in table["forecasters"]}
    assert by[("source_only", f"models:/{NAME}/{v2}")]["brier"] > by[("source_only", f"models:/{NAME}/{v1}")]["brier"]
    assert "source_only/index.html" in (folder / "index.html").read_text()
    # no champion before: the better in-distribution version is promoted; @champion-external (on
    # source_only while external is empty) goes to the one better from source alone
    assert alias_version(uri, "champion", NAME) == v2
    assert alias_version(uri, "champion-external", NAME) == v1
    # the report was written before promotion decided: the decision lands beside it for its pages
    promo = json.loads((folder / "promotion.js").read_text().split(" = ", 1)[1].rstrip(";\n"))
    assert promo["aliases"][f"models:/{NAME}/{v2}"] == ["champion", "challenger-external"]
    assert "No promotion decision yet" in (folder / "index.html").read_text()  # what was known when written
    # the evaluation run: each forecaster's numbers under its name, every split, the versions as inputs
    from mlflow import MlflowClient

    run = MlflowClient(uri).get_run(table["evaluation_run_id"])
    assert {f"surrogate-{v1}/brier", f"surrogate-{v2}/brier", "baseline-uniform/brier", f"source_only/surrogate-{v2}/brier",
            "source_only/baseline-oracle/brier"} <= set(run.data.metrics) and "brier" not in run.data.metrics
    assert run.data.metrics[f"surrogate-{v2}/brier"] == pytest.approx(by[("in_distribution", f"models:/{NAME}/{v2}")]["brier"])
    from models.registry.versions import model_id_of

    assert {model_id_of(uri, v1), model_id_of(uri, v2)} <= {m.model_id for m in run.inputs.model_inputs}

    # a third version, better in distribution than the champion but worse on source_only, is kept out
    v3 = register_logged_model(uri, f"models:/{mlflow.create_external_model(name='m3', experiment_id=experiment).model_id}",
                               NAME, kind="text_model")
    with connect(settings.warehouse_path) as con:
        write_forecasts(con, pl.DataFrame([{**r, "model_ref": r["model_ref"].replace(f"/{v2}", f"/{v3}"),
                                            "p": _peaked(y, 0.8 if "|" not in r["model_ref"] else 0.15)}
                                           for r, y in zip(rows, [y for y in pairs["true_bin"].to_list() for _ in range(6)])
                                           if r["model_ref"].startswith(f"models:/{NAME}/{v2}")]))
    run = materialize(defs, dg.AssetSelection.assets("calibration_report", "utility_report", "model_promotion"), instance)
    assert run.success
    assert alias_version(uri, "champion", NAME) == v2
    mat = next(e for e in run.get_asset_materialization_events() if e.asset_key.to_user_string() == "model_promotion")
    meta = {k: getattr(v, "value", v) for k, v in mat.step_materialization_data.materialization.metadata.items()}
    assert meta["outcome"] == "kept" and "not on source_only" in meta["reason"]


def test_promotion_refuses_a_missing_listing(tmp_path, monkeypatch):
    from orchestration.definitions import build_defs
    from orchestration.settings import load_settings
    from warehouse.datasets import write_dataset
    from warehouse.db import connect
    from warehouse.forecasts import write_forecasts

    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    settings = load_settings("smoke")
    settings.warehouse_path.parent.mkdir(parents=True, exist_ok=True)
    pairs = pl.DataFrame([{"pair_id": "p0", "task": "softmax", "hardware_id": "h", "anchor_kernel_id": "ref",
                           "candidate_kernel_id": "k", "speedup": 1.0, "true_bin": speedup_to_bin(1.0),
                           "pair_type": "reference", "split": "eval"}])
    with connect(settings.warehouse_path) as con:
        write_dataset(con, "ds-t", "d", {}, [], pairs)
        write_forecasts(con, pl.DataFrame([{"pair_id": "p0", "model_ref": "baseline:uniform", "parse_ok": True,
                                            "predicted_bin": 1, "p": [1 / 8] * 8, "raw_sum": 1.0}]))
    run = materialize(build_defs(settings), dg.AssetSelection.assets("model_promotion"), dg.DagsterInstance.ephemeral())
    assert not run.success
    failures = [e.message for e in run.all_events if e.is_failure]
    assert any("no forecaster listing" in (m or "") for m in failures) or any(
        "no forecaster listing" in str(e.event_specific_data) for e in run.all_events if e.is_step_failure)
