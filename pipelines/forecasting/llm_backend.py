"""Which backend answers the LLM forecasts made here: one class per backend, made once by
`llm_backend` from the orchestration's LLM-backend resource (orchestration.resources.LlmBackendResource)
and handed down to the shards.

Kinds (the resource's `kind`):
    transformers  the model in this process (models.backends.transformers_backend), on the step's device
    vllm          vLLM's offline engine in a child process under `vllm_python` (default: see
                  models.backends.vllm_backend.resolve_vllm_python); a registered version's LoRA
                  adapter is merged into its base model once, under <home>/surrogates/merged/
    openai        an OpenAI-compatible server at `base_url` that serves the model: `model` names
                  it there (default: the forecast's model_ref, e.g. models:/kernelcast-surrogate/3
                  or base:smollm2), `api_key` its bearer token
    committed     the committed GPU forecasts alone: no forward pass is made here, and a language
                  model without committed forecasts is not forecast
Whatever the kind, a registered version with committed GPU forecasts answers from them
(pipelines.forecasting.registered). Every kind reads out log-probabilities of the eight bin labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

LLM_BACKENDS = ("transformers", "vllm", "openai", "committed")


@dataclass(frozen=True)
class LlmBackend:
    """What answers a language model's forecasts here; one subclass per backend, made by
    `llm_backend` from the resource's settings.

    A subclass answers `base_forecaster` and `registered_forecaster`; `forecasts_here` says
    whether it makes forward passes at all.
    """

    kind: ClassVar[str]
    forecasts_here: ClassVar[bool] = True

    def base_forecaster(self, spec: str, home: Path, device: str, cache: Any):
        """The forecaster of a base language model ('smollm2', 'tiny' or a checkpoint folder)."""
        raise NotImplementedError

    def registered_forecaster(self, tracking_uri: str, name: str, version: int, model_ref: str, home: Path,
                              device: str, downloads: Path, cache: Any) -> tuple[Any, str]:
        """(the forecaster of a registered LLM version, the prompt style it reads).

        Raises:
            FileNotFoundError: the version does not exist.
        """
        raise NotImplementedError


@dataclass(frozen=True)
class TransformersBackend(LlmBackend):
    """The model in this process, on the step's device."""

    kind: ClassVar[str] = "transformers"

    def base_forecaster(self, spec: str, home: Path, device: str, cache: Any):
        from models.backends.transformers_backend import TransformersAnswerer
        from models.base_model import resolve_base_model

        path = resolve_base_model(spec, home)
        return TransformersAnswerer(str(path), readout="logprob", batch_size=1, device=device, cache=cache)

    def registered_forecaster(self, tracking_uri: str, name: str, version: int, model_ref: str, home: Path,
                              device: str, downloads: Path, cache: Any) -> tuple[Any, str]:
        from models.registry.lifecycle import registered_forecaster

        loaded, described = registered_forecaster(tracking_uri, version, home, cache_dir=None, name=name,
                                                  device=device, downloads=downloads)
        loaded.cache = cache
        return loaded, described["prompt_style"]


@dataclass(frozen=True)
class VllmBackend(LlmBackend):
    """vLLM's offline engine in a child process under `vllm_python` (empty: the default
    interpreter, models.backends.vllm_backend.resolve_vllm_python)."""

    kind: ClassVar[str] = "vllm"
    vllm_python: str = ""

    def base_forecaster(self, spec: str, home: Path, device: str, cache: Any):
        from models.backends.vllm_backend import VLLMOfflineAnswerer
        from models.base_model import resolve_base_model

        return VLLMOfflineAnswerer(resolve_base_model(spec, home), python=self.vllm_python or None, cache=cache)

    def registered_forecaster(self, tracking_uri: str, name: str, version: int, model_ref: str, home: Path,
                              device: str, downloads: Path, cache: Any) -> tuple[Any, str]:
        from models.backends.vllm_backend import VLLMOfflineAnswerer
        from models.registry.lifecycle import registered_forecaster

        # Loaded on the CPU only to merge its adapter: the engine loads the merged checkpoint.
        loaded, described = registered_forecaster(tracking_uri, version, home, cache_dir=None, name=name,
                                                  device="cpu", downloads=downloads)
        merged = _merged_checkpoint(loaded, home / "surrogates" / "merged" / loaded.model_ref.replace("/", "_"))
        return (VLLMOfflineAnswerer(merged, python=self.vllm_python or None, cache=cache, model_ref=loaded.model_ref),
                described["prompt_style"])


