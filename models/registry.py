"""The surrogate in the MLflow model registry: register, alias, resolve, load, lineage.

A registered version is a LoRA adapter directory (peft `save_pretrained` output plus the
tokenizer) logged as the artifact `adapter` of its training run, with `base_model.json`
inside naming the base model it applies to. Versions carry the tags dataset_version and
base_model; promotion moves aliases ("champion", "challenger"), never stages (stack.md).

    version = register_surrogate(uri, result.run_id, result.adapter_dir, base_model="smollm2",
                                 dataset_version="v1", alias="challenger", con=con)
    local = resolve_surrogate(uri, "models:/kernelcast-surrogate@champion", dst)
    model, tokenizer = load_surrogate(local, resolve_base_model("smollm2"))
    TransformersForecaster(model, tokenizer)

This module never imports dagster; the tracking URI is a plain string.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_NAME = "kernelcast-surrogate"
ADAPTER_ARTIFACT = "adapter"
BASE_MODEL_FILE = "base_model.json"
ALIASES = ("champion", "challenger")
# models:/<name>@<alias> or models:/<name>/<version>
_MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[\w.-]+)|/(?P<version>\d+))$")


def _client(tracking_uri: str):
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    return MlflowClient(tracking_uri, registry_uri=tracking_uri)


def register_surrogate(
    tracking_uri: str,
    run_id: str,
    adapter_dir: str | Path,
    name: str = DEFAULT_NAME,
    base_model: str = "smollm2",
    dataset_version: str | None = None,
    alias: str | None = None,
    con: Any = None,
    dagster_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
    prompt_style: str | None = None,
) -> int:
    """Register a trained adapter as a new version of the surrogate model.

    Args:
        tracking_uri: MLflow tracking (and registry) URI.
        run_id: the training run; the adapter becomes its artifact `adapter`.
        adapter_dir: the saved adapter + tokenizer (`TrainingResult.adapter_dir`).
        name: registered model name.
        base_model: the base model spec the adapter applies to (stored in base_model.json).
        dataset_version: the dataset version it was trained on (version tag, lineage).
        alias: optionally point this alias ("champion"/"challenger") at the new version.
        con: a writable DuckDB connection: when given, a model_lineage row is recorded
            (needs dataset_version, registered in the warehouse).
        dagster_run_id: the orchestrating run, for the lineage row and a version tag.
        tags: extra version tags (e.g. reward, training_key, training_batch).
        prompt_style: the prompt style it was trained with (base_model.json, a version tag):
            forecasts must use the same style.
    Returns:
        The new version number.
    Raises:
        ValueError: an alias outside ALIASES; lineage requested without a dataset version.
    """
    if alias is not None and alias not in ALIASES:
        raise ValueError(f"alias must be one of {ALIASES}, got {alias!r}")
    if con is not None and not dataset_version:
        raise ValueError("recording lineage needs the dataset_version")
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    run = client.get_run(run_id)
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / ADAPTER_ARTIFACT
        shutil.copytree(adapter_dir, staged, ignore=shutil.ignore_patterns("trainer"))
        (staged / BASE_MODEL_FILE).write_text(
            json.dumps(
                {
                    "base_model": base_model,
                    "dataset_version": dataset_version,
                    **({"prompt_style": prompt_style} if prompt_style else {}),
                },
                indent=1,
            )
        )
        client.log_artifacts(run_id, str(staged), ADAPTER_ARTIFACT)
    try:
        client.create_registered_model(name)
    except MlflowException as exc:
        if "RESOURCE_ALREADY_EXISTS" not in str(exc.error_code):
            raise
    version_tags = {"base_model": base_model, "dataset_version": dataset_version or ""}
    if dagster_run_id:
        version_tags["dagster_run_id"] = dagster_run_id
    if prompt_style:
        version_tags["prompt_style"] = prompt_style
    version_tags.update({k: str(v) for k, v in (tags or {}).items()})
    mv = client.create_model_version(
        name,
        source=f"{run.info.artifact_uri.rstrip('/')}/{ADAPTER_ARTIFACT}",
        run_id=run_id,
        tags=version_tags,
        description=f"LoRA adapter on {base_model}, trained on dataset {dataset_version}",
    )
    version = int(mv.version)
    if alias:
        client.set_registered_model_alias(name, alias, str(version))
    log.info("registered %s version %d%s", name, version, f" as @{alias}" if alias else "")
    if con is not None:
        from warehouse.lineage import record_model_lineage

        record_model_lineage(
            con,
            name,
            version,
            dataset_version,  # type: ignore[arg-type]
            mlflow_run_id=run_id,
            base_model=base_model,
            git_commit=run.data.tags.get("git_commit"),
            dagster_run_id=dagster_run_id or run.data.tags.get("dagster_run_id"),
        )
    return version


def set_alias(tracking_uri: str, alias: str, version: int | str, name: str = DEFAULT_NAME) -> None:
    """Point `alias` ("champion"/"challenger") at a version (promotion)."""
    if alias not in ALIASES:
        raise ValueError(f"alias must be one of {ALIASES}, got {alias!r}")
    _client(tracking_uri).set_registered_model_alias(name, alias, str(version))


def alias_version(tracking_uri: str, alias: str, name: str = DEFAULT_NAME) -> int | None:
    """The version `alias` points at, or None (no such model or alias)."""
    from mlflow.exceptions import MlflowException

    try:
        return int(_client(tracking_uri).get_model_version_by_alias(name, alias).version)
    except MlflowException:
        return None


def version_info(tracking_uri: str, version: int | str, name: str = DEFAULT_NAME) -> dict[str, Any] | None:
    """{"version", "run_id", "tags", "source"} of one version, or None if it does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        mv = _client(tracking_uri).get_model_version(name, str(version))
    except MlflowException:
        return None
    return {"version": int(mv.version), "run_id": mv.run_id, "tags": dict(mv.tags), "source": mv.source}


