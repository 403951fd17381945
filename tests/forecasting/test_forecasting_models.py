"""Supervised distributional training, calibration and the classical forecasters, on toy data
where the right answer is known (a knob decides the speedup)."""

from __future__ import annotations

import json
import random

import numpy as np
import pandas as pd
import pytest
from supervised_toy import BLOCKS, toy_rows

from models.bins import speedup_to_bin
from models.calibration import Calibrator, fit_calibrator
from models.classical import CostModel, TextModel
from models.classical.features import FeatureSpace, kernel_features, pair_frame
from models.training.supervised import length_batches, ordinal_targets


def _brier(p: np.ndarray, y: np.ndarray) -> float:
    return float(0.5 * ((p - np.eye(8)[y - 1]) ** 2).sum(axis=1).mean())


def toy_pairs(n: int, seed: int) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Pairs (reference anchor, candidate with a BLOCK knob); log2 S grows with the knob."""
    rng = random.Random(seed)
    anchor = {"kernel_id": "ref", "task": "softmax", "source": "def ref_kernel(x): return x.softmax(-1)\n",
              "language": "pytorch", "generator": "reference", "algorithm": "reference", "knobs_json": "{}"}
    cands, log2s = [], []
    for i in range(n):
        b = rng.choice(BLOCKS)
        warps = rng.choice((2, 4, 8))
        log2s.append(-2.4 + 0.7 * BLOCKS.index(b) + rng.gauss(0, 0.1))
        cands.append({"kernel_id": f"k{seed}-{i}", "task": "softmax", "language": "triton",
                      "generator": "kernelcast-space", "algorithm": "two_pass",
                      "knobs_json": json.dumps({"BLOCK_N": b, "NUM_WARPS": warps}, sort_keys=True),
                      "source": f"BLOCK_N = {b}\nNUM_WARPS = {warps}\n@triton.jit\ndef k(x):\n    tl.load(x)\n"})
    frame = pair_frame([anchor] * n, cands)
    log2s = np.array(log2s)
    return frame, np.array([speedup_to_bin(2.0**v) for v in log2s]), log2s


# ---- features -------------------------------------------------------------------------------

def test_kernel_features_read_knobs_and_source_and_survive_bad_json():
    f = kernel_features({"task": "t", "algorithm": "a", "knobs_json": '{"BLOCK_N": 64, "mode": "x"}',
                         "source": "tl.load(a)\ntl.store(b)\n", "n_regs": 40})
    assert f["knob:BLOCK_N"] == 64.0 and f["knob:mode"] == "x" and f["n_regs"] == 40.0
    assert f["src:tl_load"] == 1 and f["src:tl_store"] == 1
    broken = kernel_features({"task": "t", "knobs_json": "{not json", "source": None})
    assert not any(k.startswith("knob:") for k in broken) and np.isnan(broken["n_regs"])


def test_feature_space_keeps_only_varying_columns_and_unseen_categories_are_missing():
    frame, _, _ = toy_pairs(40, 0)
    frame.loc[frame.index[::2], "c_algorithm"] = "one_pass"  # two families
    space = FeatureSpace().fit(frame)
    table = space.transform(frame)
    assert {"c:knob:BLOCK_N", "c:family"} <= set(table.columns)
    assert "c:n_regs" not in table.columns  # never known in the fit pairs: left out
    assert "d:knob:BLOCK_N" not in table.columns  # the reference anchor has no knobs: no difference
    other = frame.copy()
    other["c_algorithm"] = "never_seen"
    assert space.transform(other)["c:family"].isna().all()


# ---- supervised loss --------------------------------------------------------------------------

def test_ordinal_targets_sum_to_one_and_stay_on_neighbours():
    import torch

    t = ordinal_targets(torch.tensor([1, 5, 8]), 0.2)
    assert torch.allclose(t.sum(dim=1), torch.ones(3))
    assert t[1, 4] == pytest.approx(0.8) and t[1, 3] == pytest.approx(0.1) and t[1, 5] == pytest.approx(0.1)
    assert t[0, 1] == pytest.approx(0.2) and t[2, 6] == pytest.approx(0.2)  # edges: one neighbour


def test_length_batches_cover_every_row_once_within_the_budget():
    lengths = [random.Random(1).randint(1, 90) for _ in range(200)]
    batches = length_batches(lengths, 256)
    assert sorted(i for b in batches for i in b) == list(range(200))
    assert all(len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 256 for b in batches)


@pytest.mark.slow
def test_supervised_loss_lowers_held_out_loss_and_a_resumed_run_ends_the_same(tmp_path, monkeypatch):
    import time

    from safetensors.torch import load_file

    from models.training.supervised import SupervisedSettings, train_supervised

    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    train, held = toy_rows(192, 0), toy_rows(64, 1)
    settings = SupervisedSettings(base_model="tiny", learning_rate=3e-3, epochs=4, patience=0,
                                  tokens_per_batch=2048, warmup_steps=5)
    whole = train_supervised(settings, train, held, tmp_path / "a")
    first, last = whole.history[0]["calibration_nll"], whole.history[-1]["calibration_nll"]
    assert last < first - 0.2  # it learned the toy rule, on rows it never trained on
    assert whole.history[-1]["calibration_accuracy"] > 0.25  # chance is 0.125
    # Stopped by the clock and resumed: the same weights as the uninterrupted run.
    result = train_supervised(settings, train, held, tmp_path / "b", tmp_path / "ck", stop_at=time.time())
    assert not result.finished
    while not result.finished:
        result = train_supervised(settings, train, held, tmp_path / "b", tmp_path / "ck", stop_at=time.time() + 1.5)
    a, b = load_file(tmp_path / "a/best/model.safetensors"), load_file(tmp_path / "b/best/model.safetensors")
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)


# ---- calibration ------------------------------------------------------------------------------

def test_calibrator_flattens_an_overconfident_forecaster_and_never_worsens_its_fit():
    rng = np.random.default_rng(0)
    y = rng.integers(1, 9, 600)
    guess = np.where(rng.random(600) < 0.4, y, rng.integers(1, 9, 600))
    p = np.full((600, 8), 0.005)
    p[np.arange(600), guess - 1] = 0.965
    cal = fit_calibrator(p[:300], y[:300])
    assert cal.temperature > 1.5
    assert _brier(cal.apply(p[300:]), y[300:]) < _brier(p[300:], y[300:]) - 0.1  # on pairs it never saw
    assert Calibrator.from_dict(cal.to_dict()) == cal
    assert fit_calibrator(np.zeros((0, 8)), []).is_identity
    with pytest.raises(ValueError):
        fit_calibrator(p[:3], [1, 2, 9])


# ---- classical forecasters ---------------------------------------------------------------------

@pytest.mark.parametrize("model", [CostModel(max_iter=60), TextModel(C=8.0)])
def test_classical_forecasters_learn_the_toy_rule_and_calibrate(model):
    fit, y_fit, l_fit = toy_pairs(400, 0)
    cal, y_cal, _ = toy_pairs(120, 1)
    test, y_test, _ = toy_pairs(200, 2)
    model.fit(fit, y_fit, l_fit)
    model.calibrate(cal, y_cal)
    p = model.predict_proba(test)
    assert p.shape == (200, 8) and np.allclose(p.sum(axis=1), 1.0)
    assert _brier(p, y_test) < 0.25  # uniform scores 0.4375
    assert (model.predict(test) == y_test).mean() > 0.5
    one = model.predict_kernels(dict(zip(["kernel_id", "task"], ["ref", "softmax"])) | {"generator": "reference"},
                                [{"kernel_id": "x", "task": "softmax", "algorithm": "two_pass", "generator": "kernelcast-space",
                                  "knobs_json": '{"BLOCK_N": 2048, "NUM_WARPS": 4}', "source": "BLOCK_N = 2048\nNUM_WARPS = 4\n"}],
                                "h")
    assert one.shape == (1, 8) and int(one.argmax()) + 1 >= 6  # the fastest block is a high bin


def test_cost_model_needs_log2_speedup():
    fit, y, _ = toy_pairs(20, 0)
    with pytest.raises(ValueError, match="log2"):
        CostModel().fit(fit, y)


@pytest.mark.slow
def test_a_registered_classical_model_loads_back_and_forecasts_identically(tmp_path):
    from models.classical.registry import load_classical, log_classical
    from models.registry.versions import version_info

    fit, y, l2 = toy_pairs(200, 0)
    cal, y_cal, _ = toy_pairs(60, 1)
    model = CostModel(max_iter=30).fit(fit, y, l2)
    model.calibrate(cal, y_cal)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id, version = log_classical(model, uri, fit.head(4), "kernelcast-surrogate", "ds-test", "in_distribution",
                                    metrics={"fit_pairs": 200})
    info = version_info(uri, version)
    assert info["tags"]["kind"] == "cost_model" and info["tags"]["split"] == "in_distribution"
    back = load_classical(uri, "kernelcast-surrogate", version)
    test, _, _ = toy_pairs(50, 3)
    assert np.array_equal(back.predict_proba(test), model.predict_proba(test))
    import mlflow

    pyfunc = mlflow.pyfunc.load_model(f"models:/kernelcast-surrogate/{version}")
    assert np.allclose(np.asarray(pyfunc.predict(test)), model.predict_proba(test))


@pytest.mark.slow
def test_the_search_resolves_a_registered_cost_model_and_fills_compile_features(tmp_path):
    from models.classical.registry import log_classical
    from pipelines.search.forecasters import ForecasterContext, resolve_forecaster
    from pipelines.search.registered import register_search_forecasters

    fit, y, l2 = toy_pairs(200, 0)
    model = CostModel(max_iter=30).fit(fit, y, l2)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _, version = log_classical(model, uri, fit.head(4), "kernelcast-surrogate", "ds-test", "in_distribution")
    register_search_forecasters()
    ctx = ForecasterContext(tracking_uri=uri, home=tmp_path)
    for name in ("kind:cost_model", f"models:/kernelcast-surrogate/{version}"):
        f = resolve_forecaster(name, ctx)
        p = f.predict_kernels({"kernel_id": "ref", "task": "softmax", "generator": "reference"},
                              [{"kernel_id": "x", "task": "softmax", "algorithm": "two_pass", "generator": "kernelcast-space",
                                "knobs_json": '{"BLOCK_N": 2048, "NUM_WARPS": 4}', "source": "BLOCK_N = 2048\n"}], "h")
        assert p.shape == (1, 8) and abs(p.sum() - 1) < 1e-9
    with pytest.raises(ValueError, match="no registered version"):
        resolve_forecaster("kind:text_model", ctx)


@pytest.mark.slow
def test_export_forecaster_writes_the_registered_cost_model_as_a_portable_file(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from models.classical.registry import log_classical
    from orchestration.cli import app
    from pipelines.search.forecasters import load_forecaster_file

    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    from orchestration.settings import load_settings

    settings = load_settings()
    fit, y, l2 = toy_pairs(200, 0)
    model = CostModel(max_iter=30).fit(fit, y, l2)
    log_classical(model, settings.mlflow_uri, fit.head(4), "kernelcast-surrogate", "ds-test", "in_distribution")
    out = tmp_path / "f.pkl"
    res = CliRunner().invoke(app, ["export-forecaster", "kind:cost_model", "--out", str(out), "--compile-workers", "0"])
    assert res.exit_code == 0, res.output
    portable = load_forecaster_file(out)
    test, _, _ = toy_pairs(30, 4)
    assert np.abs(portable.predict_proba(test) - model.predict_proba(test)).max() < 1e-9
    bad = CliRunner().invoke(app, ["export-forecaster", "kind:text_model", "--out", str(out)])
    assert bad.exit_code == 2 and "no registered version" in bad.output and "Traceback" not in bad.output


def test_the_text_model_stores_its_vocabularies_as_strings_and_loads_back_the_same():
    """skops (MLflow's format for these models) writes a dict entry by entry: the text model's
    state holds each vocabulary as one string, and a round trip forecasts exactly the same."""
    import pickle

    import skops.io

    fit, y, l2 = toy_pairs(120, 0)
    model = TextModel().fit(fit, y, l2)
    state = model.__getstate__()
    assert isinstance(state["candidate_vec_terms"], str) and not hasattr(state["candidate_vec_"], "vocabulary_")
    assert len(model.candidate_vec_.vocabulary_) > 10  # the model itself keeps its dicts
    blob = skops.io.dumps(model)
    again = skops.io.loads(blob, trusted=skops.io.get_untrusted_types(data=blob))
    test, _, _ = toy_pairs(40, 5)
    assert again.candidate_vec_.vocabulary_ == model.candidate_vec_.vocabulary_
    assert np.array_equal(again.predict_proba(test), model.predict_proba(test))
    assert np.array_equal(pickle.loads(pickle.dumps(model)).predict_proba(test), model.predict_proba(test))
