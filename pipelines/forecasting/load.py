"""`load_forecaster(ref)`: read what a reference names once, return the adapter of its kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from models.registry import SURROGATE_MODEL
from pipelines.forecasting.base import PairForecaster
from pipelines.forecasting.references import REFERENCES, reference_forecaster

CHAMPION = "champion"
# The champion for kernels from files (a user's, an LLM's mutation), when the registry keeps one
# apart from the in-distribution @champion; `kernelcast forecast` on files, the search hook and
# the autotune hook prefer it.
CHAMPION_EXTERNAL = "champion-external"
CLASSICAL_KINDS = ("cost_model", "text_model", "ensemble")


class WrongKind(ValueError):
    """The version is of a kind the caller does not take (raised before anything loads)."""


def file_champion_uri(tracking_uri: str | None, name: str = SURROGATE_MODEL, snapshot: Any = None) -> str | None:
    """models:/<name>@champion-external when that alias exists, else @champion when it exists,
    else None (nothing registered, or no tracking URI). `snapshot` (a
    pipelines.forecasting.snapshot.RegistrySnapshot of the store) answers what it read before
    and keeps what it did not."""
    if not tracking_uri:
        return None
    for alias in (CHAMPION_EXTERNAL, CHAMPION):
        if _alias_version(tracking_uri, alias, name, snapshot) is not None:
            return f"models:/{name}@{alias}"
    return None


def card_champion_uri(tracking_uri: str, hardware_id: str, fallback: str | None, name: str = SURROGATE_MODEL,
                      snapshot: Any = None) -> tuple[str | None, str]:
    """(the model URI that answers for `hardware_id`, a sentence saying which) when the caller
    named no model: the card's `@champion-<card>` (models.registry.hardware) when set; else
    `fallback` (the reference card's champion), with a sentence naming the card it was fitted on
    when that is not `hardware_id` (empty when it is, or when the registry does not say).
    `snapshot` answers what it read before, as in `file_champion_uri`."""
    from models.registry.hardware import REFERENCE_TAG, champion_alias

    alias = champion_alias(hardware_id)
    version = _alias_version(tracking_uri, alias, name, snapshot)
    if version is not None:
        return f"models:/{name}@{alias}", f"@{alias} (version {version}), fitted on {hardware_id}"
    reference = _model_tag(tracking_uri, name, REFERENCE_TAG, snapshot)
    if fallback is None or reference is None or reference == hardware_id:
        return fallback, ""
    return fallback, (f"no version fitted on {hardware_id} (@{alias} is not set): "
                      f"{fallback} answers, fitted on {reference}")


def _through_snapshot(snapshot: Any, held: Any, read: Any, keep: Any) -> Any:
    """`read()` from the store, unless the snapshot `held()` it as (True, value); a value read
    from the store is kept in the snapshot."""
    usable = snapshot is not None and snapshot.enabled
    if usable:
        known, value = held()
        if known:
            return value
    value = read()
    if usable:
        keep(value)
    return value


def _model_tag(tracking_uri: str, name: str, key: str, snapshot: Any) -> str | None:
    """A tag of the registered model, through the snapshot when there is one."""
    from models.registry.hardware import model_tag

    return _through_snapshot(snapshot, lambda: snapshot.model_tag(name, key),
                             lambda: model_tag(tracking_uri, name, key),
                             lambda value: snapshot.remember_model_tag(name, key, value))


def _alias_version(tracking_uri: str, alias: str, name: str, snapshot: Any) -> int | None:
    """models.registry.versions.alias_version, through the snapshot when there is one."""
    from models.registry.versions import alias_version

    return _through_snapshot(snapshot, lambda: snapshot.alias(name, alias),
                             lambda: alias_version(tracking_uri, alias, name),
                             lambda version: snapshot.remember_alias(name, alias, version))


def resolve_version(tracking_uri: str, ref: str, snapshot: Any = None) -> tuple[str, int, dict[str, Any]]:
    """(model name, version, version_info) of "models:/name/N", "models:/name@alias" or
    "kind:<kind>" (the newest version of that kind of the surrogate's model fitted on its
    reference card, models.registry.hardware). `snapshot` (a RegistrySnapshot of the store)
    answers aliases and versions it read before.

    Raises:
        ValueError: a malformed reference, or one that points at no version (one line).
    """
    from models.registry.versions import parse_model_uri

    if ref.startswith("kind:"):
        from models.registry.hardware import reference_versions

        kind = ref.removeprefix("kind:")
        found = reference_versions(tracking_uri, SURROGATE_MODEL, kind=kind)  # never another card's version
        if not found:
            raise ValueError(f"no registered version of kind {kind!r}: run `kernelcast run` first")
        return SURROGATE_MODEL, found[0]["version"], found[0]
    name, alias, number = parse_model_uri(ref)
    version = _alias_version(tracking_uri, alias, name, snapshot) if alias else number
    info = _version_info(tracking_uri, version, name, snapshot) if version is not None else None
    if info is None:
        raise ValueError(f"{ref} points at no version in {tracking_uri}")
    return name, int(version), info


def _version_info(tracking_uri: str, version: int, name: str, snapshot: Any) -> dict[str, Any] | None:
    """models.registry.versions.version_info, through the snapshot when there is one."""
    held = snapshot.version(name, version) if snapshot is not None and snapshot.enabled else None
    if held is not None:
        return held
    from models.registry.versions import version_info

    info = version_info(tracking_uri, version, name)
    if info is not None and snapshot is not None and snapshot.enabled:
        snapshot.remember_version(name, version, info)
    return info


def load_forecaster(
    ref: str,
    *,
    tracking_uri: str | None = None,
    home: str | Path | None = None,
    committed_dir: str | Path | None = None,
    training_pairs: pl.DataFrame | None = None,
    warehouse_path: str | Path | None = None,
    hardware: dict[str, dict[str, Any]] | None = None,
    readout: str = "logprob",
    style: str | None = None,
    endpoint: str | None = None,
    answer_mode: str = "text",
    device: str | None = None,
    cache: bool = True,
    use_committed: bool = True,
    kinds: tuple[str, ...] | None = None,
    snapshot: bool = False,
) -> PairForecaster:
    """The forecaster `ref` names, as an adapter answering `forecast_pairs(pairs, kernels)`.

    Args:
        ref: "models:/<name>/<N>", "models:/<name>@<alias>" or "kind:<kind>" (a registered
            version: its `kind` tag picks the adapter), "h200:<variant>" (committed
            forecasts), "baseline:uniform" | "baseline:bin_prior" | "baseline:oracle",
            "base:<spec>" or a bare spec ("smollm2", "tiny", a local checkpoint folder), or,
            with `endpoint`, the model name the server serves.
        tracking_uri: MLflow tracking URI (registered versions).
        home: KERNELCAST_HOME (adapter downloads, base models, the forecast cache).
        committed_dir: the committed run folder; a registered LLM version tagged
            `committed_variant` answers from it when it holds that variant (and `use_committed`).
        training_pairs: the pairs the bin prior counts (task and true_bin or speedup).
        warehouse_path: where language models find the devices' fingerprints for prompts.
        hardware: hardware_id -> fingerprint, taking precedence over the warehouse.
        readout: "logprob" | "verbalized" (language models).
        style: prompt style; default the version's training style ("diff" for a base model,
            "full" for an endpoint).
        endpoint: an OpenAI-compatible server URL.
        answer_mode: with an endpoint and the verbalized readout: text | json_schema | tool.
        device: where a language model runs (None: cuda when available).
        cache: keep language-model answers in <home>/forecast-cache.
        use_committed: False forces a committed-tagged version to load its weights (a code-embed
            version: to read every pair with its head, pipelines.forecasting.embed).
        kinds: the registered kinds the caller takes (None: all); another kind raises WrongKind
            before its model loads.
        snapshot: read the registry through the home's snapshot (pipelines.forecasting.snapshot:
            aliases, versions and cost models kept from an earlier read of the unchanged store),
            so a command starts without MLflow; a cost model then answers as its portable twin
            (the same forecasts, `model` a PortableCostModel instead of the CostModel).
    Raises:
        ValueError: a reference that names nothing loadable, or what it needs is missing (one line).
        WrongKind: a registered version not of `kinds`.
    """
    ref = str(ref).strip()
    if ref in REFERENCES:
        return reference_forecaster(ref, training_pairs)
    if ref.startswith("baseline:"):
        raise ValueError(f"unknown reference forecaster {ref!r}; known: {', '.join(REFERENCES)}")
    if readout not in ("logprob", "verbalized"):
        raise ValueError(f"readout must be logprob or verbalized, got {readout!r}")
    if style is not None and style.removesuffix("+features") not in ("full", "diff", "compact"):
        raise ValueError(f"style must be full, diff or compact (optionally +features), got {style!r}")
    home = Path(home) if home is not None else Path(".kernelcast")
    cache_dir = home / "forecast-cache" if cache else None
    from pipelines.forecasting.language import HardwareTable

    table = HardwareTable(warehouse_path, hardware)
    if endpoint is not None:
        return _endpoint(ref, endpoint, readout, style or "full", answer_mode, cache_dir, table)
    if ref.startswith("h200:"):
        from pipelines.forecasting.committed import CommittedForecaster

        if committed_dir is None:
            raise ValueError(f"{ref} needs the committed run folder (committed_dir)")
        return CommittedForecaster(Path(committed_dir), ref.removeprefix("h200:"))
    if ref.startswith(("models:/", "kind:")):
        if not tracking_uri:
            raise ValueError(f"{ref} needs the MLflow tracking URI")
        from pipelines.forecasting.snapshot import RegistrySnapshot

        snap = RegistrySnapshot(home, tracking_uri) if snapshot else None
        return _registered(ref, tracking_uri, home, committed_dir, readout, style, device, cache_dir, table,
                           use_committed, kinds, snap)
    return _base(ref.removeprefix("base:"), home, readout, style or "diff", device, cache_dir, table)


def _registered(ref, tracking_uri, home, committed_dir, readout, style, device, cache_dir, table, use_committed, kinds,
                snapshot=None):
    name, version, info = resolve_version(tracking_uri, ref, snapshot)
    tags = info.get("tags", {})
    kind, stored = tags.get("kind", "llm"), f"models:/{name}/{int(version)}"
    if kinds is not None and kind not in kinds:
        raise WrongKind(f"{ref} is a {kind} version")
    if kind in CLASSICAL_KINDS:
        from pipelines.forecasting.classical import ClassicalForecaster

        model = snapshot.cost_model(name, version, info) if snapshot is not None and kind == "cost_model" else None
        if model is None:  # MLflow and scikit-learn imported only here
            from models.classical.registry import load_classical

            model = load_classical(tracking_uri, name, version)
            if snapshot is not None and kind == "cost_model":
                model = _kept(snapshot, name, version, info, model)
        adapter = ClassicalForecaster(model, stored, kind)
        adapter.source = f"registered {kind} {ref} (version {version})"
    elif kind != "llm":
        raise ValueError(f"{ref} is a version of unknown kind {kind!r}")
    else:
        from pipelines.forecasting.committed import CommittedForecaster, committed_variant_names

        variant = tags.get("committed_variant")
        held = bool(use_committed and variant and variant in committed_variant_names(committed_dir))
        if tags.get("finetune") == "embed_head":  # boosted trees on the base model's reading: no adapter
            from pipelines.forecasting.embed import embed_forecaster

            committed = CommittedForecaster(Path(committed_dir), variant, stored) if held else None
            adapter = embed_forecaster(tracking_uri, name, version, info, home, committed, table, device, stored, ref)
        elif held:
            adapter = CommittedForecaster(Path(committed_dir), variant, stored)
        elif _committed_only(tags):
            raise ValueError(f"{ref} has no weights to run here ({variant}: committed H200 forecasts only); it answers "
                             f"the pairs of its run from a committed run folder holding {variant}, and none is in use")
        else:
            adapter = _registered_llm(tracking_uri, name, version, tags, home, readout, style, device, cache_dir,
                                      table, stored, ref)
    adapter.version, adapter.uri, adapter.model_name = version, ref, name
    return adapter


def _kept(snapshot: Any, name: str, version: int, info: dict[str, Any], model: Any) -> Any:
    """The cost model's portable twin, kept in the snapshot; the model itself where the twin
    cannot reproduce it (a loss other than squared error)."""
    try:
        return snapshot.keep_cost_model(name, version, info, model)
    except ValueError:
        return model


def _committed_only(tags: dict[str, str]) -> bool:
    from models.registry.versions import COMMITTED_ONLY, WEIGHTS_TAG

    return tags.get(WEIGHTS_TAG) == COMMITTED_ONLY


def _fits(backend: Any, readout: str):
    from pipelines.forecasting.context import LOGPROB_ANSWER_TOKENS, check_prompt_fits

    budget = LOGPROB_ANSWER_TOKENS if readout == "logprob" else backend.max_new_tokens
    return lambda messages: check_prompt_fits(backend.tokenizer, backend.model.config, messages, budget)


def _registered_llm(tracking_uri, name, version, tags, home, readout, style, device, cache_dir, table, stored, ref):
    from models.registry.lifecycle import registered_forecaster
    from pipelines.forecasting.language import LanguageForecaster
    from pipelines.forecasting.llm_shards import version_calibrator

    try:
        backend, info = registered_forecaster(tracking_uri, version, home, cache_dir=cache_dir, readout=readout,
                                              name=name, device=device)
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from None
    adapter = LanguageForecaster(backend, stored, style or info["prompt_style"], version_calibrator(tags), table,
                                 f"registered surrogate {ref} (version {version}, reward {info['reward'] or 'unknown'})",
                                 _fits(backend, readout), readout)
    return adapter


def _base(spec, home, readout, style, device, cache_dir, table):
    from models.backends.transformers_backend import TransformersAnswerer
    from models.base_model import resolve_base_model
    from models.cache import ForecastCache
    from pipelines.forecasting.language import LanguageForecaster

    try:
        path = resolve_base_model(spec, home)
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from None
    backend = TransformersAnswerer(str(path), readout=readout, batch_size=1, device=device,
                                     cache=ForecastCache(cache_dir) if cache_dir else None)
    source = "base model" if spec.strip().lower() in ("smollm2", "tiny") else "local checkpoint"
    return LanguageForecaster(backend, backend.model_ref, style, None, table, source, _fits(backend, readout), readout)


def _endpoint(model, endpoint, readout, style, answer_mode, cache_dir, table):
    from models.backends.openai_backend import ANSWER_MODES, OpenAIAnswerer
    from models.cache import ForecastCache
    from pipelines.forecasting.language import LanguageForecaster

    if not model:
        raise ValueError("an endpoint needs the served model name")
    if answer_mode not in ANSWER_MODES:
        raise ValueError(f"answer mode must be one of {', '.join(ANSWER_MODES)}, got {answer_mode!r}")
    backend = OpenAIAnswerer(endpoint, model, use_logprobs=readout == "logprob", answer_mode=answer_mode,
                               cache=ForecastCache(cache_dir) if cache_dir else None)
    return LanguageForecaster(backend, backend.model_ref, style, None, table, f"OpenAI-compatible endpoint {endpoint}",
                              None, readout)