def find_versions(tracking_uri: str, name: str = DEFAULT_NAME, **tags: str) -> list[dict[str, Any]]:
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
    tracking_uri: str, version: int | str, key: str, value: str, name: str = DEFAULT_NAME
) -> None:
    """Set one tag of a model version."""
    _client(tracking_uri).set_model_version_tag(name, str(version), key, value)


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


def resolve_surrogate(
    tracking_uri: str, uri: str = f"models:/{DEFAULT_NAME}@champion", dst: str | Path = "."
) -> Path | None:
    """Download a registered surrogate (adapter + base model reference) to a local folder.

    Args:
        tracking_uri: MLflow tracking URI.
        uri: "models:/<name>@<alias>" or "models:/<name>/<version>".
        dst: folder to download into (created).
    Returns:
        The local adapter directory (holding base_model.json), or None when the model, alias
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


def read_base_model_ref(local_dir: str | Path) -> dict[str, Any]:
    """The base_model.json of a resolved surrogate ({"base_model": ..., "dataset_version": ...})."""
    return json.loads((Path(local_dir) / BASE_MODEL_FILE).read_text())


def load_surrogate(local_dir: str | Path, base_model_path: str | Path) -> tuple[Any, Any]:
    """The base model with the surrogate's LoRA adapter applied, and its tokenizer.

    Args:
        local_dir: a resolved surrogate (`resolve_surrogate`) or a saved adapter directory.
        base_model_path: local checkpoint of the base model named in base_model.json
            (`models.base_model.resolve_base_model(read_base_model_ref(local_dir)["base_model"])`).
    Returns:
        (PeftModel in eval mode, PreTrainedTokenizerFast): usable as
        `TransformersForecaster(model, tokenizer)`.
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    local = Path(local_dir)
    cuda = torch.cuda.is_available()
    base = AutoModelForCausalLM.from_pretrained(
        str(base_model_path), dtype=torch.bfloat16 if cuda else torch.float32
    ).to("cuda" if cuda else "cpu")
    model = PeftModel.from_pretrained(base, str(local)).eval()
    # The adapter folder carries the training tokenizer; fall back to the base model's.
    tok_dir = local if (local / "tokenizer.json").is_file() else Path(base_model_path)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tok_dir))
    return model, tokenizer
