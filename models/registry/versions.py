"""The surrogate in the MLflow model registry: log, register, alias, resolve, load, lineage.

A registered version is an MLflow model logged in its training run. The LLM surrogate is a
LoRA adapter logged with MLflow's transformers flavour (peft adapter + tokenizer; the base model
is referenced by its local path, `base_model_path`, never copied), with a signature (a prompt
string in, the generated answer out) and metadata naming the base model spec and the prompt
style. It is registered from the logged model (source `models:/<model_id>`), so the MLflow UI
links version, run and model, and it loads the way MLflow users expect:

    mlflow.pyfunc.load_model("models:/kernelcast-surrogate@champion")          # text generation
    mlflow.transformers.load_model("models:/kernelcast-surrogate@champion",    # the flavour's loader
                                   return_type="components", base_model_path=base_dir)
    local = resolve_surrogate(uri, "models:/kernelcast-surrogate@champion", dst)
    model, tokenizer = load_surrogate(local, resolve_base_model("smollm2"))    # our readouts

Versions carry the tags `kind` (llm, cost_model, text_model: every kind is a version of the same
model and promotion weighs them alike), `dataset_version` (the dataset version of the run that
registered it, whose eval pairs it is scored on), `trained_dataset_version` (the one its fit
used: the same for a version trained here, an older one for an adapter trained on a GPU host;
the warehouse's `model_lineage` row names the same) and base_model. Promotion moves aliases,
never stages (deprecated in MLflow), one pair per use: `@champion` (the version forecasts of the eval pairs
are served from) and `@challenger` (the best candidate of the last promotion that is not the
champion), `@champion-external` (kernels from files) and `@challenger-external` beside it;
`set_aliases` moves a pair at once, `aliases` reads all four, `clear_alias` removes one. `register_logged_model` is the
generic part any kind of model uses (e.g. a scikit-learn forecaster logged with
`mlflow.sklearn.log_model`).

This module never imports dagster; the tracking URI is a plain string.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from models.registry import SURROGATE_MODEL

log = logging.getLogger(__name__)

MODEL_ARTIFACT = "surrogate"  # the logged model's name in its run
BASE_MODEL_FILE = "base_model.json"
ALIASES = ("champion", "challenger", "champion-external", "challenger-external")  # -external: kernels from files
CARD_ALIAS = re.compile(r"^champion-(?!external$)[a-z0-9][a-z0-9-]*$")  # champion-h100, not champion-external


def is_card_alias(alias: str) -> bool:
    """Whether an alias is a card's champion.

    >>> is_card_alias("champion-h100"), is_card_alias("champion-external"), is_card_alias("champion")
    (True, False, False)
    """
    return bool(CARD_ALIAS.match(alias))


# Each champion alias and the challenger alias beside it (a promotion moves the pair together).
CHALLENGER_OF = {"champion": "challenger", "champion-external": "challenger-external"}
KINDS = ("llm", "cost_model", "text_model", "ensemble")
# A version without weights that run here (a head, GRPO, a LoRA whose adapter is not committed)
# answers only the pairs of its run from committed forecasts: tag WEIGHTS_TAG says so, it is no
# model of kernel sources, and promotion never makes it a champion (`committed_only`).
WEIGHTS_TAG = "weights"
COMMITTED_ONLY = "committed forecasts only"
# A code-embed version's tag naming its run's artifact of what a new pair needs (embed-head-<variant>.zip).
EMBED_HEAD_TAG = "embed_head_artifact"
# Requirements of the logged adapter, pinned as the project pins them (pyproject.toml); stating them
# spares MLflow from inferring them by loading the model in a subprocess.
ADAPTER_REQUIREMENTS = ("torch==2.13.0", "transformers==5.17.0", "peft==0.21.2", "accelerate==1.15.0")
# models:/<name>@<alias> or models:/<name>/<version>
_MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[\w.-]+)|/(?P<version>\d+))$")


def _client(tracking_uri: str):
    import mlflow
    from mlflow import MlflowClient

    from models.registry.tracking import open_store

    open_store(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    return MlflowClient(tracking_uri, registry_uri=tracking_uri)


def register_logged_model(
    tracking_uri: str,
    model_uri: str,
    name: str = SURROGATE_MODEL,
    run_id: str | None = None,
    kind: str = "llm",
    tags: Mapping[str, str] | None = None,
    alias: str | None = None,
    description: str | None = None,
) -> int:
    """Register a logged MLflow model (any flavour) as a new version of `name`.

    Args:
        tracking_uri: MLflow tracking (and registry) URI.
        model_uri: the logged model, `ModelInfo.model_uri` (`models:/<model_id>`).
        name: registered model name (created when missing).
        run_id: the run that logged it.
        kind: the version's `kind` tag (one of KINDS).
        tags: further version tags (dataset_version, reward, training_key, ...).
        alias: optionally point this alias (one of ALIASES) at the new version.
        description: the version's description.
    Returns:
        The new version number.
    Raises:
        ValueError: an alias outside ALIASES or a kind outside KINDS.
    """
    if alias is not None and alias not in ALIASES:
        raise ValueError(f"alias must be one of {ALIASES}, got {alias!r}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    try:
        client.create_registered_model(name)
    except MlflowException as exc:
        if "RESOURCE_ALREADY_EXISTS" not in str(exc.error_code):
            raise
    version_tags = {"kind": kind, **{k: str(v) for k, v in (tags or {}).items()}}
    model_id = model_uri.removeprefix("models:/") if model_uri.startswith("models:/m-") else None
    mv = client.create_model_version(name, source=model_uri, run_id=run_id, tags=version_tags,
                                     description=description, model_id=model_id)
    version = int(mv.version)
    if alias:
        client.set_registered_model_alias(name, alias, str(version))
    log.info("registered %s version %d (%s)%s", name, version, kind, f" as @{alias}" if alias else "")
    return version


def committed_only(tags: Mapping[str, str]) -> bool:
    """Whether a version's tags say it holds only committed forecasts (it cannot forecast a new pair).

    >>> committed_only({"weights": "committed forecasts only"}), committed_only({"kind": "cost_model"})
    (True, False)
    """
    return tags.get(WEIGHTS_TAG) == COMMITTED_ONLY


def model_id_of(tracking_uri: str, version: int | str, name: str = SURROGATE_MODEL) -> str | None:
    """The LoggedModel id behind a registered version (None: registered from plain files)."""
    info = version_info(tracking_uri, version, name)
    source = (info or {}).get("source") or ""
    return source.removeprefix("models:/") if source.startswith("models:/m-") else None


def log_adapter_model(
    tracking_uri: str,
    run_id: str,
    adapter_dir: str | Path,
    base_model: str,
    base_model_path: str | Path,
    prompt_style: str | None = None,
    dataset_version: str | None = None,
) -> Any:
    """Log a saved LoRA adapter (+ tokenizer) as an MLflow transformers model in run `run_id`.

    Args:
        tracking_uri: MLflow tracking URI.
        run_id: the training run; the model is logged into it (artifact MODEL_ARTIFACT).
        adapter_dir: peft `save_pretrained` output with the tokenizer beside it.
        base_model: the base model spec ("smollm2", "tiny", a path), kept in the metadata.
        base_model_path: its local checkpoint, referenced (not copied) by the logged model.
        prompt_style: the prompt style it was trained with (forecasts must use the same).
        dataset_version: the dataset version it learned from (metadata).
    Returns:
        MLflow's ModelInfo (model_uri `models:/<model_id>`, model_id).
    """
    import mlflow
    import torch
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    _client(tracking_uri)
    adapter, tok_dir = _adapter_and_tokenizer(Path(adapter_dir))
    base = AutoModelForCausalLM.from_pretrained(str(base_model_path), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(adapter))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tok_dir if (tok_dir / "tokenizer.json").is_file()
                                                             else base_model_path))
    # Input: the chat prompt of models.prompts rendered to text; output: the generated answer
    # (a JSON object with predicted_bin and p, models.parsing).
    signature = ModelSignature(inputs=Schema([ColSpec("string", "prompt")]), outputs=Schema([ColSpec("string")]))
    metadata = {"kind": "llm", "base_model": base_model, "dataset_version": dataset_version or "",
                **({"prompt_style": prompt_style} if prompt_style else {})}
    with mlflow.start_run(run_id=run_id):
        return mlflow.transformers.log_model(
            transformers_model={"model": model, "tokenizer": tokenizer}, name=MODEL_ARTIFACT,
            task="text-generation", base_model_path=str(Path(base_model_path).resolve()), signature=signature,
            pip_requirements=list(ADAPTER_REQUIREMENTS), metadata=metadata,
        )


def register_surrogate(
    tracking_uri: str,
    run_id: str,
    adapter_dir: str | Path,
    name: str = SURROGATE_MODEL,
    base_model: str = "smollm2",
    dataset_version: str | None = None,
    alias: str | None = None,
    con: Any = None,
    dagster_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
    prompt_style: str | None = None,
    base_model_path: str | Path | None = None,
    trained_dataset_version: str | None = None,
    trained_dataset_held: bool = True,
) -> int:
    """Log a trained adapter as an MLflow model of its run and register it as a new version.

    Args:
        tracking_uri: MLflow tracking (and registry) URI.
        run_id: the training run; the adapter is logged into it as a transformers model.
        adapter_dir: the saved adapter + tokenizer (`TrainingResult.adapter_dir`).
        name: registered model name.
        base_model: the base model spec the adapter applies to (metadata, version tag).
        dataset_version: the dataset version it was trained on (version tag, lineage).
        alias: optionally point this alias ("champion"/"challenger") at the new version.
        con: a writable DuckDB connection: when given, a model_lineage row is recorded
            (needs dataset_version, registered in the warehouse).
        dagster_run_id: the orchestrating run, for the lineage row and a version tag.
        tags: extra version tags (e.g. reward, training_key, training_batch).
        prompt_style: the prompt style it was trained with (metadata, a version tag):
            forecasts must use the same style.
        base_model_path: the base checkpoint (default: `resolve_base_model(base_model)`).
        trained_dataset_version: the dataset version its fit used, when not `dataset_version`
            (an adapter trained on a GPU host from an older version): the version tag
            `trained_dataset_version`, the metadata and the lineage row name it.
        trained_dataset_held: whether the warehouse holds that version; False records the
            lineage row anyway, marked as not held, instead of refusing it.
    Returns:
        The new version number.
    Raises:
        ValueError: an alias outside ALIASES; lineage requested without a dataset version.
    """
    if alias is not None and alias not in ALIASES:
        raise ValueError(f"alias must be one of {ALIASES}, got {alias!r}")
    if con is not None and not dataset_version:
        raise ValueError("recording lineage needs the dataset_version")
    if base_model_path is None:
        from models.base_model import resolve_base_model

        base_model_path = resolve_base_model(base_model)
    client = _client(tracking_uri)
    run = client.get_run(run_id)
    trained = trained_dataset_version or dataset_version
    info = log_adapter_model(tracking_uri, run_id, adapter_dir, base_model, base_model_path, prompt_style, trained)
    version_tags = {"base_model": base_model, "dataset_version": dataset_version or "",
                    "trained_dataset_version": trained or ""}
    if not trained_dataset_held:
        version_tags["trained_dataset_held"] = "false"
    if dagster_run_id:
        version_tags["dagster_run_id"] = dagster_run_id
    if prompt_style:
        version_tags["prompt_style"] = prompt_style
    version_tags.update({k: str(v) for k, v in (tags or {}).items()})
    version = register_logged_model(
        tracking_uri, info.model_uri, name, run_id=run_id, kind="llm", tags=version_tags, alias=alias,
        description=f"LoRA adapter on {base_model}, trained on dataset {trained}"
                    + (" (not held by this warehouse)" if not trained_dataset_held else "")
                    + (f", scored on {dataset_version}" if dataset_version and dataset_version != trained else ""),
    )
    if con is not None:
        from warehouse.lineage import record_model_lineage

        record_model_lineage(
            con,
            name,
            version,
            trained,  # type: ignore[arg-type]
            mlflow_run_id=run_id,
            base_model=base_model,
            git_commit=run.data.tags.get("git_commit"),
            dagster_run_id=dagster_run_id or run.data.tags.get("dagster_run_id"),
            require_held=trained_dataset_held,
        )
    return version


def set_alias(tracking_uri: str, alias: str, version: int | str, name: str = SURROGATE_MODEL) -> None:
    """Point `alias` (one of ALIASES, or a card's champion-<card>: models.registry.hardware) at a
    version (promotion)."""
    if alias not in ALIASES and not is_card_alias(alias):
        raise ValueError(f"alias must be one of {ALIASES} or champion-<card>, got {alias!r}")
    _client(tracking_uri).set_registered_model_alias(name, alias, str(version))


def set_aliases(tracking_uri: str, champion: int | str | None = None, challenger: int | str | None = None,
                name: str = SURROGATE_MODEL, *, use: str = "champion", clear_challenger: bool = False,
                ) -> dict[str, int | None]:
    """A promotion's outcome in the registry for one use: the champion alias `use` ("champion" or
    "champion-external") and its challenger alias (CHALLENGER_OF) where given (None leaves an
    alias as it is, or removes the challenger with `clear_challenger`); a challenger equal to the
    champion is not set (the challenger is the best candidate that is *not* the champion) and an
    old one pointing there is removed.

    Returns:
        The pair afterwards, e.g. {"champion": N or None, "challenger": N or None}.
    Raises:
        ValueError: `use` is not a champion alias.
    """
    if use not in CHALLENGER_OF:
        raise ValueError(f"use must be one of {tuple(CHALLENGER_OF)}, got {use!r}")
    second = CHALLENGER_OF[use]
    if champion is not None:
        set_alias(tracking_uri, use, champion, name)
    current = alias_version(tracking_uri, use, name)
    if challenger is not None and (current is None or int(challenger) != current):
        set_alias(tracking_uri, second, challenger, name)
    elif challenger is None and clear_challenger:
        clear_alias(tracking_uri, second, name)
    if current is not None and alias_version(tracking_uri, second, name) == current:
        clear_alias(tracking_uri, second, name)
    return {alias: alias_version(tracking_uri, alias, name) for alias in (use, second)}


def aliases(tracking_uri: str, name: str = SURROGATE_MODEL) -> dict[str, int | None]:
    """Each alias of ALIASES -> its version, or None where it is not set."""
    return {alias: alias_version(tracking_uri, alias, name) for alias in ALIASES}


def clear_alias(tracking_uri: str, alias: str, name: str = SURROGATE_MODEL) -> None:
    """Remove `alias` (no error when it is not set)."""
    from mlflow.exceptions import MlflowException

    if alias not in ALIASES:
        raise ValueError(f"alias must be one of {ALIASES}, got {alias!r}")
    try:
        _client(tracking_uri).delete_registered_model_alias(name, alias)
    except MlflowException:
        pass


def alias_version(tracking_uri: str, alias: str, name: str = SURROGATE_MODEL) -> int | None:
    """The version `alias` points at, or None (no such model or alias)."""
    from mlflow.exceptions import MlflowException

    try:
        return int(_client(tracking_uri).get_model_version_by_alias(name, alias).version)
    except MlflowException:
        return None


def version_info(tracking_uri: str, version: int | str, name: str = SURROGATE_MODEL) -> dict[str, Any] | None:
    """{"version", "run_id", "tags", "source"} of one version, or None if it does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        mv = _client(tracking_uri).get_model_version(name, str(version))
    except MlflowException:
        return None
    return {"version": int(mv.version), "run_id": mv.run_id, "tags": dict(mv.tags), "source": mv.source}


