"""The LLM-backend resource: which backend answers the language models' forecasts, swapped by
resource or run config, its defaults from the settings."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from orchestration.resources import (
    LlmBackendResource,
    MlflowResource,
    ProfilerResource,
    SettingsResource,
)
from orchestration.settings import LlmBackendSettings, load_settings


@pytest.fixture()
def settings(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    return load_settings("smoke")


def _tiny_shard(tmp_path, settings, spec: str = "tiny"):
    """A shard plan of a base model (the tiny one) on three pairs of real generated kernels."""
    from pipelines.forecasting.llm_shards import plan_base_job, write_shard
    from pipelines.generation.candidates import build_candidates, write_batch
    from warehouse.db import connect
    from warehouse.ingest import ingest_path

    kernels = build_candidates("softmax", 4, seed=0, compile=False)
    ids = sorted(kernels["kernel_id"].to_list())
    pairs = pl.DataFrame({"pair_id": [f"p{i}" for i in range(1, len(ids))], "task": "softmax",
                          "hardware_id": "a-device-the-warehouse-does-not-know",
                          "anchor_kernel_id": ids[0], "candidate_kernel_id": ids[1:]})
    with connect(settings.warehouse_path) as con:
        ingest_path(con, write_batch(kernels, tmp_path / "kernels.parquet"))
        job = plan_base_job(con, spec, pairs, "compact")
    folder = settings.home / "forecast-shards" / "t"
    return {"gpu": 0, "shard": str(write_shard(folder / "shard-gpu0.json", [job])), "pairs": pairs.height}, pairs


def test_the_transformers_kind_forecasts_a_shard_with_the_tiny_model(tmp_path, settings):
    """The forecasting step with the resource of kind transformers: the tiny in-process model
    answers every pair of its shard with a distribution over the eight bins."""
    from assets.evaluation import forecast_llm_shard

    shard, pairs = _tiny_shard(tmp_path, settings)
    resources = {"settings": SettingsResource(profile="smoke", home=str(settings.home)),
                 "mlflow": MlflowResource(tracking_uri=settings.mlflow_uri, artifact_root=str(settings.mlflow_artifacts)),
                 "profiler": ProfilerResource(), "llm_backend": LlmBackendResource(kind="transformers")}
    out = forecast_llm_shard(dg.build_op_context(resources=resources), shard=shard)
    assert out["forward_passes"] == pairs.height and out["device"] == "cpu"
    rows = pl.read_parquet(out["rows"]).sort("pair_id")
    assert rows["pair_id"].to_list() == pairs["pair_id"].to_list()
    assert set(rows["model_ref"]) == {"base:tiny"}
    p = rows.select([f"p{i}" for i in range(1, 9)]).to_numpy()
    assert p.sum(axis=1) == pytest.approx([1.0] * pairs.height, abs=1e-6)
    # Answered once: the same shard again is read from the forecast cache, no forward pass.
    assert forecast_llm_shard(dg.build_op_context(resources=resources), shard=shard)["forward_passes"] == 0


def test_the_openai_kind_asks_the_server_with_the_key(tmp_path, settings):
    """The same step with a server's backend: the prompts go to its chat completions under the
    forecast's model ref, with the API key, and its label log-probabilities are the rows."""
    import math

    from chat_server import ChatServer

    from assets.evaluation import forecast_llm_shard

    top = [{"token": "6", "logprob": math.log(0.75)}, {"token": "2", "logprob": math.log(0.25)}]
    server = ChatServer(lambda path, body, seen: (200, {
        "choices": [{"message": {"role": "assistant", "content": "6"},
                     "logprobs": {"content": [{"token": "6", "top_logprobs": top}]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1}}))
    try:
        shard, pairs = _tiny_shard(tmp_path, settings)
        backend = LlmBackendResource(kind="openai", base_url=server.base_url, api_key="secret")
        resources = {"settings": SettingsResource(profile="smoke", home=str(settings.home)),
                     "mlflow": MlflowResource(tracking_uri=settings.mlflow_uri,
                                              artifact_root=str(settings.mlflow_artifacts)),
                     "profiler": ProfilerResource(), "llm_backend": backend}
        out = forecast_llm_shard(dg.build_op_context(resources=resources), shard=shard)
    finally:
        server.close()
    assert {r["model"] for r in server.requests} == {"base:tiny"} and len(server.requests) == pairs.height
    assert {h["Authorization"] for h in server.headers} == {"Bearer secret"}
    rows = pl.read_parquet(out["rows"])
    assert rows["p6"].to_list() == pytest.approx([0.75] * pairs.height)
    assert rows["p2"].to_list() == pytest.approx([0.25] * pairs.height)


def test_the_committed_kind_makes_no_forward_pass(tmp_path, settings):
    """A shard reaching a step of the committed backend fails in one line, naming the model."""
    from assets.evaluation import forecast_llm_shard

    shard, _ = _tiny_shard(tmp_path, settings)
    resources = {"settings": SettingsResource(profile="smoke", home=str(settings.home)),
                 "mlflow": MlflowResource(tracking_uri=settings.mlflow_uri, artifact_root=str(settings.mlflow_artifacts)),
                 "profiler": ProfilerResource(), "llm_backend": LlmBackendResource(kind="committed")}
    with pytest.raises(dg.Failure) as err:
        forecast_llm_shard(dg.build_op_context(resources=resources), shard=shard)
    assert "base:tiny" in str(err.value.description) and "no forward pass" in str(err.value.description)
    assert not LlmBackendResource(kind="committed").backend().forecasts_here


def test_a_bad_kind_or_a_server_without_its_url_is_one_line():
    with pytest.raises(ValueError, match="unknown LLM backend 'nope'"):
        LlmBackendResource(kind="nope").backend()
    with pytest.raises(ValueError, match="base_url"):
        LlmBackendResource(kind="openai").backend()


def test_the_settings_defaults_reach_the_code_location(settings):
    from orchestration.definitions import build_defs

    assert build_defs(settings).resources["llm_backend"].kind == "transformers"
    served = replace(settings, llm_backend=LlmBackendSettings(kind="openai", base_url="http://127.0.0.1:8000/v1",
                                                              model="kernelcast"))
    resource = build_defs(served).resources["llm_backend"]
    assert (resource.kind, resource.base_url, resource.model) == ("openai", "http://127.0.0.1:8000/v1", "kernelcast")
    # A test or a host swaps it without touching the settings.
    swapped = build_defs(settings, resources={"llm_backend": LlmBackendResource(kind="committed")})
    assert swapped.resources["llm_backend"].kind == "committed"


def test_the_documented_external_folder_variable_is_read_in_the_settings(tmp_path, monkeypatch):
    """KERNELCAST_LIBRARY_DIR (docs/method.md) is mapped in orchestration/settings.py; the
    evaluation asset reads the setting, not the environment."""
    monkeypatch.delenv("KERNELCAST_LIBRARY_DIR", raising=False)
    assert load_settings("smoke", tmp_path).evaluation.library_dir is None
    monkeypatch.setenv("KERNELCAST_LIBRARY_DIR", str(tmp_path / "fetched"))
    assert load_settings("smoke", tmp_path).evaluation.library_dir == str(tmp_path / "fetched")


def test_the_reference_card_variable_picks_the_card_forecasters_learn_from(tmp_path, monkeypatch):
    monkeypatch.delenv("KERNELCAST_REFERENCE_HARDWARE", raising=False)
    assert load_settings("smoke", tmp_path).curation.reference_hardware == "nvidia-h200-sm90"
    monkeypatch.setenv("KERNELCAST_REFERENCE_HARDWARE", "nvidia-h100-80gb-hbm3-sm90")
    assert load_settings("smoke", tmp_path).curation.reference_hardware == "nvidia-h100-80gb-hbm3-sm90"


@pytest.mark.slow
def test_the_vllm_kind_reads_the_same_distribution_as_transformers(tmp_path, tmp_path_factory, settings):
    """SmolLM2's shard through vLLM's offline engine in a child process: the same prompts as
    token ids, the same eight label log-probabilities as the in-process model. (The tiny model's
    head size of 16 is one vLLM's CPU attention refuses.)"""
    from vllm_helpers import smollm2_dir, vllm_python

    from pipelines.forecasting.llm_shards import forecast_shard, read_shard

    python = vllm_python()
    smollm2_dir(tmp_path_factory, settings.home)  # this run's one conversion, not another
    shard, pairs = _tiny_shard(tmp_path, settings, "smollm2")
    (job,) = read_shard(shard["shard"])
    p_cols = [f"p{i}" for i in range(1, 9)]
    rows = {}
    for kind in ("transformers", "vllm"):
        backend = LlmBackendResource(kind=kind, vllm_python=python).backend()
        frame, passes = forecast_shard("", job, settings.home, "cpu", tmp_path / "downloads", backend)
        assert passes == pairs.height  # the backends' answers are cached apart
        rows[kind] = frame.sort("pair_id").select(p_cols).to_numpy()
    assert rows["vllm"].sum(axis=1) == pytest.approx([1.0] * pairs.height, abs=1e-6)
    # Real compact prompts are ~1,000 tokens: the engine's CPU kernels drift from the in-process
    # float32 pass by up to 0.023 in a bin's probability (measured 2026-12-02; short prompts stay
    # under 2e-3, tests/models/test_vllm_offline.py).
    assert rows["vllm"] == pytest.approx(rows["transformers"], abs=0.05)


@pytest.mark.parametrize(("kind", "cls", "here"), [
    ("transformers", "TransformersBackend", True), ("vllm", "VllmBackend", True),
    ("openai", "OpenAIBackend", True), ("committed", "CommittedBackend", False)])
def test_each_kind_is_its_own_backend(kind, cls, here):
    backend = LlmBackendResource(kind=kind, base_url="http://127.0.0.1:8000/v1", vllm_python="/opt/vllm/bin/python").backend()
    assert type(backend).__name__ == cls and backend.kind == kind and backend.forecasts_here is here
    # each keeps only the settings it reads
    assert {f for f in vars(backend)} <= {"base_url", "model", "api_key", "vllm_python"}
    if kind == "committed":
        with pytest.raises(ValueError, match="base:tiny has no committed forecasts"):
            backend.base_forecaster("tiny", Path("."), "cpu", None)
