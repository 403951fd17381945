"""An OpenAI-compatible chat completions server as a PromptAnswerer (vLLM, llama.cpp, hosted APIs).

HTTP with the standard library (urllib): no client dependency, and the request is one POST
of JSON. Requests run in a thread pool (`concurrency` at a time); transport failures
(connection refused, timeouts, HTTP 408/409/429/5xx) are retried with exponential backoff,
other HTTP errors are not (a 400 will not get better). A request still failing raises
`BackendError` after the others are cached. A reply that does not parse is NOT a transport
failure: it is a recorded Forecast with parse_ok False.

Readouts:
- verbalized (default): the reply's message content goes through `parse_forecast`. How the
  answer is asked for (`answer_mode`): "text" (free text, the JSON block found by the parser),
  "json_schema" (`response_format` with the answer's JSON schema: servers with structured
  outputs, vLLM among them, can only write a valid object) or "tool" (one function
  `submit_forecast` whose parameters are that schema, forced with a named `tool_choice`; the
  call's arguments are the answer). A reply without the expected tool call falls back to its
  content, and either way an answer that does not parse is a recorded failure.
- logprob (`use_logprobs=True`): the prompt plus a partial assistant turn holding
  `ANSWER_PREFIX`, one token generated with `logprobs`/`top_logprobs`; the labels "1".."8"
  among the top tokens give the distribution (absent labels get probability 0). Continuing
  a final assistant message needs the vLLM extensions `continue_final_message=True,
  add_generation_prompt=False` (sent in the body); servers without them will not give the
  label as the next token.
"""

from __future__ import annotations

import json
import logging
import math
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from models.backends import BackendError, Messages, PromptAnswerer
from models.forecast import LOGPROB, VERBALIZED, Forecast
from models.parsing import answer_json_schema, parse_forecast
from models.prompts import ANSWER_PREFIX, BIN_LABELS, with_answer_prefix

log = logging.getLogger(__name__)

_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}
ANSWER_MODES = ("text", "json_schema", "tool")
TOOL_NAME = "submit_forecast"
TOOL_DESCRIPTION = (
    "Submit the forecast: the most likely speedup bin (1-8) and a probability for each of the "
    "8 bins, with a short reasoning."
)


class _Retryable(Exception):
    """A failure worth another attempt."""


def label_logprobs(top_logprobs: list[dict[str, Any]]) -> list[float | None]:
    """Log-probabilities of the labels "1".."8" among a position's top tokens.

    Tokens are compared after stripping whitespace (" 3" and "3" both name bin 3; their
    probabilities add up).

    Args:
        top_logprobs: [{"token": "3", "logprob": -0.2}, ...] as chat completions return them.
    Returns:
        Eight log-probabilities, None for a label not among them.

    >>> label_logprobs([{"token": " 3", "logprob": 0.0}, {"token": "x", "logprob": -1.0}])[2]
    0.0
    """
    mass = [0.0] * len(BIN_LABELS)
    for entry in top_logprobs or []:
        token = str(entry.get("token", "")).strip()
        if token in BIN_LABELS and entry.get("logprob") is not None:
            mass[BIN_LABELS.index(token)] += math.exp(min(float(entry["logprob"]), 0.0))
    return [math.log(m) if m > 0 else None for m in mass]


