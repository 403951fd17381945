"""The surrogate's life cycle around the registry: train-or-reuse, challengers, champion, load.

    version = train_or_reuse(settings, rows, work_dir, uri, dataset_version="ds-1",
                             base_identity=base_model_identity(path), batch=dagster_run_id, con=con)
    challengers(uri)          # versions of the latest training batch (@challenger's batch)
    alias_version(uri, "champion")
    forecaster, info = registered_forecaster(uri, 3, home)     # logprob readout, ready to use

Every registered version carries the tags `reward`, `training_key` (a digest of the resolved
training settings, the dataset version and the base model's identity), `training_batch` (the
Dagster run that last trained or re-used it) and `prompt_style`. A version whose key matches
is re-used instead of trained again, so a rerun of the graph on unchanged data and settings
costs no training (and adds no version); `force=True` trains anyway.

This module never imports dagster; the tracking URI is a plain string.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.registry import SURROGATE_MODEL
from models.registry.versions import (
    alias_version,
    find_versions,
    register_surrogate,
    set_alias,
    set_version_tag,
    version_info,
)

if TYPE_CHECKING:
    import polars as pl

    from models.training.settings import TrainingSettings
log = logging.getLogger(__name__)

CHALLENGER = "challenger"
CHAMPION = "champion"


@dataclass(frozen=True)
class SurrogateVersion:
    """One registered surrogate version produced (or re-used) by a training request.

    Attributes:
        version: registered version number.
        reward: reward variant.
        run_id: its MLflow training run.
        training_key: digest of what decided the training (see `training_key`).
        reused: True when an existing version with the same key was re-used.
        metrics: the training run's final metrics (empty when re-used).
        seconds: wall time of training + registration (0 when re-used).
    """

    version: int
    reward: str
    run_id: str | None
    training_key: str
    reused: bool
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def model_ref(version: int, name: str = SURROGATE_MODEL) -> str:
    """The `model_ref` forecasts of a registered version are stored under.

    >>> model_ref(3)
    'models:/kernelcast-surrogate/3'
    """
    return f"models:/{name}/{int(version)}"


def base_model_identity(path: str | Path) -> str:
    """What identifies a base checkpoint's weights: the conversion marker of the embedded
    SmolLM2 (its GGUF's sha256), the tiny model's settings, else the files' sizes.
    """
    root = Path(path)
    for marker, keys in (("kernelcast_base.json", ("gguf_sha256", "dtype")), ("kernelcast_tiny.json", None)):
        if (root / marker).is_file():
            data = json.loads((root / marker).read_text())
            return json.dumps({k: data.get(k) for k in keys} if keys else data, sort_keys=True)
    files = sorted((p.name, p.stat().st_size) for p in root.iterdir() if p.is_file())
    return json.dumps(files)


def training_key(settings: TrainingSettings, dataset_version: str, base_identity: str) -> str:
    """A 16-hex digest of the resolved training settings, the dataset version and the base
    model's identity: equal keys mean the same training would run again.

    >>> from models.training.settings import TrainingSettings
    >>> len(training_key(TrainingSettings(), "ds-1", "x")), training_key(TrainingSettings(), "ds-1", "x") == training_key(TrainingSettings(), "ds-2", "x")
    (16, False)
    """
    payload = json.dumps(
        {"settings": settings.as_params(), "dataset_version": dataset_version, "base": base_identity},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def train_or_reuse(
    settings: TrainingSettings,
    rows: Sequence[dict[str, Any]],
    work_dir: str | Path,
    tracking_uri: str,
    dataset_version: str,
    base_identity: str,
    batch: str,
    measurement_ids: Sequence[str] | None = None,
    con: Any = None,
    dagster_run_id: str | None = None,
    force: bool = False,
    name: str = SURROGATE_MODEL,
) -> SurrogateVersion:
    """Train one reward variant with `models.training.train_grpo` and register it as
    @challenger, or re-use the registered version trained with the same key.

    Args:
        settings: resolved training settings (its `reward` is the variant).
        rows: `build_training_rows` output of the training pool.
        work_dir: where the adapter is saved before registration.
        tracking_uri: MLflow tracking and registry URI.
        dataset_version: the dataset version the rows come from.
        base_identity: `base_model_identity` of the base checkpoint.
        batch: names this training request (the Dagster run id); versions of one batch are
            the challengers evaluated together.
        measurement_ids: the measurements behind the dataset version (an MLflow artifact).
        con: a writable DuckDB connection for the model_lineage row (None: no row).
        dagster_run_id: tags the MLflow run, the version and the lineage row.
        force: train even when a version with the same key exists.
        name: registered model name.
    Returns:
        The SurrogateVersion; it now holds the "challenger" alias.
    """
    import time

    from models.training.grpo import train_grpo
    from models.training.tracking import RunTracking
    key = training_key(settings, dataset_version, base_identity)
    existing = [] if force else find_versions(tracking_uri, name, training_key=key)
    if existing:
        found = existing[0]
        version = found["version"]
        set_version_tag(tracking_uri, version, "training_batch", batch, name)
        set_alias(tracking_uri, CHALLENGER, version, name)
        log.info("re-using %s version %d (training key %s)", name, version, key)
        return SurrogateVersion(version, settings.reward, found["run_id"], key, reused=True)
    t0 = time.perf_counter()
    tags = {"reward": settings.reward, "training_key": key}
    if dagster_run_id:
        tags["dagster_run_id"] = dagster_run_id
    tracking = RunTracking(tracking_uri, dataset_version=dataset_version, measurement_ids=measurement_ids, tags=tags)
    result = train_grpo(settings, rows, work_dir, tracking)
    assert result.run_id is not None  # a tracking URI was given
    version = register_surrogate(
        tracking_uri,
        result.run_id,
        result.adapter_dir,
        name=name,
        base_model=settings.base_model,
        dataset_version=dataset_version,
        alias=CHALLENGER,
        con=con,
        dagster_run_id=dagster_run_id,
        tags={**tags, "training_batch": batch},
        prompt_style=settings.prompt_style,
    )
    return SurrogateVersion(
        version, settings.reward, result.run_id, key, reused=False,
        metrics=dict(result.metrics), seconds=time.perf_counter() - t0,
    )


def challengers(tracking_uri: str, name: str = SURROGATE_MODEL) -> list[int]:
    """The versions of the latest training batch: those sharing the `training_batch` tag of
    the version @challenger points at (ascending); [] when there is no challenger."""
    current = alias_version(tracking_uri, CHALLENGER, name)
    if current is None:
        return []
    batch = (version_info(tracking_uri, current, name) or {}).get("tags", {}).get("training_batch")
    if not batch:
        return [current]
    return sorted(v["version"] for v in find_versions(tracking_uri, name, training_batch=batch))


def registered_forecaster(
    tracking_uri: str,
    version: int,
    home: str | Path,
    cache_dir: str | Path | None = None,
    readout: str = "logprob",
    name: str = SURROGATE_MODEL,
    device: str | None = None,
    downloads: str | Path | None = None,
):
    """A `TransformersAnswerer` for one registered version, and what it is.

    Downloads the adapter into <home>/surrogates/, resolves its base model (base_model.json)
    under <home>/models/ and applies the adapter.

    Args:
        tracking_uri: MLflow tracking URI.
        version: registered version number.
        home: KERNELCAST_HOME (downloads, base models).
        cache_dir: a ForecastCache folder (None: no cache).
        readout: "logprob" (one forward pass per pair) or "verbalized".
        name: registered model name.
        device: where the model runs ("cpu", "cuda", "cuda:1"; None: cuda when available).
        downloads: the folder the adapter is downloaded into (default <home>/surrogates); a
            download replaces what is there, so processes loading at once need one each.
    Returns:
        (forecaster, {"version", "run_id", "base_model", "prompt_style", "reward"}).
    Raises:
        FileNotFoundError: the version does not exist.
    """
    from models.backends.transformers_backend import TransformersAnswerer
    from models.base_model import resolve_base_model
    from models.cache import ForecastCache
    from models.registry.versions import load_surrogate

    info, local, ref = _resolved_version(tracking_uri, version, Path(downloads or Path(home) / "surrogates"), name)
    model, tokenizer = load_surrogate(local, resolve_base_model(ref["base_model"], home), device=device)
    forecaster = TransformersAnswerer(
        model,
        tokenizer,
        readout=readout,
        batch_size=1,  # one prompt per pass: no padding work on a CPU
        cache=ForecastCache(Path(cache_dir)) if cache_dir else None,
        model_ref=f"{model_ref(version, name)}@{info['run_id']}",  # the run id pins the weights
    )
    described = {
        "version": int(version),
        "run_id": info["run_id"],
        "base_model": ref["base_model"],
        "prompt_style": _prompt_style(info, ref),
        "reward": info["tags"].get("reward", ""),
    }
    return forecaster, described


def registered_prompt_style(tracking_uri: str, version: int, downloads: str | Path, name: str = SURROGATE_MODEL) -> str:
    """The prompt style a registered version reads (what `registered_forecaster` describes),
    without loading its weights: prompts can then be built where the warehouse is.

    Raises:
        FileNotFoundError: the version does not exist.
    """
    info, _, ref = _resolved_version(tracking_uri, version, Path(downloads), name)
    return _prompt_style(info, ref)


def _resolved_version(tracking_uri: str, version: int, downloads: Path, name: str) -> tuple[dict, Path, dict]:
    """(version info, downloaded model folder, its base model reference)."""
    from models.registry.versions import read_base_model_ref, resolve_surrogate

    info = version_info(tracking_uri, version, name)
    local = resolve_surrogate(tracking_uri, f"models:/{name}/{int(version)}", downloads)
    if info is None or local is None:
        raise FileNotFoundError(f"no registered version {version} of {name}")
    return info, local, read_base_model_ref(local)


def _prompt_style(info: dict[str, Any], ref: dict[str, Any]) -> str:
    return ref.get("prompt_style") or info["tags"].get("prompt_style") or "full"


def eval_subset(pairs: pl.DataFrame, cap: int | None) -> pl.DataFrame:
    """At most `cap` eval pairs, spread over tasks (round robin by pair id): deterministic.

    Every surrogate version and the champion are forecast on this same subset, so their
    scores compare like with like.
    """
    import polars as pl

    ordered = pairs.sort("task", "pair_id").with_columns(
        pl.int_range(pl.len()).over("task").alias("_turn")
    )
    picked = ordered.sort("_turn", "task", "pair_id")
    return (picked if cap is None else picked.head(cap)).drop("_turn")