@dataclass(frozen=True)
class OpenAIBackend(LlmBackend):
    """An OpenAI-compatible server at `base_url` serving the model: `model` names it there
    (empty: the forecast's model ref), `api_key` its bearer token."""

    kind: ClassVar[str] = "openai"
    base_url: str = ""
    model: str = ""
    api_key: str = ""

    def __post_init__(self) -> None:
        if not self.base_url:
            raise ValueError("the openai LLM backend needs the server's base_url (e.g. http://127.0.0.1:8000/v1)")

    def base_forecaster(self, spec: str, home: Path, device: str, cache: Any):
        return self._served(f"base:{spec}", cache)

    def registered_forecaster(self, tracking_uri: str, name: str, version: int, model_ref: str, home: Path,
                              device: str, downloads: Path, cache: Any) -> tuple[Any, str]:
        from models.registry.lifecycle import registered_prompt_style

        return self._served(model_ref, cache), registered_prompt_style(tracking_uri, version, downloads, name)

    def _served(self, model_ref: str, cache: Any):
        from models.backends.openai_backend import OpenAIAnswerer

        return OpenAIAnswerer(self.base_url, self.model or model_ref, api_key=self.api_key or None,
                                use_logprobs=True, cache=cache)


@dataclass(frozen=True)
class CommittedBackend(LlmBackend):
    """The committed GPU forecasts alone: every forward pass is refused."""

    kind: ClassVar[str] = "committed"
    forecasts_here: ClassVar[bool] = False

    def base_forecaster(self, spec: str, home: Path, device: str, cache: Any):
        raise self._refused(f"base:{spec}")

    def registered_forecaster(self, tracking_uri: str, name: str, version: int, model_ref: str, home: Path,
                              device: str, downloads: Path, cache: Any) -> tuple[Any, str]:
        raise self._refused(model_ref)

    @staticmethod
    def _refused(model_ref: str) -> ValueError:
        return ValueError(f"{model_ref} has no committed forecasts and the committed LLM backend makes no forward pass")


def llm_backend(kind: str = "transformers", base_url: str = "", model: str = "", api_key: str = "",
                vllm_python: str = "") -> LlmBackend:
    """The backend of `kind` with the settings it reads (the others are ignored).

    >>> llm_backend("vllm", vllm_python="/opt/vllm/bin/python")
    VllmBackend(vllm_python='/opt/vllm/bin/python')
    >>> llm_backend("committed").forecasts_here
    False

    Raises:
        ValueError: an unknown kind, or the openai kind without its base_url (one line).
    """
    if kind == "transformers":
        return TransformersBackend()
    if kind == "vllm":
        return VllmBackend(vllm_python)
    if kind == "openai":
        return OpenAIBackend(base_url, model, api_key)
    if kind == "committed":
        return CommittedBackend()
    raise ValueError(f"unknown LLM backend {kind!r}; one of {', '.join(LLM_BACKENDS)}")


def _merged_checkpoint(forecaster: Any, folder: Path) -> Path:
    """The adapter of a loaded version merged into its base weights, saved once as a plain
    checkpoint (what vLLM's engine loads)."""
    if not (folder / "config.json").is_file():
        model = forecaster.model.merge_and_unload() if hasattr(forecaster.model, "merge_and_unload") else forecaster.model
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(folder))
        forecaster.tokenizer.save_pretrained(str(folder))
    return folder
