"""Every classical kind as an MLflow pyfunc model of kernel sources: logged, loaded by MLflow,
predicting the numbers of its adapter on what the one file reader reads; sources read once
(the reader's cache), read the same as files."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_forecasting_models import toy_pairs

from models.classical import CostModel, TextModel

P = [f"p{i}" for i in range(1, 9)]
HW = "nvidia-h200-sm90"
NAME = "kernelcast-surrogate"
TORCH_SOFTMAX = ("import torch\n\n\ndef custom_kernel(data):\n    (x,) = data\n"
                 "    return torch.softmax(x.float(), dim=-1).to(torch.bfloat16)\n")


def _sources() -> dict[str, str]:
    from pathlib import Path

    from pipelines.generation import registry

    handwritten = Path(registry.__file__).parent / "handwritten" / "softmax" / "triton_row_tile.py"
    return {"anchor": TORCH_SOFTMAX, "seed": registry.render_point(registry.seed_point("softmax")),
            "row_tile": handwritten.read_text(), "broken": "def custom_kernel(data)\n    return data\n"}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A home of its own: the loaded models keep their feature cache under it."""
    import os

    path = tmp_path_factory.mktemp("home")
    before = os.environ.get("KERNELCAST_HOME")
    os.environ["KERNELCAST_HOME"] = str(path)
    yield path
    if before is None:
        os.environ.pop("KERNELCAST_HOME", None)
    else:
        os.environ["KERNELCAST_HOME"] = before


@pytest.fixture(scope="module")
def registered(home):
    """Each classical kind fitted on the toy rule and logged as a pyfunc model: {kind: (version, model)}."""
    from models.classical.ensemble import EnsembleModel
    from models.classical.registry import log_classical
    from pipelines.forecasting.pyfunc import log_classical_sources_model

    uri = f"sqlite:///{home / 'mlflow.db'}"
    fit, y, l2 = toy_pairs(200, 0)
    cal, y_cal, _ = toy_pairs(60, 1)
    models = {}
    for kind, model in (("cost_model", CostModel(max_iter=30)), ("text_model", TextModel())):
        model.fit(fit, y, l2)
        model.calibrate(cal, y_cal)
        models[kind] = model
    models["ensemble"] = EnsembleModel.from_members([models["cost_model"], models["text_model"]],
                                                    fit["task"].astype(str).tolist(), y)
    out = {}
    for kind, model in models.items():
        _, version = log_classical(model, uri, fit.head(4), NAME, "ds-test", "in_distribution",
                                   model_logger=log_classical_sources_model)
        out[kind] = (version, model)
    return uri, out


@pytest.fixture(scope="module")
def read(home, tmp_path_factory):
    """The sources read once as files (no cache) and once as sources (cache under the home)."""
    from pipelines.forecasting.files import read_kernel_files, read_kernel_sources
    from pipelines.forecasting.source_features import FeatureCache

    src = _sources()
    folder = tmp_path_factory.mktemp("files")
    for name, text in src.items():
        (folder / f"{name}.py").write_text(text)
    files = read_kernel_files("softmax", [folder / f"{n}.py" for n in src], hardware=HW)
    cache = FeatureCache(home / "feature-cache")
    sources = read_kernel_sources("softmax", list(src.values()), HW, names=list(src), cache=cache)
    return src, files, sources, cache