class OpenAIAnswerer(PromptAnswerer):
    """Forecast through an OpenAI-compatible `/chat/completions` endpoint.

    Args:
        base_url: the API root, e.g. "http://127.0.0.1:8000/v1".
        model: the served model name.
        api_key: sent as a bearer token when given (resolve it from the environment in the
            caller, e.g. a Dagster EnvVar; this class reads no environment).
        concurrency: requests in flight at once.
        retries: extra attempts after a transport failure.
        timeout_s: per-request timeout, seconds.
        use_logprobs: logprob readout instead of verbalized (see module doc).
        max_tokens: completion budget of the verbalized readout.
        temperature: 0 = greedy (repeats are then computed once).
        top_p: nucleus sampling mass.
        top_logprobs: alternatives requested per position in the logprob readout.
        parse_retries: extra attempts for a verbalized reply that fails to parse (sampling only).
        cache: optional ForecastCache.
        model_ref: names the model in cache keys; defaults to "<base_url>#<model>".
        extra_body: more JSON fields for every request (e.g. {"seed": 0}).
        backoff_s: first retry delay; doubles each retry.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        concurrency: int = 4,
        retries: int = 2,
        timeout_s: float = 120.0,
        use_logprobs: bool = False,
        max_tokens: int = 1024,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_logprobs: int = 20,
        parse_retries: int = 0,
        cache: Any = None,
        model_ref: str | None = None,
        extra_body: dict[str, Any] | None = None,
        backoff_s: float = 0.5,
        answer_mode: str = "text",
        reasoning_max_chars: int = 400,
    ) -> None:
        if answer_mode not in ANSWER_MODES:
            raise ValueError(f"answer_mode must be one of {ANSWER_MODES}, got {answer_mode!r}")
        self.answer_mode = answer_mode
        self.reasoning_max_chars = int(reasoning_max_chars)
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key
        self.concurrency = max(1, int(concurrency))
        self.progress_chunk = 4 * self.concurrency
        self.retries = max(0, int(retries))
        self.timeout_s = float(timeout_s)
        self.readout = LOGPROB if use_logprobs else VERBALIZED
        self.max_tokens = int(max_tokens)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.top_logprobs = int(top_logprobs)
        self.parse_retries = max(0, int(parse_retries))
        self.cache = cache
        self.model_ref = model_ref or f"{base_url.rstrip('/')}#{model}"
        self.extra_body = dict(extra_body or {})
        self.backoff_s = float(backoff_s)

    def __repr__(self) -> str:  # never shows the api key
        return f"OpenAIAnswerer(url={self.url!r}, model={self.model!r}, readout={self.readout!r})"

    # --- settings -------------------------------------------------------------------------

    def cache_params(self) -> dict[str, Any]:
        if self.readout == LOGPROB:
            return {
                "answer_prefix": ANSWER_PREFIX,
                "top_logprobs": self.top_logprobs,
                "extra": self.extra_body,
            }
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "parse_retries": self.parse_retries,
            "extra": self.extra_body,
            # "text" keeps the keys cached before answer modes existed
            **({"answer_mode": self.answer_mode, "reasoning_max_chars": self.reasoning_max_chars}
               if self.answer_mode != "text" else {}),
        }

    def is_deterministic(self) -> bool:
        return self.readout == LOGPROB or self.temperature == 0

    def request_body(self, messages: Messages) -> dict[str, Any]:
        """The JSON body of one chat completion request."""
        body: dict[str, Any] = {"model": self.model}
        if self.readout == LOGPROB:
            body.update(
                messages=with_answer_prefix(messages),
                max_tokens=1,
                temperature=0.0,
                logprobs=True,
                top_logprobs=self.top_logprobs,
                continue_final_message=True,
                add_generation_prompt=False,
            )
        else:
            body.update(
                messages=messages,
                max_tokens=self.max_tokens,
                temperature=self.temperature,
                top_p=self.top_p,
            )
            schema = answer_json_schema(self.reasoning_max_chars)
            if self.answer_mode == "json_schema":
                body["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "forecast", "schema": schema, "strict": True},
                }
            elif self.answer_mode == "tool":
                body["tools"] = [{"type": "function", "function": {
                    "name": TOOL_NAME, "description": TOOL_DESCRIPTION, "parameters": schema}}]
                body["tool_choice"] = {"type": "function", "function": {"name": TOOL_NAME}}
        body.update(self.extra_body)
        return body

    # --- HTTP -----------------------------------------------------------------------------

    def _post_once(self, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:200] if exc.fp else ""
            message = f"HTTP {exc.code} from {self.url}: {' '.join(detail.split())}"
            if exc.code in _RETRY_STATUS:
                raise _Retryable(message) from exc
            raise BackendError(message) from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            raise _Retryable(f"{type(exc).__name__} from {self.url}: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise BackendError(f"reply from {self.url} is not JSON: {exc}") from exc

    def post(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST with retries on transport failures.

        Raises:
            BackendError: after `retries` extra attempts, or at once for a non-retryable error.
        """
        for attempt in range(self.retries + 1):
            try:
                return self._post_once(body)
            except _Retryable as exc:
                if attempt == self.retries:
                    raise BackendError(f"{exc} (after {attempt + 1} attempts)") from exc
                delay = self.backoff_s * 2**attempt
                log.warning(
                    "request failed (%s); retry %d/%d in %.1fs",
                    exc,
                    attempt + 1,
                    self.retries,
                    delay,
                )
                time.sleep(delay)
        raise AssertionError("unreachable")

    # --- readouts -------------------------------------------------------------------------

    def _answer(self, messages: Messages) -> Forecast:
        """One forecast from one or more requests (parse retries when sampling)."""
        attempts = 1 + (
            self.parse_retries if self.readout == VERBALIZED and self.temperature > 0 else 0
        )
        tokens, latency = 0, 0.0
        forecast: Forecast | None = None
        for attempt in range(attempts):
            t0 = time.perf_counter()
            reply = self.post(self.request_body(messages))
            latency += time.perf_counter() - t0
            usage = reply.get("usage") or {}
            tokens += int(usage.get("completion_tokens") or 0)
            forecast = self._read(reply).with_meta(
                tokens=tokens if self.readout == VERBALIZED else 0,
                prompt_tokens=usage.get("prompt_tokens"),
                latency_s=latency,
                attempts=attempt + 1,
            )
            if forecast.parse_ok:
                break
        assert forecast is not None
        return forecast

    def _read(self, reply: dict[str, Any]) -> Forecast:
        """Forecast from one chat completion reply; a malformed reply is a recorded failure."""
        choices = reply.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            return Forecast.failure("reply has no choices", readout=self.readout)
        choice = choices[0]
        if self.readout == LOGPROB:
            content = ((choice.get("logprobs") or {}).get("content")) or []
            if not content:
                return Forecast.failure("reply has no logprobs", readout=LOGPROB)
            return Forecast.from_label_logprobs(
                label_logprobs(content[0].get("top_logprobs") or [])
            )
        message = choice.get("message") or {}
        if self.answer_mode == "tool":
            for call in message.get("tool_calls") or []:
                function = (call or {}).get("function") or {}
                if function.get("name") == TOOL_NAME:
                    return parse_forecast(str(function.get("arguments") or ""))
        return parse_forecast(message.get("content") or "")

    def _run(self, items: list[tuple[Messages, int]]) -> list[Forecast | BaseException]:
        def one(item: tuple[Messages, int]) -> Forecast | BaseException:
            try:
                return self._answer(item[0])
            except BackendError as exc:
                return exc

        if self.concurrency == 1 or len(items) == 1:
            return [one(item) for item in items]
        with ThreadPoolExecutor(
            max_workers=self.concurrency, thread_name_prefix="forecast"
        ) as pool:
            return list(pool.map(one, items))
