"""The LLM surrogate version of a run: a committed H200 adapter registered, or trained here.

- `register_committed`: the LoRA adapter of a committed GPU run (data/training/<hw>/<date>/
  adapters/<variant>) is logged as an MLflow transformers model with its training record
  (settings, per-epoch history) and registered with its calibrator, fitted on the variant's
  committed calibration forecasts; its committed eval forecasts are what it is scored by
  (pipelines.surrogates.committed).
- `train_and_register`: the supervised distributional stage (models.training.supervised) run here, a
  LoRA adapter on the base model, calibrated on the calibration split and registered.
Both re-use an equal registered version (same source or settings, dataset version, code).

Lineage tells what the fit used: a committed adapter was trained on the dataset version its job
was exported from (training.json), usually older than the run's; its version's tag
`trained_dataset_version`, its `model_lineage` row and its run's dataset input name that one,
marked as not held when this warehouse no longer has it. Its run also holds the measurement ids
behind its fit pairs (when the warehouse holds that version; calibration ones apart for a version
trained here), its fit size and calibration scores, and the settings and history of its training.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from models.registry import SURROGATE_MODEL
from pipelines.surrogates.committed import calibrated_variants, read_committed
from pipelines.surrogates.remote_results import TRAINING_PAIRS_FILE
from pipelines.surrogates.roles import Roles
from warehouse.datasets import held_measurements

log = logging.getLogger(__name__)

CODE_VERSION = "1"
# Committed versions registered before their lineage named the training dataset version (they
# named the run's) are not re-used: registering again gives a version whose tags tell the truth.
COMMITTED_CODE_VERSION = "2"


@dataclass
class LlmVersion:
    """The registered LLM version of a run and how this run got it."""

    version: int
    run_id: str | None
    reused: bool
    source: str  # committed:<run>/<variant> | supervised
    metrics: dict[str, float] = field(default_factory=dict)


def _new_run(tracking_uri: str, name: str, tags: Mapping[str, str]) -> str:
    import mlflow

    from models.registry.tracking import mlflow_experiment

    client = mlflow.MlflowClient(tracking_uri)
    exp = mlflow_experiment(client, tracking_uri, "kernelcast-training")
    return client.create_run(exp, tags=dict(tags), run_name=name).info.run_id


def register_committed(
    con: duckdb.DuckDBPyConnection,
    tracking_uri: str,
    data_dir: Path,
    run: str,
    variant: str,
    dataset_version: str,
    base_model: str,
    base_model_path: Path,
    eval_pairs: Any,
    held_out_pairs: Any,
    tags: Mapping[str, str] | None = None,
) -> LlmVersion:
    """Register the committed adapter of `variant` in `run` (re-used when already registered)."""
    import mlflow

    from models.registry.versions import find_versions, register_surrogate

    root = data_dir / run
    adapter = root / "adapters" / variant
    if not (adapter / "adapter_model.safetensors").is_file():
        raise FileNotFoundError(f"{adapter}: no committed adapter")
    key = {"kind": "llm", "committed_run": run.replace("/", "."), "committed_variant": variant,
           "dataset_version": dataset_version, "code_version": COMMITTED_CODE_VERSION}
    found = find_versions(tracking_uri, SURROGATE_MODEL, **key)
    if found:
        return LlmVersion(found[0]["version"], found[0]["run_id"], True, f"committed:{run}/{variant}")
    _, training = read_committed(root)
    record = training["variants"][variant]
    committed = {v.name: v for v in calibrated_variants(root, eval_pairs, held_out_pairs)}
    calibrator = committed[variant].calibrator if variant in committed else None
    settings = record.get("settings", {})
    trained = training.get("dataset_version") or dataset_version
    from models.registry.tracking import log_training_data
    from warehouse.datasets import pair_measurement_ids

    held, measurement_ids = held_measurements(con, trained)
    run_id = _new_run(tracking_uri, f"committed-{variant}", {**dict(tags or {}), **key, "trained_on": "nvidia-h200"})
    fit = _committed_training_pairs(root, bool(settings.get("held_out")))
    if held and fit is not None:  # else the whole dataset version's: all it may have used
        measurement_ids = pair_measurement_ids(con, trained, fit)
    log_training_data(tracking_uri, run_id, trained, measurement_ids,
                      fit.select("pair_id", "true_bin").to_pandas() if fit is not None else None, held=held)
    if fit is not None:
        mlflow.MlflowClient(tracking_uri).log_metric(run_id, "fit_pairs", float(fit.height), step=0)
    client = mlflow.MlflowClient(tracking_uri)
    client.log_batch(run_id, params=[mlflow.entities.Param(k, str(v)[:500]) for k, v in settings.items()])
    for epoch in (record.get("history") or {}).get("history", []):
        for k, v in epoch.items():
            if k != "epoch" and isinstance(v, (int, float)):
                client.log_metric(run_id, k, float(v), step=int(epoch["epoch"]))
    client.set_terminated(run_id, "FINISHED")
    version = register_surrogate(
        tracking_uri, run_id, adapter, base_model=base_model, dataset_version=dataset_version, con=con,
        dagster_run_id=(tags or {}).get("dagster_run_id"), prompt_style=settings.get("style"),
        base_model_path=base_model_path, trained_dataset_version=trained, trained_dataset_held=held,
        tags={**key, "calibrator": json.dumps(calibrator.to_dict() if calibrator else {}),
              "finetune": str(settings.get("finetune", "lora"))},
    )
    return LlmVersion(version, run_id, False, f"committed:{run}/{variant}")


def _committed_training_pairs(root: Path, held_out: bool) -> Any:
    """The fit pairs a committed variant trained on (pair_id, task, hardware_id, anchor and
    candidate kernel ids, true_bin), when its run folder carries them (`kernelcast train ingest`
    writes training_pairs.parquet); else None."""
    import polars as pl

    path = root / TRAINING_PAIRS_FILE
    if not path.is_file():
        return None
    frame = pl.read_parquet(path).filter(pl.col("role") == ("held_out_fit" if held_out else "fit"))
    return frame if frame.height else None


def train_and_register(
    con: duckdb.DuckDBPyConnection,
    tracking_uri: str,
    roles: Roles,
    rows_for: Any,
    dataset_version: str,
    base_model: str,
    base_model_path: Path,
    epochs: int,
    style: str,
    max_rows: int | None,
    work_dir: Path,
    tags: Mapping[str, str] | None = None,
) -> LlmVersion:
    """Train a LoRA surrogate here with the supervised loss, calibrate it, register it.

    Args:
        rows_for: a callable (pairs frame, style) -> training rows (prompts), e.g. built on
            `models.training.build_training_rows` with the warehouse's sources and features.
    """
    from models.calibration import fit_calibrator
    from models.registry.versions import find_versions, register_surrogate
    from models.training.supervised import (
        SupervisedSettings,
        encode_rows,
        readout_probs,
        train_supervised,
    )

    settings = SupervisedSettings(base_model=base_model, finetune="lora", lora_rank=16, learning_rate=1e-3,
                                  epochs=epochs, patience=0, tokens_per_batch=16384)
    digest = hashlib.sha256(json.dumps([settings.as_params(), style, max_rows], sort_keys=True).encode()).hexdigest()
    key = {"kind": "llm", "training_key": f"supervised-{digest[:16]}",
           "dataset_version": dataset_version, "code_version": CODE_VERSION}
    found = find_versions(tracking_uri, SURROGATE_MODEL, **key)
    if found:
        return LlmVersion(found[0]["version"], found[0]["run_id"], True, "supervised")
    fit = roles.fit.sort("pair_id")
    calibration = roles.calibration
    if max_rows is not None:  # a cap on the rows the model is trained and calibrated on
        fit, calibration = fit.head(max_rows), calibration.sort("pair_id").head(max_rows)
    train_rows, cal_rows = rows_for(fit, style), rows_for(calibration, style)
    t0 = time.perf_counter()
    result = train_supervised(settings, train_rows, cal_rows, work_dir / "sft")
    from models.backends.transformers_backend import load_model_and_tokenizer
    from pipelines.surrogates.classical import calibration_metrics

    calibrator = None
    metrics = {"train_seconds": time.perf_counter() - t0, "train_rows": float(result.rows_used),
               "best_epoch": float(result.best_epoch), "fit_pairs": float(fit.height),
               "calibration_pairs": float(calibration.height)}
    if cal_rows:
        from peft import PeftModel

        base, tokenizer = load_model_and_tokenizer(base_model_path, device="cpu", dtype="float32")
        model = PeftModel.from_pretrained(base, str(result.model_dir)).eval()
        enc, labels = encode_rows(tokenizer, cal_rows)
        probs = readout_probs(model, tokenizer, enc, labels, settings.tokens_per_batch).numpy()
        y = np.array([r["true_bin"] for r in cal_rows])
        calibrator = fit_calibrator(probs, y)
        metrics |= calibration_metrics(probs, y, "before") | calibration_metrics(calibrator.apply(probs), y, "after")
    run_id = _new_run(tracking_uri, "supervised", {**dict(tags or {}), **key})
    import mlflow

    from models.registry.tracking import log_training_data
    from warehouse.datasets import pair_measurement_ids

    log_training_data(tracking_uri, run_id, dataset_version, pair_measurement_ids(con, dataset_version, fit),
                      fit.select("pair_id", "true_bin").to_pandas(),
                      calibration_measurement_ids=pair_measurement_ids(con, dataset_version, calibration))
    client = mlflow.MlflowClient(tracking_uri)
    client.log_batch(run_id, params=[mlflow.entities.Param(k, v) for k, v in settings.as_params().items()],
                     metrics=[mlflow.entities.Metric(k, float(v), int(time.time() * 1000), 0)
                              for k, v in metrics.items() if v == v])
    for epoch in result.history:
        for k, v in epoch.items():
            if k != "epoch" and isinstance(v, (int, float)):
                client.log_metric(run_id, k, float(v), step=int(epoch["epoch"]))
    client.set_terminated(run_id, "FINISHED")
    version = register_surrogate(
        tracking_uri, run_id, result.model_dir, base_model=base_model, dataset_version=dataset_version, con=con,
        dagster_run_id=(tags or {}).get("dagster_run_id"), prompt_style=style, base_model_path=base_model_path,
        tags={**key, "calibrator": json.dumps(calibrator.to_dict() if calibrator else {}), "finetune": "lora"},
    )
    return LlmVersion(version, run_id, False, "supervised", metrics)


LLM_SOURCES = ("committed", "supervised")  # surrogate.llm settings served here (grpo: pipelines.surrogates.grpo)


class UnknownLlmSource(ValueError):
    """surrogate.llm names no way of producing the LLM surrogate."""


@dataclass(frozen=True)
class LlmSurrogate:
    """The LLM surrogate of a dataset version as registered, and what the lineage check reads."""

    dataset_version: str
    registered: LlmVersion
    trained: dict | None  # the version's model_lineage row (the fit's dataset, held or not)
    missing_lineage: list[str]  # versions registered without a model_lineage row
    # The other variants of the committed run (`ingest`'s), each (variant, registered model, version).
    committed_variants: list[tuple[str, str, int]] = field(default_factory=list)


def produce_llm_surrogate(warehouse_path: str | Path, tracking_uri: str, home: Path, data_dir: Path,
                          surrogate: Any, work_dir: Path, tags: Mapping[str, str], *,
                          head_logger: Callable[[Path, str, str], Any]) -> LlmSurrogate:
    """Register the committed adapter or train one here (`surrogate.llm`, one of LLM_SOURCES) for
    the newest dataset version of the warehouse. With the committed adapter, the variants a GPU
    host's run brought back into the same committed run folder (`ingest`: the heads, code-embed
    with its head file, code-lora's forecasts) are registered too
    (pipelines.surrogates.registration.register_ingested).

    Args:
        warehouse_path: the DuckDB file (written: `model_lineage`).
        tracking_uri: MLflow tracking and registry URI.
        home: the state folder (the converted base model).
        data_dir: the shipped data (the committed training runs).
        surrogate: the surrogate settings.
        work_dir: where a supervised adapter is trained before registration.
        tags: tags of the registered run (dagster_run_id, git_commit).
        head_logger: what a code-embed variant with its head file is logged as
            (pipelines.surrogates.registration.register_variants).
    Raises:
        NoDatasetVersion: nothing curated yet.
        UnknownLlmSource: `surrogate.llm` is none of LLM_SOURCES.
    """
    from models.base_model import resolve_base_model
    from pipelines.surrogates.export import latest_version, row_builder, version_roles
    from warehouse.db import connect
    from warehouse.lineage import lineage_of, read_model_lineage

    sur = surrogate
    if sur.llm not in LLM_SOURCES:
        raise UnknownLlmSource(f"unknown surrogate.llm setting {sur.llm!r}: committed, supervised or grpo")
    base_path = resolve_base_model(sur.base_model, home)
    with connect(warehouse_path) as con:
        version = latest_version(con)
        roles = version_roles(con, version, sur.held_out_task)
        variants: list[tuple[str, str, int]] = []
        if sur.llm == "committed":
            from pipelines.surrogates.registration import register_ingested

            out = register_committed(con, tracking_uri, data_dir, sur.committed_run, sur.committed_adapter, version,
                                     sur.base_model, base_path, roles.eval, roles.held_out_eval, tags)
            variants = register_ingested(con, tracking_uri, data_dir, sur.committed_run, version, sur.base_model,
                                         dict(tags), head_logger=head_logger)
        else:
            out = train_and_register(con, tracking_uri, roles, row_builder(con), version, sur.base_model, base_path,
                                     sur.supervised_epochs, sur.supervised_style, sur.supervised_rows, work_dir, tags)
        trained = lineage_of(con, SURROGATE_MODEL, out.version)
        missing = []
        for name, number in [(SURROGATE_MODEL, out.version), *((m, v) for _, m, v in variants)]:
            lineage = read_model_lineage(con, name)
            if not lineage.height or str(number) not in set(lineage["model_version"].to_list()):
                missing.append(str(number) if name == SURROGATE_MODEL else f"{name}/{number}")
    return LlmSurrogate(version, out, trained, missing, variants)