def test_sources_are_read_as_files_are_and_once(read, home):
    from pipelines.forecasting.files import read_kernel_sources
    from pipelines.forecasting.source_features import FeatureCache, feature_pool

    src, files, sources, cache = read
    assert [f.name for f in sources] == list(src) and all(f.path is None for f in sources)
    for f, s in zip(files, sources, strict=True):
        assert f.refused == s.refused
        if f.record is not None:
            assert {k: v for k, v in f.record.items() if k != "kernel_id"} == {
                k: v for k, v in s.record.items() if k != "kernel_id"}
    assert sources[3].refused.startswith("syntax error") and sources[1].record["n_regs"] is not None
    assert cache.misses == 3 and cache.hits == 0  # the broken one never reaches the reader
    # a new process's cache finds them on disk: no child is asked, the records are the same
    again = FeatureCache(home / "feature-cache")
    with feature_pool(1) as pool:
        second = read_kernel_sources("softmax", list(src.values()), HW, names=list(src), cache=again, pool=pool)
        assert pool.running == 0  # never started
    assert (again.hits, again.misses) == (3, 0)
    assert [f.record for f in second] == [f.record for f in sources]
    # another hardware is another reading
    other = FeatureCache(home / "feature-cache")
    assert other.key({"source": "x", "hardware": HW}) != other.key({"source": "x", "hardware": "nvidia-h100-sm90"})


@pytest.mark.parametrize("kind", ["cost_model", "text_model", "ensemble"])
def test_each_classical_kind_is_a_pyfunc_model_of_sources(registered, read, kind):
    import pathlib

    import mlflow
    from mlflow.models import Model

    from models.bins import BIN_LOG2_VALUES
    from models.classical.registry import load_classical
    from pipelines.forecasting import load_forecaster

    uri, versions = registered
    version, fitted = versions[kind]
    src, _, sources, _ = read
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model(f"models:/{NAME}/{version}")
    names = ["seed", "row_tile", "broken", "anchor"]
    frame = pd.DataFrame({"task": ["softmax"] * 4, "anchor_source": [src["anchor"]] * 4,
                          "candidate_source": [src[n] for n in names]})
    out = model.predict(frame)
    assert list(out.columns) == [*P, "expected_log2_speedup", "refused"] and len(out) == 4
    # the adapter's numbers on the reader's records, the registered model's and the fitted one's
    recs = {f.name: f.record for f in sources}
    ok = ["seed", "row_tile", "anchor"]
    want = fitted.predict_kernels(recs["anchor"], [recs[n] for n in ok], HW)
    adapter = load_forecaster(f"models:/{NAME}/{version}", tracking_uri=uri)
    assert np.array_equal(adapter.predict_kernels(recs["anchor"], [recs[n] for n in ok], HW), want)
    got = out.loc[[0, 1, 3], P].to_numpy()
    assert np.allclose(got, want, rtol=0, atol=1e-12) and np.allclose(got.sum(axis=1), 1)
    assert np.allclose(out.loc[[0, 1, 3], "expected_log2_speedup"], got @ np.array(BIN_LOG2_VALUES))
    assert out["refused"].isna().tolist() == [True, True, False, True]
    assert out.loc[2, "refused"].startswith("candidate: syntax error") and out.loc[2, P].isna().all()
    assert np.array_equal(load_classical(uri, NAME, version).predict_proba(frame_of(recs, ok)), want)
    # what MLflow holds: a python_function model with its signature, artifact and the project's code
    local = mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{NAME}/{version}")
    described = Model.load(local)
    assert [c["name"] for c in described.signature.inputs.to_dict()] == [
        "task", "anchor_source", "candidate_source", "hardware"]
    assert described.metadata["kind"] == kind and "model" in described.flavors["python_function"]["artifacts"]
    import sklearn

    assert f"scikit-learn=={sklearn.__version__}" in (pathlib.Path(local) / "requirements.txt").read_text()
    code = pathlib.Path(local) / described.flavors["python_function"]["code"]
    assert (code / "pipelines" / "forecasting" / "files.py").is_file() and not list(code.rglob("__pycache__"))


def frame_of(recs, names):
    from models.classical.features import pair_frame

    return pair_frame([recs["anchor"]] * len(names), [recs[n] for n in names])


