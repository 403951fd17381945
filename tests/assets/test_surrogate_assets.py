"""The surrogate in the graph: base_model -> surrogate_model -> forecasts -> reports ->
promotion gates -> model_promotion, the promotion rule, and the CLI around the registry.

Real parts: committed H200 measurements (a run of the template kernels and the first batch of
non-template ones) in a temp DuckDB file, a sqlite MLflow store, an
ephemeral Dagster instance, the tiny in-process model (smoke profile) trained with the real
warm-up + GRPO code. Promotion cases are driven by writing forecasts into the warehouse, as
the forecasts asset would, and re-running the gates and model_promotion.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from asset_runs import check_results, materialize, materialized
from typer.testing import CliRunner

from pipelines.promotion.rule import (
    GATE_BRIER,
    GATE_PARSE_RATE,
    ChallengerScores,
    PromotionPolicy,
    decide_promotion,
    gate_failures,
)

REPO = Path(__file__).resolve().parents[2]
H200 = "nvidia-h200-sm90"
NAME = "kernelcast-surrogate"


# ---- the rule, pure ------------------------------------------------------------------------
def scores(version, brier, parse_rate=1.0, n=24, common=None, champion=None):
    return ChallengerScores(version, n, parse_rate, brier, 0.4375, common, champion)


def test_rule_promotes_when_no_champion_and_gates_pass():
    d = decide_promotion([scores(1, 0.40)], champion=None)
    assert (d.promote, d.candidate, d.failures) == (1, 1, {1: []})
    assert "no champion yet" in d.reason


@pytest.mark.parametrize(
    "challenger, failed",
    [
        (scores(1, 0.30, parse_rate=0.5), [GATE_PARSE_RATE]),
        (scores(1, 0.44), [GATE_BRIER]),  # worse than uniform (0.4375)
        (scores(1, 0.30, n=0), [GATE_PARSE_RATE, GATE_BRIER]),  # nothing evaluated
        (scores(1, float("nan")), [GATE_BRIER]),
    ],
)
def test_rule_holds_a_challenger_that_fails_a_gate(challenger, failed):
    assert gate_failures(challenger) == failed
    d = decide_promotion([challenger], champion=None)
    assert d.promote is None and d.reason == "no challenger passes the gates"
    assert d.failures == {1: failed}


def test_rule_boundaries_are_inclusive():
    # Exactly the floor and exactly uniform's Brier pass.
    assert gate_failures(scores(1, 0.4375, parse_rate=0.8)) == []
    assert gate_failures(scores(1, 0.4375, parse_rate=0.79)) == [GATE_PARSE_RATE]


def test_rule_keeps_a_champion_that_is_not_beaten():
    d = decide_promotion([scores(3, 0.35, common=0.35, champion=0.30)], champion=2)
    assert d.promote is None and d.candidate == 3 and "does not beat champion 2" in d.reason
    tie = decide_promotion([scores(3, 0.30, common=0.30, champion=0.30)], champion=2)
    assert tie.promote is None  # a tie keeps the champion
    margin = decide_promotion([scores(3, 0.29, common=0.29, champion=0.30)], 2, PromotionPolicy(min_brier_gain=0.05))
    assert margin.promote is None


def test_rule_replaces_a_beaten_champion_and_picks_the_best_eligible():
    cs = [
        scores(4, 0.20, parse_rate=0.1, common=0.20, champion=0.33),  # best Brier but fails the floor
        scores(5, 0.31, common=0.31, champion=0.33),
        scores(6, 0.30, common=0.30, champion=0.33),
    ]
    d = decide_promotion(cs, champion=2)
    assert (d.promote, d.candidate) == (6, 6) and "beats champion 2" in d.reason
    assert d.failures[4] == [GATE_PARSE_RATE]
    # Already champion; champion never scored on the same pairs: nothing changes.
    assert decide_promotion([scores(2, 0.3)], champion=2).promote is None
    blind = decide_promotion([scores(7, 0.1)], champion=2)
    assert blind.promote is None and "has no forecasts" in blind.reason
    assert decide_promotion([], champion=None).reason == "no challengers"


# ---- the graph, end to end -------------------------------------------------------------------
EVALUATE_AND_PROMOTE = ("forecasts", "calibration_report", "utility_report", "model_promotion")


# Measurements enough for every split the tests read, not the whole committed set: one H200 run
# of the template kernels (in distribution, held-out task) and the first non-template batch (the
# external split); the committed training runs as they are.
SUBSET = ("kernels-2026-11-29-harness1.parquet", "results-2026-11-29-harness1-run-b.parquet",
          "kernels-2026-12-02-nontemplate.parquet", "results-2026-12-02-nontemplate-a.parquet",
          "results-2026-12-02-nontemplate-b.parquet", "results-2026-12-02-nontemplate-c.parquet")


def _data_subset(root: Path) -> Path:
    import shutil

    (root / "measurements" / "h200").mkdir(parents=True)
    for name in SUBSET:
        shutil.copy(REPO / "data" / "measurements" / "h200" / name, root / "measurements" / "h200" / name)
    for entry in (REPO / "data").iterdir():
        if entry.name != "measurements":
            (root / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    return root


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """A subset of the committed data ingested and curated, then base_model, surrogate_model (one smoke
    variant on the tiny model), forecasts, reports, gates and promotion materialised."""
    from orchestration.definitions import build_defs
    from orchestration.settings import load_settings

    home = tmp_path_factory.mktemp("surrogate") / "home"
    data = _data_subset(tmp_path_factory.mktemp("surrogate-data"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNELCAST_HOME", str(home))
        mp.setenv("KERNELCAST_DATA", str(data))
        mp.setenv("KERNELCAST_SURROGATE_LLM", "grpo")  # the GRPO path (the smoke default is supervised)
        settings = load_settings("smoke")
        defs = build_defs(settings)
        instance = dg.DagsterInstance.ephemeral()
        instance.add_dynamic_partitions("hardware", [H200])
        assert materialize(defs, dg.AssetSelection.assets("kernel_tasks"), instance).success
        assert materialize(defs, dg.AssetSelection.assets("kernel_measurements"), instance, H200).success
        selection = dg.AssetSelection.assets("curated_pairs", "eval_set", "rl_training_pool", "discovery_pairs",
                                             "base_model", "surrogate_model", *EVALUATE_AND_PROMOTE)
        result = materialize(defs, selection, instance)
        yield settings, defs, instance, result


@pytest.mark.slow
def test_base_and_surrogate_are_built_registered_and_traced(graph):
    import mlflow
    from mlflow import MlflowClient

    from warehouse.db import connect

    settings, _, _, result = graph
    checks = check_results(result)
    assert checks["base_model_loads"] and checks["tokenizer_round_trips"]
    assert checks["surrogate_registered_with_lineage"]
    assert {"base_model", "surrogate_model", "forecasts", "calibration_report"} <= materialized(result)
    assert (settings.home / "models" / "tiny" / "config.json").is_file()

    client = MlflowClient(settings.mlflow_uri, registry_uri=settings.mlflow_uri)
    # registered as @challenger; promotion then keeps that alias only on an eligible version
    mv = client.get_model_version(NAME, "1")
    assert mv.tags["reward"] == "correctness+brier" and mv.tags["prompt_style"] == "compact"
    assert mv.tags["base_model"] == "tiny" and mv.tags["training_batch"] == result.run_id
    run = client.get_run(mv.run_id)
    from warehouse.datasets import pair_measurement_ids, read_pairs

    with connect(settings.warehouse_path, read_only=True) as con:
        version = con.execute("SELECT dataset_version FROM dataset_versions").fetchall()[0][0]
        lineage = con.sql("SELECT * FROM model_lineage").pl().to_dicts()
        n_meas = con.execute("SELECT count(*) FROM dataset_measurements WHERE dataset_version = ?", [version]).fetchall()[0][0]
        behind_training = pair_measurement_ids(con, version, read_pairs(con, version, "train"))
    assert run.data.tags["dagster_run_id"] == result.run_id
    assert run.data.tags["dataset_version"] == version and len(run.data.tags["git_commit"]) == 40
    assert [i.dataset.name for i in run.inputs.dataset_inputs] == [version]
    ids = Path(mlflow.artifacts.download_artifacts(run_id=mv.run_id, artifact_path="measurement_ids.txt",
                                                   tracking_uri=settings.mlflow_uri)).read_text().split()
    assert ids == behind_training and 0 < len(ids) <= n_meas  # its training pairs' measurements, not the version's
    assert [(r["model_name"], r["model_version"], r["dataset_version"], r["mlflow_run_id"], r["dagster_run_id"])
            for r in lineage] == [(NAME, "1", version, mv.run_id, result.run_id)]


@pytest.mark.slow
def test_forecasts_hold_the_challenger_on_the_capped_eval_subset(graph):
    from warehouse.db import connect

    settings, _, _, _ = graph
    with connect(settings.warehouse_path, read_only=True) as con:
        rows = con.sql(
            "SELECT f.*, p.split FROM forecasts f JOIN pairs p USING (pair_id) WHERE model_ref = ?",
            params=[f"models:/{NAME}/1"],
        ).pl()
    # the capped eval subset, and the external pairs (the committed non-template kernels) capped alike
    assert rows.height == 2 * settings.surrogate.eval_pairs == 24
    assert set(rows["split"]) == {"eval"} and rows["parse_ok"].all()  # logprob readout always parses
    assert all(math.isclose(sum(r), 1.0, abs_tol=1e-6) for r in rows.select([f"p{i}" for i in range(1, 9)]).rows())
    report = json.loads(next(settings.reports_dir.rglob("metrics.json")).read_text())
    assert report[f"models:/{NAME}/1"]["n"] == 12


def _forecasts_run(settings, defs, tmp_path, gpus: int) -> tuple[pl.DataFrame, dict, object]:
    """`forecasts` materialised with `gpus` forecasting steps, from an empty forecast cache (every
    forward pass made): one step in process, several on the multiprocess executor, as
    `kernelcast run` runs them. Returns (the LLM rows written, the asset's metadata, the run)."""
    import shutil

    from dagster._core.definitions.reconstruct import ReconstructableRepository

    from warehouse.datasets import current_dataset_version
    from warehouse.db import connect
    from warehouse.forecasts import read_forecast_listing

    shutil.rmtree(settings.home / "forecast-cache", ignore_errors=True)
    with connect(settings.warehouse_path) as con:
        con.execute("DELETE FROM forecasts WHERE model_ref NOT LIKE 'baseline:%'")
    if gpus == 1:
        run = materialize(defs, dg.AssetSelection.assets("forecasts"), dg.DagsterInstance.ephemeral())
        instance = None
    else:  # the step processes load the code location from the environment, as under `dagster dev`
        (tmp_path / "dagster").mkdir()
        instance = dg.DagsterInstance.local_temp(str(tmp_path / "dagster"))
        job = ReconstructableRepository.for_module("orchestration.definitions", "defs", working_directory=str(REPO)) \
            .get_reconstructable_job("downstream_job")
        run = dg.execute_job(job, instance, run_config={"execution": {"config": {"multiprocess": {"max_concurrent": gpus}}}},
                             asset_selection=[dg.AssetKey("forecasts")], raise_on_error=False)
    mat = next(e for e in run.get_asset_materialization_events() if e.asset_key.to_user_string() == "forecasts")
    meta = {k: getattr(v, "value", v) for k, v in mat.step_materialization_data.materialization.metadata.items()}
    with connect(settings.warehouse_path, read_only=True) as con:
        listing = read_forecast_listing(con, current_dataset_version(con))
        here = [f["model_ref"] for f in listing["forecasters"] if f["source"] == "forecast here"]
        rows = con.sql("SELECT * FROM forecasts WHERE list_contains(?, model_ref) ORDER BY model_ref, pair_id",
                       params=[here]).pl()
    return rows, meta, (run, instance)


@pytest.mark.slow
def test_forecasts_sharded_over_two_steps_equal_one_step(graph, tmp_path, monkeypatch):
    """Two fake GPUs on a CPU host: the LLM versions' pairs split into two shards, forecast by
    two step processes side by side, merged before the write, give the rows one step gives."""
    settings, defs, _, _ = graph
    monkeypatch.setenv("KERNELCAST_PROFILE", "smoke")  # what the step processes load
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("KERNELCAST_GPUS", "1")
    one, one_meta, _ = _forecasts_run(settings, defs, tmp_path, gpus=1)
    monkeypatch.setenv("KERNELCAST_GPUS", "2")
    two, two_meta, (run, instance) = _forecasts_run(settings, defs, tmp_path, gpus=2)
    assert run.success, [e.message for e in run.all_events if e.is_failure]
    assert one.height >= settings.surrogate.eval_pairs and one_meta["forecasting_steps"] == 1
    assert two_meta["forecasting_steps"] == 2 and two_meta["llm_rows"] == one_meta["llm_rows"] == one.height
    shards = two_meta["shards"]
    assert "| 0 | 0 | cpu |" in shards and "| 1 | 1 | cpu |" in shards  # step i saw CUDA_VISIBLE_DEVICES=i
    # every forecast made by a model, none from the cache the first run filled
    passes = [int(line.split("|")[5]) for line in shards.splitlines()[2:]]
    assert sum(passes) == one.height and min(passes) > 0
    pids = {e.step_key: e.dagster_event.pid for e in instance.all_logs(run.run_id)
            if e.dagster_event_type == dg.DagsterEventType.STEP_START and "forecast_llm_shard" in (e.step_key or "")}
    assert sorted(pids) == ["forecasts.forecast_llm_shard[gpu_0]", "forecasts.forecast_llm_shard[gpu_1]"]
    assert len(set(pids.values())) == 2
    assert two.select("model_ref", "pair_id").equals(one.select("model_ref", "pair_id"))
    p_cols = [f"p{i}" for i in range(1, 9)]
    assert two.select(p_cols).to_numpy() == pytest.approx(one.select(p_cols).to_numpy(), abs=1e-6)
    assert two["predicted_bin"].to_list() == one["predicted_bin"].to_list()


@pytest.mark.slow
def test_gates_and_promotion_agree_with_the_rule(graph):
    """Whatever the tiny model scored, the checks and model_promotion follow pipelines.promotion.rule."""
    from models.registry.versions import alias_version

    settings, _, _, result = graph
    checks = check_results(result)
    assert "challenger_parse_rate_above_floor" in checks and checks["challenger_parse_rate_above_floor"]
    eligible = checks["challenger_brier_not_worse_than_uniform"]
    # model_promotion always runs and records its decision: version 1 (no champion before)
    # is promoted when it passes the gates, held back otherwise; the run succeeds either way.
    assert "model_promotion" in materialized(result) and result.success
    assert alias_version(settings.mlflow_uri, "champion") == (1 if eligible else None)
    meta = _promotion_metadata(result)
    assert meta["outcome"] == ("promoted" if eligible else "held_back")


def _promotion_metadata(run) -> dict:
    mat = next(e for e in run.get_asset_materialization_events() if e.asset_key.to_user_string() == "model_promotion")
    return {k: getattr(v, "value", v) for k, v in mat.step_materialization_data.materialization.metadata.items()}


def _check_severities(run) -> dict[str, str]:
    return {ev.event_specific_data.check_name: ev.event_specific_data.severity.value for ev in run.all_events
            if ev.event_type_value == "ASSET_CHECK_EVALUATION" and not ev.event_specific_data.passed}


def _write_surrogate_forecasts(settings, version: int, quality: str) -> None:
    """Forecasts of `version` on the eval pairs forecast by version 1: 'good' puts 0.65 on the
    true bin, 'fair' 0.4, 'bad' puts 0.9 on a wrong bin (worse than uniform)."""
    from warehouse.db import connect
    from warehouse.forecasts import write_forecasts

    with connect(settings.warehouse_path) as con:
        pairs = con.sql(
            "SELECT p.pair_id, p.true_bin FROM forecasts f JOIN pairs p USING (pair_id) WHERE f.model_ref = ?",
            params=[f"models:/{NAME}/1"],
        ).pl()
        rows = []
        for pair_id, y in pairs.iter_rows():
            peak, target = {"good": (0.65, y), "fair": (0.4, y), "bad": (0.9, 1 if y != 1 else 8)}[quality]
            p = [(1 - peak) / 7] * 8
            p[target - 1] = peak
            rows.append({"pair_id": pair_id, "model_ref": f"models:/{NAME}/{version}", "parse_ok": True,
                         "predicted_bin": target, "argmax_bin": target, "p": p, "raw_sum": 1.0})
        write_forecasts(con, pl.DataFrame(rows))


def _register_challenger(settings, batch: str) -> int:
    """A new version from version 1's adapter, as the next training batch's challenger."""
    from mlflow import MlflowClient

    from models.registry.versions import register_surrogate, resolve_surrogate

    client = MlflowClient(settings.mlflow_uri, registry_uri=settings.mlflow_uri)
    v1 = client.get_model_version(NAME, "1")
    local = resolve_surrogate(settings.mlflow_uri, f"models:/{NAME}/1", settings.home / f"adapter-{batch}")
    return register_surrogate(settings.mlflow_uri, v1.run_id, local, base_model="tiny", alias="challenger",
                              tags={"training_batch": batch, "reward": "correctness+brier"}, prompt_style="compact",
                              base_model_path=settings.home / "models" / "tiny")


def _promote_again(defs, instance):
    # Only the evaluation and promotion assets: forecasts are written by the test.
    selection = dg.AssetSelection.assets("calibration_report", "utility_report", "model_promotion")
    return materialize(defs, selection, instance)


@pytest.mark.slow
def test_promotion_passes_then_holds_a_worse_challenger_then_a_failing_one(graph):
    from models.registry.versions import alias_version, set_alias

    settings, defs, instance, _ = graph
    uri = settings.mlflow_uri
    # (1) Version 1 scores well and there is no champion: it passes the gates and is promoted.
    set_alias(uri, "challenger", 1)
    _write_surrogate_forecasts(settings, 1, "good")
    from mlflow import MlflowClient

    client = MlflowClient(uri, registry_uri=uri)
    if alias_version(uri, "champion") is not None:
        client.delete_registered_model_alias(NAME, "champion")
    run = _promote_again(defs, instance)
    assert run.success and check_results(run)["challenger_brier_not_worse_than_uniform"]
    assert "model_promotion" in materialized(run)
    assert alias_version(uri, "champion") == 1

    # (2) A challenger better than uniform but worse than the champion: gates pass, no change.
    v2 = _register_challenger(settings, "batch-2")
    _write_surrogate_forecasts(settings, v2, "fair")
    run = _promote_again(defs, instance)
    assert run.success and check_results(run)["challenger_brier_not_worse_than_uniform"]
    meta = _promotion_metadata(run)
    assert meta["outcome"] == "kept" and "does not beat champion 1" in meta["reason"]
    assert alias_version(uri, "champion") == 1 and alias_version(uri, "challenger") == v2

    # (3) A challenger worse than uniform, alone: held back. A decision, not a failure: the
    # gate check warns, model_promotion runs and records it, the run succeeds.
    from warehouse.db import connect

    with connect(settings.warehouse_path) as con:  # only v3 competes with the champion now
        con.execute("DELETE FROM forecasts WHERE model_ref = ?", [f"models:/{NAME}/{v2}"])
    v3 = _register_challenger(settings, "batch-3")
    _write_surrogate_forecasts(settings, v3, "bad")
    run = _promote_again(defs, instance)
    assert run.success and "model_promotion" in materialized(run)
    assert check_results(run)["challenger_brier_not_worse_than_uniform"] is False
    assert _check_severities(run) == {"challenger_brier_not_worse_than_uniform": "WARN"}
    meta = _promotion_metadata(run)
    assert meta["outcome"] == "held_back" and str(v3) in meta["versions"]
    assert alias_version(uri, "champion") == 1
    assert client.get_model_version(NAME, str(v3)).tags["promotion_status"] == "held back: brier_not_worse_than_uniform"
    with connect(settings.warehouse_path, read_only=True) as con:
        outcomes = [r[0] for r in con.execute("SELECT outcome FROM promotion_decisions WHERE alias = 'champion' "
                                              "ORDER BY decided_at").fetchall()]
    assert outcomes[-3:] == ["promoted", "kept", "held_back"]


@pytest.mark.slow
def test_versions_of_any_kind_compete_on_the_same_pairs(graph):
    """A version of another kind (a cost model forecasting every eval pair) is weighed like the
    LLM versions: on the pairs every version forecast, by the same gates and rule, on every split."""
    from models.registry.versions import alias_version, register_logged_model
    from warehouse.db import connect
    from warehouse.forecasts import write_forecasts

    settings, defs, instance, _ = graph
    uri = settings.mlflow_uri
    champion = alias_version(uri, "champion")
    # A stand-in for a classical forecaster's logged model: an external LoggedModel.
    import mlflow

    mlflow.set_tracking_uri(uri)
    external = mlflow.create_external_model(name="cost-model-test", experiment_id=_store_experiment(uri))
    version = register_logged_model(uri, f"models:/{external.model_id}", NAME, kind="cost_model")
    with connect(settings.warehouse_path) as con:
        pairs = con.sql("SELECT pair_id, true_bin FROM pairs WHERE split = 'eval' AND dataset_version = "
                        "(SELECT dataset_version FROM dataset_versions ORDER BY created_at DESC LIMIT 1)").pl()
        # in distribution and, as every version is weighed on it too, source only (metadata withheld)
        rows = [{"pair_id": pid, "model_ref": f"models:/{NAME}/{version}{twin}", "parse_ok": True, "predicted_bin": y,
                 "argmax_bin": y, "p": [0.93 if b == y else 0.01 for b in range(1, 9)], "raw_sum": 1.0}
                for pid, y in pairs.iter_rows() for twin in ("", "|source_only")]
        write_forecasts(con, pl.DataFrame(rows))
    run = _promote_again(defs, instance)
    meta = _promotion_metadata(run)
    # Weighed like the LLM versions and better than the champion in distribution and source only, but
    # promotion weighs every split: with no forecasts of the external pairs (the committed non-template
    # kernels) it is kept out.
    assert run.success and meta["outcome"] == "kept" and "not on external" in meta["reason"], meta["reason"]
    assert f"version {version} beats champion {champion}" in meta["reason"]
    assert "cost_model" in meta["versions"]
    # Compared on the pairs every version forecast: the LLM versions' capped subset, not all eval pairs.
    assert meta["common_eval_pairs"] == settings.surrogate.eval_pairs < pairs.height
    assert alias_version(uri, "champion") == champion != version


def _store_experiment(uri: str) -> str:
    """An experiment whose artifacts live beside the store (the default one's go to ./mlruns)."""
    from mlflow import MlflowClient

    from models.registry.tracking import mlflow_experiment

    return mlflow_experiment(MlflowClient(uri), uri, "kernelcast-training")


@pytest.mark.slow
def test_wrong_forecasts_block_promotion(graph):
    """Forecasts that are not distributions are wrong data: the blocking check on `forecasts`
    stops the run before model_promotion moves any alias."""
    import mlflow

    from models.registry.versions import alias_version, register_logged_model, set_alias
    from warehouse.db import connect

    settings, defs, instance, _ = graph
    uri = settings.mlflow_uri
    set_alias(uri, "champion", 1)  # an LLM champion: the forecasts asset forecasts it again
    mlflow.set_tracking_uri(uri)
    external = mlflow.create_external_model(name="broken-test", experiment_id=_store_experiment(uri))
    broken = register_logged_model(uri, f"models:/{external.model_id}", NAME, kind="cost_model")
    _write_surrogate_forecasts(settings, broken, "good")
    with connect(settings.warehouse_path) as con:
        con.execute("UPDATE forecasts SET p1 = 5.0 WHERE model_ref = ?", [f"models:/{NAME}/{broken}"])
    run = materialize(defs, dg.AssetSelection.assets(*EVALUATE_AND_PROMOTE), instance)
    assert check_results(run)["registered_forecasts_are_distributions"] is False
    assert not run.success and materialized(run) == {"forecasts"}  # reports and promotion held back
    assert alias_version(uri, "champion") == 1


# ---- the CLI around the registry -------------------------------------------------------------
@pytest.mark.slow
def test_forecast_cli_answers_from_the_champion(graph, tmp_path, monkeypatch):
    from models.registry.versions import alias_version, clear_alias, set_alias
    from orchestration.cli import app

    settings, _, _, _ = graph
    set_alias(settings.mlflow_uri, "champion", 1)
    clear_alias(settings.mlflow_uri, "champion-external")  # else files are answered by that champion
    monkeypatch.setenv("KERNELCAST_HOME", str(settings.home))
    anchor, cand = tmp_path / "a.py", tmp_path / "c.py"
    # correct softmax kernels: the command refuses files that are not kernels of the task
    anchor.write_text("import torch\n\n\ndef custom_kernel(data):\n    return torch.softmax(data[0].float(), -1).bfloat16()\n")
    cand.write_text("import torch\n\n\ndef custom_kernel(data):\n    return torch.softmax(data[0], -1)\n")
    res = CliRunner().invoke(app, ["forecast", "--task", "softmax", "--anchor", str(anchor), "--candidate", str(cand),
                                   "--profile", "smoke", "--json"])
    assert res.exit_code == 0, res.output
    (out,) = json.loads(res.stdout[res.stdout.index("["):])
    assert out["model_uri"] == f"models:/{NAME}@champion" and out["model_version"] == 1
    assert out["source"].startswith("registered surrogate") and out["style"] == "compact"
    assert out["parse_ok"] and math.isclose(sum(out["p"]), 1.0, abs_tol=1e-6)

    # Manual promotion, then the CLI follows the alias; a missing version is a one-line error.
    promoted = CliRunner().invoke(app, ["promote", "--version", "2", "--profile", "smoke", "--json"])
    assert promoted.exit_code == 0, promoted.output
    assert json.loads(promoted.stdout) == {"model": NAME, "alias": "champion", "version": 2, "previous": 1}
    assert alias_version(settings.mlflow_uri, "champion") == 2
    missing = CliRunner().invoke(app, ["promote", "--version", "99", "--profile", "smoke"])
    assert missing.exit_code == 2 and "has no version 99" in missing.output
    res = CliRunner().invoke(app, ["forecast", "--task", "softmax", "--anchor", str(anchor), "--candidate", str(cand),
                                   "--profile", "smoke", "--json"])
    # It follows the alias to version 2: its answer, or (when version 2 is the weightless stand-in a test
    # above registers) a one-line refusal naming it.
    if res.exit_code == 0:
        assert json.loads(res.stdout[res.stdout.index("["):])[0]["model_version"] == 2
    else:
        assert res.output.strip().count("\n") == 0 and f"{NAME}/2" in res.output, res.output
