"""TransformersAnswerer on the tiny in-process model: both readouts, batching, cache, repeats."""

import math
from pathlib import Path

import pytest
import torch

from models.backends import ForecastRequest
from models.backends.transformers_backend import (
    TransformersAnswerer,
    _common_prefix_len,
    label_split,
)
from models.cache import ForecastCache
from models.forecast import Forecast
from models.prompts import ANSWER_PREFIX, BIN_LABELS, build_prompt
from models.tiny import build_tiny_model

HW = {"name": "NVIDIA H200", "compute_capability": [9, 0], "sm_count": 132}


def request(k: int) -> ForecastRequest:
    # diff style and short sources: the tiny BPE vocabulary makes full prompts long.
    anchor = "x = tl.load(p)\n" * 2
    candidate = anchor + f"y = x * {k}\n" * k
    return ForecastRequest(
        build_prompt("softmax", "Row softmax.", anchor, candidate, HW, style="diff"), f"pair-{k}"
    )


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module")
def logprob_forecaster(tiny_dir) -> TransformersAnswerer:
    return TransformersAnswerer(str(tiny_dir), readout="logprob", batch_size=3, device="cpu")


def test_tiny_model_is_deterministic_by_seed(tiny_dir, tmp_path):
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (tiny_dir / name).read_bytes()
    assert (other / "model.safetensors").read_bytes() != (
        tiny_dir / "model.safetensors"
    ).read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()


def test_tiny_tokenizer_has_single_token_labels_and_a_chat_template(logprob_forecaster):
    tok = logprob_forecaster.tokenizer
    for label in BIN_LABELS:
        assert len(tok.encode(label, add_special_tokens=False)) == 1
    _, labels = label_split(tok, "<|im_start|>assistant\n" + ANSWER_PREFIX)
    assert len(set(labels)) == 8 and tok.convert_ids_to_tokens(labels) == list(BIN_LABELS)
    rendered = logprob_forecaster.render([{"role": "user", "content": "hi"}])
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert _common_prefix_len([[1, 2], [1, 2]]) == 2


def test_logprob_readout_returns_a_valid_distribution(logprob_forecaster):
    out = logprob_forecaster.forecast([request(k) for k in range(1, 5)], repeats=2)
    assert len(out) == 8 and [f.repeat for f in out] == [0, 1] * 4
    for f in out:
        assert f.parse_ok and f.readout == "logprob"
        assert len(f.p) == 8 and math.isclose(sum(f.p), 1.0, abs_tol=1e-9) and min(f.p) > 0
        assert 0 < f.raw_sum < 1  # mass on the eight labels among a vocabulary of ~950 tokens
        assert f.predicted_bin == f.argmax_bin
        assert f.tokens == 0 and f.prompt_tokens > 100 and f.latency_s > 0
    assert out[0].p == out[1].p  # deterministic readout: repeats are the same answer


def test_logprob_readout_matches_an_unbatched_forward(logprob_forecaster):
    """Left padding + position ids: the batch does not change a prompt's answer."""
    reqs = [request(k) for k in (1, 5, 2)]  # different lengths, so rows are padded
    batched = logprob_forecaster.forecast(reqs)
    model, tok = logprob_forecaster.model, logprob_forecaster.tokenizer
    for req, f in zip(reqs, batched):
        ids, labels = label_split(tok, logprob_forecaster.render(req.messages) + ANSWER_PREFIX)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        probs = torch.softmax(logits.double(), -1)[labels]
        assert f.raw_sum == pytest.approx(float(probs.sum()), rel=1e-4)
        assert list(f.p) == pytest.approx((probs / probs.sum()).tolist(), rel=1e-4)


def _verbalized(base: TransformersAnswerer, **settings) -> TransformersAnswerer:
    """A verbalized-readout forecaster on the model and tokenizer `base` already loaded."""
    return TransformersAnswerer(base.model, base.tokenizer, readout="verbalized", **settings)


def test_verbalized_readout_records_parse_failures(tiny_dir, logprob_forecaster):
    forecaster = _verbalized(logprob_forecaster, max_new_tokens=8, batch_size=2)
    out = forecaster.forecast([request(1), request(3), request(2)])
    assert len(out) == 3
    for f in out:
        assert isinstance(f, Forecast) and not f.parse_ok and f.parse_error  # random weights: noise
        assert f.text is not None and 1 <= f.tokens <= 8 and f.latency_s > 0


def test_sampling_repeats_differ_and_retries_are_counted(logprob_forecaster):
    forecaster = _verbalized(logprob_forecaster, max_new_tokens=6, temperature=1.0, retries=1, batch_size=4)
    out = forecaster.forecast([request(1)], repeats=3)
    assert [f.repeat for f in out] == [0, 1, 2]
    assert all(f.attempts == 2 and f.tokens <= 12 for f in out)  # every noise answer retried once
    assert len({f.text for f in out}) > 1


def test_cache_hit_makes_no_model_call(tmp_path, monkeypatch):
    model_dir = build_tiny_model(tmp_path / "model", seed=0)
    cache = ForecastCache(tmp_path / "cache")
    forecaster = TransformersAnswerer(
        str(model_dir), readout="logprob", cache=cache, device="cpu"
    )
    reqs = [request(1), request(2)]
    first = forecaster.forecast(reqs, repeats=2)
    assert len(cache) == 2  # deterministic readout: one entry per request, shared by repeats
    assert not any(f.cached for f in first)

    def no_model(*args, **kwargs):
        raise AssertionError("the model was called despite a cache hit")

    monkeypatch.setattr(forecaster, "_logprob_batch", no_model)
    second = forecaster.forecast(reqs, repeats=2)
    assert all(f.cached for f in second)
    assert [(f.p, f.repeat) for f in second] == [(f.p, f.repeat) for f in first]
    # A fresh forecaster on the same directory (a rerun) hits the same entries.
    rerun = TransformersAnswerer(
        str(model_dir), readout="logprob", cache=ForecastCache(tmp_path / "cache")
    )
    monkeypatch.setattr(rerun, "_logprob_batch", no_model)
    assert [f.p for f in rerun.forecast(reqs)] == [f.p for f in first[::2]]
    # New weights saved into the same directory are a different model: no stale hits.
    build_tiny_model(model_dir, seed=1)
    retrained = TransformersAnswerer(str(model_dir), readout="logprob", cache=cache)
    assert retrained.model_ref != forecaster.model_ref
    assert not any(f.cached for f in retrained.forecast(reqs)) and len(cache) == 4


def test_in_memory_model_needs_a_ref_to_cache(logprob_forecaster, tmp_path):
    with pytest.raises(ValueError, match="model_ref"):
        TransformersAnswerer(
            logprob_forecaster.model, logprob_forecaster.tokenizer, cache=ForecastCache(tmp_path)
        )
    with pytest.raises(ValueError, match="readout"):
        TransformersAnswerer(
            logprob_forecaster.model, logprob_forecaster.tokenizer, readout="psychic"
        )
