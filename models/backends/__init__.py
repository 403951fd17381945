"""Prompt answerers: the ways to run a language model on forecasting prompts, behind one interface.

They answer prompts, not pairs: pipelines.forecasting.language.LanguageForecaster (the product's
one forecaster type) builds the prompts of its pairs and reads their answers through whichever
is loaded.

`PromptAnswerer.forecast(requests, repeats)` returns one `Forecast` per (request, repeat), in
request-major order ([r0 rep0, r0 rep1, ..., r1 rep0, ...]), with tokens and latency filled.
Implementations:

- `TransformersAnswerer` (`models.backends.transformers_backend`): an HF causal LM in
  process; logprob readout (one forward pass per batch) or verbalized (batched generation).
- `OpenAIAnswerer` (`models.backends.openai_backend`): any OpenAI-compatible chat
  completions server (vLLM, llama.cpp server, hosted APIs), threads for concurrency.
- `VLLMOfflineAnswerer` (`models.backends.vllm_backend`): vLLM's offline engine in a child
  process under the vLLM venv's python; logprob readout (the eight label logprobs) or
  verbalized (optionally with structured outputs); `VLLMEngine` shares one engine.

`make_answerer(name, **kwargs)` builds one by name ("transformers", "openai", "vllm").

This base class does what every backend shares: the optional `ForecastCache` (a rerun costs
nothing), repeats (a deterministic readout - logprob, or greedy decoding - is computed once
and copied to every repeat, since every repeat would give the same answer), and the rule
that a transport failure raises `BackendError` only after every answer that did arrive has
been cached, so a rerun resumes where it stopped.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from models.cache import ForecastCache, cache_key
from models.forecast import Forecast

log = logging.getLogger(__name__)

Messages = list[dict[str, str]]
Progress = Callable[[int, int], None]


class BackendError(RuntimeError):
    """The model could not be reached or refused the request (not a parse failure)."""


@dataclass(frozen=True)
class ForecastRequest:
    """One prompt to forecast.

    Attributes:
        messages: chat messages from `models.prompts.build_prompt`.
        request_id: the caller's id (e.g. a pair id), carried for logging only.
    """

    messages: Messages
    request_id: str | None = field(default=None)


class PromptAnswerer(ABC):
    """Base class of the backends; subclasses implement `_run` and `cache_params`.

    Attributes:
        model_ref: names the model in cache keys and forecast rows.
        readout: "verbalized" or "logprob".
        cache: an optional ForecastCache.
    """

    model_ref: str
    readout: str
    cache: ForecastCache | None = None
    progress_chunk: int = 8  # items per progress report; subclasses match it to their batching

    @abstractmethod
    def cache_params(self) -> dict[str, Any]:
        """Every setting that can change an answer (sampling, readout knobs), for cache keys."""

    @abstractmethod
    def is_deterministic(self) -> bool:
        """True when every repeat would give the same answer (logprob readout, greedy decoding)."""

    @abstractmethod
    def _run(self, items: list[tuple[Messages, int]]) -> list[Forecast | BaseException]:
        """Answer (messages, repeat) items; a transport failure is returned, not raised."""

    def forecast(
        self,
        requests: Sequence[ForecastRequest],
        repeats: int = 1,
        progress: Progress | None = None,
    ) -> list[Forecast]:
        """Forecast every request `repeats` times.

        Args:
            requests: prompts to forecast.
            repeats: samples per request (>= 1).
            progress: optional callback(done, total) over the model calls actually made.
        Returns:
            len(requests) * repeats forecasts, request-major, each with `repeat` set.
        Raises:
            BackendError: a request failed after the backend's retries (the others are cached).
        """
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        deterministic = self.is_deterministic()
        params = self.cache_params()
        slots: list[tuple[int, int]] = [
            (i, r) for i in range(len(requests)) for r in range(repeats)
        ]
        keys: list[str] = []
        todo: dict[str, tuple[Messages, int]] = {}  # unique misses, insertion-ordered
        found: dict[str, Forecast] = {}
        for i, r in slots:
            effective_repeat = 0 if deterministic else r
            messages = requests[i].messages
            key = cache_key(self.model_ref, messages, self.readout, params, effective_repeat)
            keys.append(key)
            if key in found or key in todo:
                continue
            hit = self.cache.get(key) if self.cache is not None else None
            if hit is not None:
                found[key] = hit
            else:
                todo[key] = (messages, effective_repeat)
        if found:
            log.info("forecast cache: %d hits, %d to compute", len(found), len(todo))
        errors: list[BaseException] = []
        if todo:
            todo_keys = list(todo)
            answers = self._run_with_progress([todo[k] for k in todo_keys], progress)
            for key, answer in zip(todo_keys, answers, strict=True):
                if isinstance(answer, BaseException):
                    errors.append(answer)
                    continue
                found[key] = answer
                if self.cache is not None:
                    self.cache.put(key, answer)
        if errors:
            raise BackendError(
                f"{len(errors)} of {len(todo)} requests failed; first: {errors[0]}"
            ) from errors[0]
        return [found[key].with_meta(repeat=r) for key, (_, r) in zip(keys, slots, strict=True)]

    def _run_with_progress(
        self, items: list[tuple[Messages, int]], progress: Progress | None
    ) -> list[Forecast | BaseException]:
        """`_run`, in chunks when a progress callback wants to hear about it."""
        if progress is None:
            return self._run(items)
        chunk = max(1, self.progress_chunk)
        out: list[Forecast | BaseException] = []
        for start in range(0, len(items), chunk):
            out.extend(self._run(items[start : start + chunk]))
            progress(len(out), len(items))
        return out


# Backend name -> (module, class), for `make_answerer` and the lazy re-exports below.
BACKENDS: dict[str, tuple[str, str]] = {
    "transformers": ("models.backends.transformers_backend", "TransformersAnswerer"),
    "openai": ("models.backends.openai_backend", "OpenAIAnswerer"),
    "vllm": ("models.backends.vllm_backend", "VLLMOfflineAnswerer"),
}
_EXPORTS = {cls: module for module, cls in BACKENDS.values()}
_EXPORTS["VLLMEngine"] = "models.backends.vllm_backend"


def make_answerer(backend: str, **kwargs: Any) -> PromptAnswerer:
    """A PromptAnswerer by backend name; kwargs go to its constructor.

    Args:
        backend: "transformers" (in process), "openai" (a chat completions server) or
            "vllm" (vLLM's offline engine in a child process).
        **kwargs: the backend's constructor arguments (e.g. model=..., readout=...).
    Raises:
        ValueError: an unknown name.

    >>> make_answerer("nope")
    Traceback (most recent call last):
    ...
    ValueError: unknown forecasting backend 'nope'; one of openai, transformers, vllm
    """
    if backend not in BACKENDS:
        raise ValueError(
            f"unknown forecasting backend {backend!r}; one of {', '.join(sorted(BACKENDS))}"
        )
    import importlib

    module, cls = BACKENDS[backend]
    return getattr(importlib.import_module(module), cls)(**kwargs)


def __getattr__(name: str) -> Any:
    # Lazy re-exports: importing the package must not import torch/transformers.
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(name)


__all__ = [
    "BackendError",
    "Forecast",
    "ForecastRequest",
    "OpenAIAnswerer",
    "PromptAnswerer",
    "TransformersAnswerer",
    "VLLMEngine",
    "VLLMOfflineAnswerer",
    "make_answerer",
]
