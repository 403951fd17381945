"""The variants of a committed run folder registered in MLflow: each a version, with its record.

    kernelcast train ingest OUT --job JOB --register

`register_variants` (`--register`, and `kernelcast run` for every variant an llm_code run
brought into the committed run folder: `register_ingested`) makes each variant a version of
models:/kernelcast-surrogate (held-out variants: kernelcast-surrogate-held-out), tag kind=llm
and committed_variant: the evaluation answers from its committed forecasts
(pipelines.forecasting.committed) with a calibrator fitted on its calibration forecasts. Its
MLflow run holds the training record (settings, per-epoch metrics), the dataset it learned from
and that version's measurement ids; a model_lineage row names it. A LoRA variant whose adapter
is in the committed folder is registered with it (it can run here on the CPU); without it, and
for a head variant, the version is a committed-forecasts one (a head's weights, heads.pt, are an
artifact of its run when the host's output folder is at hand). A code-embed variant whose head
file is in the committed folder has it as an artifact of its run and the version tag
`embed_head_artifact` naming it: that version forecasts any pair (pipelines.forecasting.embed) and
its model is an MLflow pyfunc model of kernel sources (the head file its artifact, the base model
a pip requirement). The versions without weights that run here are records of their runs,
tagged `weights` = "committed forecasts only"; promotion never makes one a champion.

The committed run folder's format, and the one ingest that writes it, are
pipelines/surrogates/remote_results.py's. The LoRA adapter of `code-lora` stays out of the
folder, which travels with the repository, unless the ingest was asked to keep it (`--adapter`,
~5 MB, for a home that wants to run it on the CPU).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from models.registry import HELD_OUT_MODEL, SURROGATE_MODEL
from models.registry.versions import COMMITTED_ONLY, EMBED_HEAD_TAG, WEIGHTS_TAG
from pipelines.surrogates.code_embed import embed_head_file
from pipelines.surrogates.remote_results import (
    CODE_PAIRS_FILE,
    FORECASTS_FILE,
    HEADS_DIR,
    TRAINING_FILE,
    check_head_file,
    ingested_variants,
)
from warehouse.bin_edges import P_COLS

CODE_VERSION = "2"  # 2: a code-embed version with its head file is a pyfunc model of kernel sources
EMBED_HEAD_ARTIFACT = "embed_head"


def _fit_metrics(fit: pl.DataFrame, cal: pl.DataFrame, calibrator: Any) -> list[Any]:
    """What a committed variant's training run says it did: its fit and calibration sizes, and
    the calibration Brier and NLL of its forecasts before and after the calibrator fitted here."""
    import time

    from mlflow.entities import Metric

    from pipelines.surrogates.classical import calibration_metrics

    values = {"fit_pairs": float(fit.height), "calibration_pairs": float(cal["pair_id"].n_unique() if cal.height else 0)}
    if cal.height:
        p, y = cal.select(P_COLS).to_numpy(), cal["true_bin"].to_numpy()
        values |= calibration_metrics(p, y, "before") | calibration_metrics(calibrator.apply(p), y, "after")
    now = int(time.time() * 1000)
    return [Metric(k, v, now, 0) for k, v in values.items() if v == v]


def _history_metrics(client: Any, run_id: str, history: list[dict[str, Any]]) -> None:
    for epoch in history:
        for k, v in epoch.items():
            if k != "epoch" and isinstance(v, (int, float)):
                client.log_metric(run_id, k, float(v), step=int(epoch["epoch"]))


def register_variants(con: Any, tracking_uri: str, data_dir: Path, into: Path, results: Path | None,
                      variants: list[str], base_model: str = "smollm2", dataset_version: str | None = None,
                      run_tags: dict[str, str] | None = None, *,
                      head_logger: Callable[[Path, str, str], Any]) -> dict[str, int]:
    """Register every ingested variant (re-used when an equal version exists); name -> version.

    Args:
        into: the committed run folder (forecasts, records, fit pairs, heads/, adapters/).
        results: the host run's output folder, when at hand (a head variant's heads.pt); None
            registers from the committed folder alone.
        dataset_version: the dataset version the versions are scored on (tag and key
            `dataset_version`; default: the one each variant was trained on).
        run_tags: further tags of the MLflow runs (dagster_run_id, git_commit).
        head_logger: (head file, calibrator JSON, base model) -> MLflow's ModelInfo, called in the
            run of a code-embed variant with its head file: what that version is logged as. The
            product passes pipelines.forecasting.embed.log_embed_head_model, the pyfunc model of
            kernel sources; it comes from the caller because the forecasting package stands above
            this one.
    """
    import mlflow

    from models.calibration import Calibrator, fit_calibrator
    from models.registry.tracking import log_training_data, mlflow_experiment
    from models.registry.versions import find_versions, register_logged_model, register_surrogate
    from warehouse.datasets import held_measurements, pair_measurement_ids
    from warehouse.lineage import record_model_lineage

    training = json.loads((into / TRAINING_FILE).read_text())
    frame = pl.read_parquet(into / FORECASTS_FILE)
    fit_pairs = pl.read_parquet(into / CODE_PAIRS_FILE)
    run = str(into.resolve().relative_to(data_dir.resolve())) if into.resolve().is_relative_to(data_dir.resolve()) else str(into)
    client = mlflow.MlflowClient(tracking_uri)
    experiment = mlflow_experiment(client, tracking_uri, "kernelcast-training")
    out = {}
    for name in variants:
        record = training["variants"][name]
        settings, held = record["settings"], bool(record["settings"].get("held_out"))
        model_name = HELD_OUT_MODEL if held else SURROGATE_MODEL
        trained = record["dataset_version"]
        key = {"kind": "llm", "committed_run": run.replace("/", "."), "committed_variant": name,
               "dataset_version": dataset_version or trained, "code_version": CODE_VERSION}
        head_file = into / HEADS_DIR / embed_head_file(name) if settings["finetune"] == "embed_head" else None
        if head_file is not None and head_file.is_file():
            check_head_file(head_file, name, trained)
            # In the key: a version registered before its head was kept is not re-used for one with it.
            key[EMBED_HEAD_TAG] = f"{EMBED_HEAD_ARTIFACT}/{head_file.name}"
        else:
            head_file = None
        found = find_versions(tracking_uri, model_name, **key)
        if found:
            out[name] = int(found[0]["version"])
            continue
        cal = frame.filter((pl.col("variant") == name) & (pl.col("role") == ("held_out_calibration" if held else "calibration")))
        calibrator = fit_calibrator(cal.select(P_COLS).to_numpy(), cal["true_bin"].to_numpy()) if cal.height else Calibrator()
        run_id = client.create_run(experiment, tags={**(run_tags or {}), **key, "trained_on": "nvidia-h200"},
                                   run_name=f"committed-{name}").info.run_id
        fit = fit_pairs.filter(pl.col("role") == ("held_out_fit" if held else "fit"))
        is_held = held_measurements(con, trained)[0]
        fit_ids, cal_ids = ((pair_measurement_ids(con, trained, fit), pair_measurement_ids(con, trained, cal))
                            if is_held else (None, None))
        log_training_data(tracking_uri, run_id, trained, fit_ids,
                          fit.select("pair_id", "true_bin").to_pandas() if fit.height else None, held=is_held,
                          calibration_measurement_ids=cal_ids)
        client.log_batch(run_id, params=[mlflow.entities.Param(k, str(v)[:500]) for k, v in settings.items()],
                         metrics=_fit_metrics(fit, cal, calibrator))
        _history_metrics(client, run_id, record["history"]["history"])
        client.log_text(run_id, json.dumps(record, indent=1, default=str), "training_record.json")
        tags = {**key, "calibrator": json.dumps(calibrator.to_dict()), "finetune": settings["finetune"],
                "prompt_style": str(settings.get("style")), "trained_dataset_version": trained}
        adapter = into / "adapters" / name
        if settings["finetune"] == "lora" and (adapter / "adapter_model.safetensors").is_file():
            client.set_terminated(run_id, "FINISHED")
            version = register_surrogate(tracking_uri, run_id, adapter, name=model_name, base_model=base_model,
                                         dataset_version=dataset_version or trained, con=con,
                                         prompt_style=settings.get("style"), trained_dataset_version=trained,
                                         trained_dataset_held=is_held, tags=tags,
                                         dagster_run_id=(run_tags or {}).get("dagster_run_id"))
        else:  # a head (its weights an artifact of the run), boosted trees on the LLM's reading, GRPO, or a
            # LoRA whose adapter the committed folder does not carry: committed forecasts
            heads = results / "heads.pt" if results is not None else None
            if settings["finetune"] == "head" and heads is not None and heads.is_file():
                client.log_artifact(run_id, str(heads), "head")
            if head_file is not None:  # it forecasts any pair: a pyfunc model of kernel sources
                client.log_artifact(run_id, str(head_file), EMBED_HEAD_ARTIFACT)
                mlflow.set_tracking_uri(tracking_uri)
                with mlflow.start_run(run_id=run_id):
                    logged = head_logger(head_file, tags["calibrator"], base_model)
            else:  # no weights here: a record of the run, tagged committed-only (promotion refuses it)
                logged = mlflow.create_external_model(name=name, experiment_id=experiment, source_run_id=run_id)
            client.set_terminated(run_id, "FINISHED")
            version = register_logged_model(tracking_uri, f"models:/{logged.model_id}", model_name, run_id=run_id,
                                            kind="llm", tags={**tags, **({} if head_file else {WEIGHTS_TAG: COMMITTED_ONLY})},
                                            description=({"head": f"head on {base_model}'s hidden states",
                                                          "embed_head": f"boosted trees on {base_model}'s hidden states "
                                                                        "and the source features",
                                                          "lora": f"LoRA on {base_model} (its adapter not committed)"}
                                                         .get(settings["finetune"], f"GRPO on code-lora ({base_model})"))
                                                        + f", committed H200 forecasts, trained on {trained}"
                                                        + ("; new pairs read on the CPU" if head_file else ""))
            record_model_lineage(con, model_name, version, trained, mlflow_run_id=run_id, base_model=base_model,
                                 git_commit=(run_tags or {}).get("git_commit"),
                                 dagster_run_id=(run_tags or {}).get("dagster_run_id"), require_held=is_held)
        out[name] = int(version)
    return out


def register_ingested(con: Any, tracking_uri: str, data_dir: Path, run: str, dataset_version: str,
                      base_model: str = "smollm2", run_tags: dict[str, str] | None = None, *,
                      head_logger: Callable[[Path, str, str], Any]) -> list[tuple[str, str, int]]:
    """Register every variant `ingest` wrote into the committed run folder `run` (under data_dir)
    for a run scored on `dataset_version`, from the committed folder alone (what `kernelcast run`
    does); (variant, registered model, version) each, re-used when already registered;
    `head_logger` as for `register_variants`."""

    into = Path(data_dir) / run
    names = ingested_variants(into)
    if not names:
        return []
    versions = register_variants(con, tracking_uri, Path(data_dir), into, None, names, base_model, dataset_version, run_tags,
                                 head_logger=head_logger)
    held = {k: bool(v["settings"].get("held_out"))
            for k, v in json.loads((into / TRAINING_FILE).read_text())["variants"].items()}
    return [(k, HELD_OUT_MODEL if held[k] else SURROGATE_MODEL, v) for k, v in versions.items()]