def find_versions(tracking_uri: str, name: str = SURROGATE_MODEL, **tags: str) -> list[dict[str, Any]]:
    """Versions of `name` whose tags equal every given tag, newest first (`version_info` dicts).

    Returns [] when the model does not exist yet.
    """
    for key, value in tags.items():
        if not re.fullmatch(r"[\w.-]+", key) or "'" in str(value):
            raise ValueError(f"unsupported tag filter {key}={value!r}")
    query = " and ".join([f"name = '{name}'", *(f"tags.{k} = '{v}'" for k, v in tags.items())])
    found = _client(tracking_uri).search_model_versions(query)
    out = [
        {"version": int(mv.version), "run_id": mv.run_id, "tags": dict(mv.tags), "source": mv.source}
        for mv in found
    ]
    return sorted(out, key=lambda v: -v["version"])


def set_version_tag(
    tracking_uri: str, version: int | str, key: str, value: str, name: str = SURROGATE_MODEL
) -> None:
    """Set one tag of a model version."""
    _client(tracking_uri).set_model_version_tag(name, str(version), key, value)


def set_model_tags(tracking_uri: str, name: str, tags: Mapping[str, str]) -> None:
    """Set tags of the registered model itself (e.g. the last promotion decision)."""
    client = _client(tracking_uri)
    for key, value in tags.items():
        client.set_registered_model_tag(name, key, str(value))


