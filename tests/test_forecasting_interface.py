"""One forecasting interface: every kind through `load_forecaster` gives the numbers of the
path it replaces, and `kernelcast forecast` on files refuses what it cannot forecast."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from test_forecasting_models import toy_pairs

from models.classical import CostModel, TextModel
from models.classical.features import side_records
from pipelines.forecasting import CHAMPION_EXTERNAL, file_champion_uri, load_forecaster

P = [f"p{i}" for i in range(1, 9)]


def _pairs_and_kernels(n: int, seed: int) -> tuple[pl.DataFrame, dict, object, np.ndarray]:
    """The toy pairs as (pairs frame, kernel records, pair frame, true bins)."""
    frame, y, _ = toy_pairs(n, seed)
    anchors, cands = side_records(frame, "a"), side_records(frame, "c")
    kernels = {r["kernel_id"]: r for r in anchors + cands}
    pairs = pl.DataFrame({"pair_id": [f"pair-{i}" for i in range(n)], "anchor_kernel_id": [a["kernel_id"] for a in anchors],
                          "candidate_kernel_id": [c["kernel_id"] for c in cands], "task": ["softmax"] * n,
                          "hardware_id": ["nvidia-h200-sm90"] * n, "true_bin": y.tolist()})
    return pairs, kernels, frame, y


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture(scope="module")
def classical(uri):
    """A registered cost model and text model of the toy rule: {kind: (version, model)}."""
    from models.classical.registry import log_classical

    fit, y, l2 = toy_pairs(200, 0)
    cal, y_cal, _ = toy_pairs(60, 1)
    out = {}
    for kind, model in (("cost_model", CostModel(max_iter=30)), ("text_model", TextModel())):
        model.fit(fit, y, l2)
        model.calibrate(cal, y_cal)
        _, version = log_classical(model, uri, fit.head(4), "kernelcast-surrogate", "ds-test", "in_distribution")
        out[kind] = (version, model)
    return out


@pytest.mark.parametrize("kind", ["cost_model", "text_model"])
def test_a_classical_version_forecasts_as_its_model_does(uri, classical, kind):
    from models.classical.registry import load_classical
    from pipelines.training.classical import forecast_rows

    version, model = classical[kind]
    pairs, kernels, frame, _ = _pairs_and_kernels(30, 3)
    for ref in (f"models:/kernelcast-surrogate/{version}", f"kind:{kind}"):
        f = load_forecaster(ref, tracking_uri=uri)
        assert (f.kind, f.model_ref, f.needs_metadata) == (kind, f"models:/kernelcast-surrogate/{version}", False)
        got = f.forecast_pairs(pairs, kernels)
        assert got.shape == (30, 8) and np.array_equal(got, model.predict_proba(frame))
    # the evaluation's rows of today, number for number
    old = forecast_rows(load_classical(uri, "kernelcast-surrogate", version), pairs, kernels, f.model_ref)
    new = f.forecast_rows(pairs, kernels)
    assert new["pair_id"].to_list() == old["pair_id"].to_list()
    assert np.array_equal(new.select(P).to_numpy(), old.select(P).to_numpy())
    assert new["predicted_bin"].to_list() == old["predicted_bin"].to_list()


def test_records_without_generator_metadata_are_forecast(uri, classical):
    pairs, kernels, _, _ = _pairs_and_kernels(10, 4)
    bare = {k: {f: v for f, v in r.items() if f not in ("algorithm", "knobs_json", "generator")} for k, r in kernels.items()}
    for kind in ("cost_model", "text_model"):
        p = load_forecaster(f"kind:{kind}", tracking_uri=uri).forecast_pairs(pairs, bare)
        assert p.shape == (10, 8) and np.allclose(p.sum(axis=1), 1)


def test_the_search_hook_is_the_same_forecast(uri, classical):
    version, model = classical["cost_model"]
    pairs, kernels, frame, _ = _pairs_and_kernels(8, 5)
    f = load_forecaster(f"models:/kernelcast-surrogate/{version}", tracking_uri=uri)
    anchor = kernels[pairs["anchor_kernel_id"][0]]
    cands = [kernels[c] for c in pairs["candidate_kernel_id"]]
    assert np.array_equal(f.predict_kernels(anchor, cands, "h"), model.predict_kernels(anchor, cands, "h"))


def test_references_are_the_baselines(classical):
    from models import baselines
    from models.bins import BIN_LOG2_VALUES, speedups_to_bins

    pairs, _, _, _ = _pairs_and_kernels(12, 6)
    speedups = 2.0 ** np.array([*BIN_LOG2_VALUES, *BIN_LOG2_VALUES[:4]])  # every bin
    speed = pairs.drop("true_bin").with_columns(pl.Series("speedup", speedups))  # what the baselines read
    pairs = pairs.with_columns(pl.Series("true_bin", speedups_to_bins(speedups)))
    training = pl.DataFrame({"task": ["softmax"] * 5 + ["rmsnorm"] * 3, "true_bin": [1, 2, 2, 8, 5, 3, 3, 3]})
    expect = {"baseline:uniform": baselines.uniform_forecasts(speed),
              "baseline:bin_prior": baselines.bin_prior_forecasts(speed, training),
              "baseline:oracle": baselines.oracle_forecasts(speed)}
    for ref, old in expect.items():
        f = load_forecaster(ref, training_pairs=training)
        assert f.kind == "baseline" and f.model_ref == ref and f.needs_metadata is False
        assert np.array_equal(f.forecast_pairs(pairs, {}), old.select(P).to_numpy()), ref
    assert len(set(pairs["true_bin"].to_list())) == 8  # the oracle is checked on every bin
    assert np.array_equal(load_forecaster("baseline:oracle").forecast_pairs(speed, {}),
                          expect["baseline:oracle"].select(P).to_numpy())  # from the speedup alone too
    with pytest.raises(ValueError, match="training pairs"):
        load_forecaster("baseline:bin_prior")
    with pytest.raises(ValueError, match="true_bin"):
        load_forecaster("baseline:oracle").forecast_pairs(pairs.drop("true_bin"), {})
    with pytest.raises(ValueError, match="unknown reference"):
        load_forecaster("baseline:median")


def _committed_run(folder, pairs: pl.DataFrame, y: np.ndarray) -> None:
    """A committed run folder of one variant: raw forecasts of calibration and eval pairs."""
    rng = np.random.default_rng(0)
    rows = []
    for role in ("calibration", "eval"):
        for r, b in zip(pairs.iter_rows(named=True), y, strict=True):
            p = rng.dirichlet(np.ones(8)) * 0.5
            p[b - 1] += 0.5
            rows.append({"variant": "lora", "role": role, "readout": "logprob", "pair_id": f"old-{r['pair_id']}",
                         "hardware_id": r["hardware_id"], "anchor_kernel_id": r["anchor_kernel_id"],
                         "candidate_kernel_id": r["candidate_kernel_id"], "repeat": 0, "parse_ok": True,
                         "true_bin": int(b), **{c: float(v) for c, v in zip(P, p, strict=True)}})
    folder.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows).write_parquet(folder / "forecasts.parquet")
    (folder / "training.json").write_text(json.dumps({"variants": {"lora": {"settings": {"style": "compact"}}}}))


def test_committed_forecasts_answer_the_pairs_they_hold(tmp_path, uri):
    from models.registry import set_version_tag
    from pipelines.training.committed import calibrated_variants

    pairs, kernels, _, y = _pairs_and_kernels(10, 7)
    _committed_run(tmp_path / "run", pairs.head(8), y[:8])
    (old,) = calibrated_variants(tmp_path / "run", pairs, pairs.head(0))
    f = load_forecaster("h200:lora", committed_dir=tmp_path / "run")
    assert (f.kind, f.model_ref) == ("llm", "h200:lora")
    assert f.covers(pairs).tolist() == [True] * 8 + [False] * 2
    assert np.array_equal(f.forecast_pairs(pairs.head(8), {}), old.forecasts.sort("pair_id").select(P).to_numpy()
                          [np.argsort(np.argsort(pairs.head(8)["pair_id"].to_list()))])
    rows = f.forecast_rows(pairs, {})
    assert rows.height == 8 and set(rows["model_ref"]) == {"h200:lora"}
    with pytest.raises(ValueError, match="holds no forecast of 2 of the 10 pairs"):
        f.forecast_pairs(pairs, {})
    with pytest.raises(ValueError, match="no committed variant 'full'"):
        load_forecaster("h200:full", committed_dir=tmp_path / "run")
    # A registered LLM version carrying the variant answers from the committed forecasts.
    version = _register_llm_version(uri, tmp_path)
    set_version_tag(uri, version, "committed_variant", "lora")
    g = load_forecaster(f"models:/kernelcast-surrogate/{version}", tracking_uri=uri, committed_dir=tmp_path / "run")
    assert g.model_ref == f"models:/kernelcast-surrogate/{version}"
    assert np.array_equal(g.forecast_pairs(pairs.head(8), {}), f.forecast_pairs(pairs.head(8), {}))


def _register_llm_version(uri: str, tmp_path, calibrator: dict | None = None) -> int:
    """A registered LLM surrogate: a LoRA adapter with non-zero B on the tiny model."""
    import torch
    from mlflow import MlflowClient
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from models.registry import register_surrogate
    from models.tiny import build_tiny_model
    from models.tracking import mlflow_experiment

    tiny = build_tiny_model(tmp_path / "tiny")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(tiny)),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    model.save_pretrained(str(tmp_path / "adapter"))
    PreTrainedTokenizerFast.from_pretrained(str(tiny)).save_pretrained(str(tmp_path / "adapter"))
    client = MlflowClient(uri)
    run = client.create_run(mlflow_experiment(client, uri, "kernelcast-training"))
    client.set_terminated(run.info.run_id)
    tags = {"calibrator": json.dumps(calibrator)} if calibrator else {}
    return register_surrogate(uri, run.info.run_id, tmp_path / "adapter", base_model=str(tiny), dataset_version="ds-test",
                              tags=tags, prompt_style="compact")


def test_file_champion_prefers_the_external_alias(uri, classical):
    from mlflow import MlflowClient

    from models.registry import set_alias

    cost, text = classical["cost_model"][0], classical["text_model"][0]
    set_alias(uri, "champion", cost)
    assert file_champion_uri(uri) == "models:/kernelcast-surrogate@champion"
    MlflowClient(uri, registry_uri=uri).set_registered_model_alias("kernelcast-surrogate", CHAMPION_EXTERNAL, str(text))
    assert file_champion_uri(uri) == f"models:/kernelcast-surrogate@{CHAMPION_EXTERNAL}"
    assert load_forecaster(file_champion_uri(uri), tracking_uri=uri).kind == "text_model"
    assert file_champion_uri(None) is None


def test_a_registered_llm_forecasts_as_the_evaluation_and_the_old_command_did(tmp_path):
    """Same prompts (the training row builder's), same calibrator, same numbers."""
    from models.backends import ForecastRequest
    from models.calibration import Calibrator
    from models.surrogate import registered_forecaster
    from models.training import build_training_rows
    from pipelines.evaluation.lm_forecasts import prompt_source
    from pipelines.tasks import get_task
    from pipelines.training.llm_shards import LlmJob, _calibrated_rows

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cal = {"temperature": 1.7, "bias": [0.3, -0.2, 0.0, 0.1, 0.0, 0.0, -0.1, 0.2], "objective": "nll", "n_fit": 9}
    version = _register_llm_version(uri, tmp_path, cal)
    pairs, kernels, _, _ = _pairs_and_kernels(3, 8)
    f = load_forecaster(f"models:/kernelcast-surrogate/{version}", tracking_uri=uri, home=tmp_path / "home", cache=False)
    assert (f.kind, f.model_ref, f.style) == ("llm", f"models:/kernelcast-surrogate/{version}", "compact")
    task = get_task("softmax")
    shown = {k: prompt_source("softmax", r["source"], r["generator"]) for k, r in kernels.items()}  # the row builder's
    rows = build_training_rows(pairs, shown,
                               {"softmax": {"description": task.description,
                                            "benchmark_cases": [dict(c) for c in task.benchmark_cases]}},
                               {"nvidia-h200-sm90": f.hardware("nvidia-h200-sm90")}, style="compact")
    assert [r["prompt"] for r in f.requests(pairs, kernels)] == [r["prompt"] for r in rows]
    backend, _ = registered_forecaster(uri, version, tmp_path / "home")
    answers = backend.forecast([ForecastRequest(r["prompt"], r["pair_id"]) for r in rows])
    old = _calibrated_rows(LlmJob("m", "compact", tuple(rows), calibrator=cal), answers)
    new = f.forecast_rows(pairs, kernels)
    assert np.allclose(new.select(P).to_numpy(), old.select(P).to_numpy(), atol=1e-12)
    assert new["parse_ok"].to_list() == old["parse_ok"].to_list()
    assert np.allclose(f.forecast_pairs(pairs, kernels), old.select(P).to_numpy(), atol=1e-12)
    records = f.forecast_records(pairs, kernels)
    want = Calibrator.from_dict(cal).apply([list(a.p) for a in answers])
    assert all(r.parse_ok for r in records)
    assert np.allclose([r.p for r in records], want, atol=1e-12)
