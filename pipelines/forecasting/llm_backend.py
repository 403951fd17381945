"""Which backend answers the LLM forecasts made here, as one value handed down from the
orchestration's LLM-backend resource (orchestration.resources.LlmBackendResource).

Kinds:
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
from typing import Any

LLM_BACKENDS = ("transformers", "vllm", "openai", "committed")


@dataclass(frozen=True)
class LlmBackend:
    kind: str = "transformers"
    base_url: str = ""
    model: str = ""
    api_key: str = ""
    vllm_python: str = ""

    def __post_init__(self) -> None:
        if self.kind not in LLM_BACKENDS:
            raise ValueError(f"unknown LLM backend {self.kind!r}; one of {', '.join(LLM_BACKENDS)}")
        if self.kind == "openai" and not self.base_url:
            raise ValueError("the openai LLM backend needs the server's base_url (e.g. http://127.0.0.1:8000/v1)")

    @property
    def forecasts_here(self) -> bool:
        """Whether language models make forward passes here (every kind but committed)."""
        return self.kind != "committed"

    def base_forecaster(self, spec: str, home: Path, device: str, cache: Any):
        """The forecaster of a base language model ('smollm2', 'tiny' or a checkpoint folder)."""
        from models.base_model import resolve_base_model

        self._refuse_committed(f"base:{spec}")
        if self.kind == "openai":
            return self._served(f"base:{spec}", cache)
        path = resolve_base_model(spec, home)
        if self.kind == "vllm":
            from models.backends.vllm_backend import VLLMOfflineForecaster

            return VLLMOfflineForecaster(path, python=self.vllm_python or None, cache=cache)
        from models.backends.transformers_backend import TransformersForecaster

        return TransformersForecaster(str(path), readout="logprob", batch_size=1, device=device, cache=cache)

    def registered_forecaster(self, tracking_uri: str, name: str, version: int, model_ref: str, home: Path,
                              device: str, downloads: Path, cache: Any) -> tuple[Any, str]:
        """(the forecaster of a registered LLM version, the prompt style it reads).

        Raises:
            FileNotFoundError: the version does not exist.
        """
        from models.registry.lifecycle import registered_forecaster, registered_prompt_style

        self._refuse_committed(model_ref)
        if self.kind == "openai":
            return self._served(model_ref, cache), registered_prompt_style(tracking_uri, version, downloads, name)
        loaded, described = registered_forecaster(tracking_uri, version, home, cache_dir=None, name=name,
                                                  device="cpu" if self.kind == "vllm" else device,
                                                  downloads=downloads)
        if self.kind == "transformers":
            loaded.cache = cache
            return loaded, described["prompt_style"]
        from models.backends.vllm_backend import VLLMOfflineForecaster

        merged = _merged_checkpoint(loaded, home / "surrogates" / "merged" / loaded.model_ref.replace("/", "_"))
        return (VLLMOfflineForecaster(merged, python=self.vllm_python or None, cache=cache, model_ref=loaded.model_ref),
                described["prompt_style"])

    def _served(self, model_ref: str, cache: Any):
        from models.backends.openai_backend import OpenAIForecaster

        return OpenAIForecaster(self.base_url, self.model or model_ref, api_key=self.api_key or None,
                                use_logprobs=True, cache=cache)

    def _refuse_committed(self, model_ref: str) -> None:
        if not self.forecasts_here:
            raise ValueError(f"{model_ref} has no committed forecasts and the committed LLM backend makes no forward pass")


def _merged_checkpoint(forecaster: Any, folder: Path) -> Path:
    """The adapter of a loaded version merged into its base weights, saved once as a plain
    checkpoint (what vLLM's engine loads)."""
    if not (folder / "config.json").is_file():
        model = forecaster.model.merge_and_unload() if hasattr(forecaster.model, "merge_and_unload") else forecaster.model
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(folder))
        forecaster.tokenizer.save_pretrained(str(folder))
    return folder