def parse_model_uri(uri: str) -> tuple[str, str | None, int | None]:
    """(name, alias, version) of "models:/<name>@<alias>" or "models:/<name>/<version>".

    >>> parse_model_uri("models:/kernelcast-surrogate@champion")
    ('kernelcast-surrogate', 'champion', None)
    >>> parse_model_uri("runs:/abc/adapter")
    Traceback (most recent call last):
    ...
    ValueError: model uri 'runs:/abc/adapter' is not models:/<name>@<alias> or models:/<name>/<version>
    """
    m = _MODEL_URI.match(uri.strip())
    if not m:
        raise ValueError(
            f"model uri {uri!r} is not models:/<name>@<alias> or models:/<name>/<version>"
        )
    version = m.group("version")
    return m.group("name"), m.group("alias"), int(version) if version else None


def registered_version(model_ref: str, name: str) -> int | None:
    """The version number of a forecast's model_ref `models:/<name>/<N>`, else None.

    >>> registered_version("models:/kernelcast-surrogate/3", "kernelcast-surrogate")
    3
    >>> registered_version("models:/kernelcast-surrogate/3|verbalized", "kernelcast-surrogate") is None
    True
    """
    m = re.fullmatch(rf"models:/{re.escape(name)}/(\d+)", model_ref)
    return int(m.group(1)) if m else None