def test_bad_input_is_one_line(registered):
    import mlflow
    from mlflow.exceptions import MlflowException

    uri, versions = registered
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model(f"models:/{NAME}/{versions['cost_model'][0]}")
    with pytest.raises(MlflowException) as exc:
        model.predict(pd.DataFrame({"task": ["softmax"], "anchor_source": ["x"]}))
    assert "candidate_source" in str(exc.value)
    out = model.predict(pd.DataFrame({"task": ["no_such_task"], "anchor_source": ["x"], "candidate_source": ["y"]}))
    assert out.loc[0, "refused"].startswith("unknown task 'no_such_task'") and out.loc[0, P].isna().all()


@pytest.mark.parametrize("name", ["pipelines.forecasting.sources", "pipelines.forecasting.pyfunc"])
def test_the_examples_of_the_modules_hold(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 1 and result.failed == 0


def test_forecast_sources_keeps_the_model_and_answers_as_its_pyfunc(registered, read, home):
    """The in-process call a search makes: the version loaded once, the sources read once (the
    home's feature cache already holds them: no reader child starts), the pyfunc's numbers."""
    import mlflow

    from pipelines.forecasting import forecast_sources, open_forecaster
    from pipelines.forecasting.warm import _OPEN

    uri, versions = registered
    version = versions["cost_model"][0]
    src = read[0]
    ref = f"models:/{NAME}/{version}"
    first = forecast_sources("softmax", src["anchor"], [src["seed"], src["broken"]], model=ref, home=home)
    kept = dict(_OPEN)
    again = forecast_sources("softmax", src["anchor"], [src["row_tile"]], model=ref, home=home)
    assert dict(_OPEN) == kept and len(kept) == 1  # one forecaster, loaded once
    (forecaster,) = kept.values()
    assert forecaster.pool.running == 0 and forecaster.cache.misses == 0
    mlflow.set_tracking_uri(uri)
    want = mlflow.pyfunc.load_model(ref).predict(pd.DataFrame({
        "task": "softmax", "anchor_source": src["anchor"], "candidate_source": [src["seed"], src["row_tile"]]}))
    assert np.array_equal(first.p[0], want.loc[0, P].to_numpy(dtype=float))
    assert np.array_equal(again.p[0], want.loc[1, P].to_numpy(dtype=float))
    assert first.refused[1].startswith("candidate: syntax error") and np.isnan(first.p[1]).all()
    assert np.allclose(first.expected_log2_speedup[0], want.loc[0, "expected_log2_speedup"])
    with pytest.raises(ValueError, match="unknown task"):
        forecast_sources("nope", src["anchor"], [src["seed"]], model=ref, home=home)
    with open_forecaster(ref, home=home) as f:
        assert np.array_equal(f.forecast("softmax", src["anchor"], [src["seed"]]).p, first.p[:1])
    forecaster.close()
    _OPEN.clear()


def test_a_source_compiled_on_a_real_input_is_compiled_there_once(tmp_path, monkeypatch):
    """A kernel whose call reads a value on the host cannot be compiled by its trace; the
    generator's compile on a real input stands in, and its answer is cached like the trace's:
    the second reading asks no child at all and gives the same record."""
    import pipelines.generation.aot as aot
    from pipelines.forecasting.files import read_kernel_sources
    from pipelines.forecasting.source_features import FeatureCache

    host = _sources()["seed"] + (
        "\n\n_on_device = custom_kernel\n\n\ndef custom_kernel(data):\n"
        "    if not float(data[0].float().abs().max()) >= 0.0:  # a value read on the host\n"
        "        raise ValueError('nan in the input')\n"
        "    return _on_device(data)\n")
    compiled = []
    real = aot.compile_many
    monkeypatch.setattr(aot, "compile_many", lambda records, **kw: compiled.extend(records) or real(records, **kw))
    cache = FeatureCache(tmp_path / "cache")
    (first,) = read_kernel_sources("softmax", [host], HW, cache=cache)
    assert len(compiled) == 1 and first.record["n_regs"] > 0
    again = FeatureCache(tmp_path / "cache")
    (second,) = read_kernel_sources("softmax", [host], HW, cache=again)
    assert len(compiled) == 1 and again.misses == 0 and second.record == first.record
