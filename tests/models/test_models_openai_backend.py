"""OpenAIAnswerer against a real local HTTP server (stdlib http.server) speaking chat completions."""

import json
import math

import pytest
from chat_server import ChatServer

from models.backends import BackendError, ForecastRequest
from models.backends.openai_backend import OpenAIAnswerer, label_logprobs
from models.cache import ForecastCache
from models.prompts import ANSWER_PREFIX, build_prompt

ANSWER = 'The candidate halves memory traffic.\n```json\n{"predicted_bin": 6, "p": [0, 0, 0, 0, 0.2, 0.5, 0.2, 0.1], "reasoning": "fewer loads"}\n```'


class FakeServer(ChatServer):
    """A chat completions endpoint whose reply depends on the requested model name.

    models: "good" (a valid answer), "garbage" (unparseable text), "flaky" (HTTP 503 on
    the first call of each prompt, then valid), "broken" (always 500), "bad-request" (400),
    "logprobs" (top_logprobs for the next token).
    """

    def __init__(self):
        super().__init__(self.reply)

    def reply(self, path, body, seen):
        if path != "/v1/chat/completions":
            return 404, {"error": "not found"}
        model = body["model"]
        if model == "broken" or (model == "flaky" and seen == 1):
            return (500 if model == "broken" else 503), {"error": "overloaded"}
        if model == "bad-request":
            return 400, {"error": {"message": "unknown parameter"}}
        usage = {"prompt_tokens": 321, "completion_tokens": 42}
        if model == "logprobs":
            top = [
                {"token": "6", "logprob": math.log(0.5)},
                {"token": " 5", "logprob": math.log(0.2)},
                {"token": "5", "logprob": math.log(0.1)},
                {"token": "x", "logprob": math.log(0.1)},
            ]
            choice = {
                "message": {"role": "assistant", "content": "6"},
                "logprobs": {"content": [{"token": "6", "top_logprobs": top}]},
            }
            return 200, {"choices": [choice], "usage": {**usage, "completion_tokens": 1}}
        if model == "tool" and body.get("tool_choice"):
            args = json.dumps({"predicted_bin": 2, "p": [0.1, 0.6, 0.3, 0, 0, 0, 0, 0], "reasoning": "slow"})
            call = {"id": "c0", "type": "function", "function": {"name": body["tool_choice"]["function"]["name"],
                                                                 "arguments": args}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            return 200, {"choices": [{"message": message}], "usage": usage}
        content = "I am not sure { maybe" if model == "garbage" else ANSWER
        return 200, {
            "choices": [{"message": {"role": "assistant", "content": content}}],
            "usage": usage,
        }


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.close()


def requests_(n=3):
    return [
        ForecastRequest(
            build_prompt(
                "softmax", "Row softmax.", "a\n", f"b{i}\n", {"name": "NVIDIA H200"}, "diff"
            ),
            f"p{i}",
        )
        for i in range(n)
    ]


def test_verbalized_answers_parse(server):
    forecaster = OpenAIAnswerer(server.base_url, "good", api_key="sk-test", concurrency=3)
    out = forecaster.forecast(requests_(3))
    assert len(out) == 3 and len(server.requests) == 3
    for f in out:
        assert f.parse_ok and f.predicted_bin == 6 and f.p[5] == pytest.approx(0.5)
        assert (f.tokens, f.prompt_tokens) == (42, 321) and f.latency_s > 0
    body = server.requests[0]
    assert (
        body["model"] == "good"
        and body["temperature"] == 0.0
        and body["messages"][0]["role"] == "system"
    )
    assert server.headers[0]["Authorization"] == "Bearer sk-test"
    assert "sk-test" not in repr(forecaster)


def test_garbage_reply_is_a_recorded_parse_failure(server):
    out = OpenAIAnswerer(server.base_url, "garbage").forecast(requests_(2))
    assert [f.parse_ok for f in out] == [False, False]
    assert out[0].parse_error == "no JSON object found" and out[0].text == "I am not sure { maybe"


def test_transport_failures_are_retried(server):
    out = OpenAIAnswerer(server.base_url, "flaky", retries=1, backoff_s=0.01).forecast(
        requests_(2)
    )
    assert all(f.parse_ok for f in out)
    assert len(server.requests) == 4  # one 503 and one success per prompt


def test_persistent_failure_raises_after_retries(server):
    forecaster = OpenAIAnswerer(server.base_url, "broken", retries=2, backoff_s=0.01)
    with pytest.raises(BackendError, match="HTTP 500"):
        forecaster.forecast(requests_(1))
    assert len(server.requests) == 3
    with pytest.raises(BackendError, match="HTTP 400"):
        OpenAIAnswerer(server.base_url, "bad-request", retries=3, backoff_s=0.01).forecast(
            requests_(1)
        )
    assert len(server.requests) == 4  # a 400 is not retried


def test_unreachable_server_raises_backend_error():
    forecaster = OpenAIAnswerer("http://127.0.0.1:9/v1", "good", retries=0, timeout_s=2)
    with pytest.raises(BackendError):
        forecaster.forecast(requests_(1))


def test_logprob_readout(server):
    forecaster = OpenAIAnswerer(server.base_url, "logprobs", use_logprobs=True)
    (f,) = forecaster.forecast(requests_(1), repeats=1)
    assert f.parse_ok and f.readout == "logprob" and f.predicted_bin == 6
    assert f.raw_sum == pytest.approx(0.8)  # 0.5 + (0.2 + 0.1 for " 5" and "5")
    assert (
        f.p[5] == pytest.approx(0.5 / 0.8) and f.p[4] == pytest.approx(0.3 / 0.8) and f.p[0] == 0.0
    )
    body = server.requests[0]
    assert body["messages"][-1] == {"role": "assistant", "content": ANSWER_PREFIX}
    assert (
        body["max_tokens"] == 1
        and body["logprobs"] is True
        and body["continue_final_message"] is True
    )
    assert label_logprobs([]) == [None] * 8


def test_cache_serves_a_rerun_without_requests(server, tmp_path):
    cache = ForecastCache(tmp_path)
    first = OpenAIAnswerer(server.base_url, "good", cache=cache).forecast(requests_(2), repeats=3)
    assert len(server.requests) == 2  # greedy: repeats share one request
    again = OpenAIAnswerer(server.base_url, "good", cache=ForecastCache(tmp_path)).forecast(
        requests_(2), repeats=3
    )
    assert len(server.requests) == 2 and all(f.cached for f in again)
    assert [(f.p, f.repeat) for f in again] == [(f.p, f.repeat) for f in first]
    sampled = OpenAIAnswerer(server.base_url, "good", cache=cache, temperature=0.7)
    sampled.forecast(requests_(2), repeats=3)
    assert len(server.requests) == 2 + 6  # sampling: every repeat is its own request and key


def test_progress_callback(server):
    seen = []
    OpenAIAnswerer(server.base_url, "good", concurrency=1).forecast(
        requests_(5), progress=lambda d, t: seen.append((d, t))
    )
    assert seen[-1] == (5, 5)


def test_json_schema_mode_sends_the_answer_schema(server):
    from models.parsing import answer_json_schema

    f = OpenAIAnswerer(server.base_url, "good", answer_mode="json_schema", reasoning_max_chars=120, concurrency=1)
    (out,) = f.forecast(requests_(1))
    assert out.parse_ok and out.predicted_bin == 6
    fmt = server.requests[-1]["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"] == answer_json_schema(120)
    assert "tools" not in server.requests[-1]


def test_tool_mode_reads_the_forced_call_and_falls_back_to_content(server):
    from models.backends.openai_backend import TOOL_NAME

    (out,) = OpenAIAnswerer(server.base_url, "tool", answer_mode="tool", concurrency=1).forecast(requests_(1))
    body = server.requests[-1]
    assert body["tool_choice"] == {"type": "function", "function": {"name": TOOL_NAME}}
    assert body["tools"][0]["function"]["parameters"]["required"] == ["predicted_bin", "p", "reasoning"]
    assert out.parse_ok and out.predicted_bin == 2 and out.p[1] == pytest.approx(0.6)
    # A server that answers in plain content instead: the content is parsed
    (plain,) = OpenAIAnswerer(server.base_url, "good", answer_mode="tool", concurrency=1).forecast(requests_(1))
    assert plain.parse_ok and plain.predicted_bin == 6


def test_answer_modes_are_cache_keys_and_validated(server):
    text = OpenAIAnswerer(server.base_url, "good")
    tool = OpenAIAnswerer(server.base_url, "good", answer_mode="tool")
    assert "answer_mode" not in text.cache_params() and tool.cache_params()["answer_mode"] == "tool"
    with pytest.raises(ValueError, match="answer_mode"):
        OpenAIAnswerer(server.base_url, "good", answer_mode="xml")