def resolve_surrogate(
    tracking_uri: str, uri: str = f"models:/{SURROGATE_MODEL}@champion", dst: str | Path = "."
) -> Path | None:
    """Download a registered surrogate (adapter + base model reference) to a local folder.

    Args:
        tracking_uri: MLflow tracking URI.
        uri: "models:/<name>@<alias>" or "models:/<name>/<version>".
        dst: folder to download into (created).
    Returns:
        The local model folder (an MLflow transformers model; a plain adapter folder with
        base_model.json for versions registered from files), or None when the model, alias
        or version does not exist (e.g. nothing promoted to champion yet).
    Raises:
        ValueError: a malformed uri (one line).
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    name, alias, version = parse_model_uri(uri)
    client = _client(tracking_uri)
    try:
        mv = (
            client.get_model_version_by_alias(name, alias)
            if alias
            else client.get_model_version(name, str(version))
        )
    except MlflowException as exc:
        log.info("no surrogate at %s: %s", uri, str(exc).splitlines()[0])
        return None
    out = Path(dst) / f"{name}-v{mv.version}"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    local = mlflow.artifacts.download_artifacts(
        artifact_uri=mv.source, dst_path=str(out), tracking_uri=tracking_uri
    )
    return Path(local)


def _adapter_and_tokenizer(folder: Path) -> tuple[Path, Path]:
    """(peft adapter folder, tokenizer folder) of an MLflow transformers model or a plain folder.

    An MLflow transformers model keeps the adapter in peft/ and the tokenizer in
    components/tokenizer/ (the layout mlflow.transformers.load_model reads); a plain folder
    (peft's save_pretrained output) holds both at its top. Read without MLflow, so a GPU host
    without it loads the same folders.
    """
    if (folder / "MLmodel").is_file():
        return folder / "peft", folder / "components" / "tokenizer"
    return folder, folder


def read_base_model_ref(local_dir: str | Path) -> dict[str, Any]:
    """The base model reference of a resolved surrogate: {"base_model", "dataset_version", ...}.

    Read from the logged model's metadata (MLmodel), or from base_model.json in a plain
    adapter folder (trained on a GPU host, or registered before models were logged)."""
    local = Path(local_dir)
    if (local / "MLmodel").is_file():
        from mlflow.models import Model

        meta = dict(Model.load(str(local)).metadata or {})
        return {k: v for k, v in meta.items() if k in ("base_model", "dataset_version", "prompt_style") and v != ""}
    return json.loads((local / BASE_MODEL_FILE).read_text())


def load_surrogate(local_dir: str | Path, base_model_path: str | Path, device: str | None = None) -> tuple[Any, Any]:
    """The base model with the surrogate's LoRA adapter applied, and its tokenizer.

    Args:
        local_dir: a resolved surrogate (`resolve_surrogate`: an MLflow transformers model
            folder) or a plain saved adapter directory (peft output + tokenizer).
        base_model_path: local checkpoint of the base model the adapter applies to
            (`models.base_model.resolve_base_model(read_base_model_ref(local_dir)["base_model"])`).
        device: "cpu", "cuda", "cuda:1", ...; None: cuda when available.
    Returns:
        (PeftModel in eval mode, PreTrainedTokenizerFast): usable as
        `TransformersAnswerer(model, tokenizer)`.
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    adapter, tok_dir = _adapter_and_tokenizer(Path(local_dir))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    base = AutoModelForCausalLM.from_pretrained(
        str(base_model_path), dtype=torch.bfloat16 if device.startswith("cuda") else torch.float32
    ).to(device)
    model = PeftModel.from_pretrained(base, str(adapter)).eval()
    # The adapter carries the training tokenizer; fall back to the base model's.
    tok_dir = tok_dir if (tok_dir / "tokenizer.json").is_file() else Path(base_model_path)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tok_dir))
    return model, tokenizer
