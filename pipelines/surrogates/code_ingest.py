"""A host run of the code-reading LLM (models/training/gpu_host/llm_code.py) brought back: committed, registered.

    python -m orchestration.code_bundle_cli ingest OUT --bundle BUNDLE [--into RUN_DIR] [--register] [--adapter]

`ingest` merges the run's variants into a committed run folder (default: the one the settings'
`surrogate.committed_run` names, so `kernelcast run` reads them) in its format
(pipelines/surrogates/remote_results.py): rows of forecasts.parquet keyed by (hardware, anchor,
candidate) with the bundle's dataset version, the variants' records in training.json (each with
the dataset version it was trained on), their fit pairs in code_training_pairs.parquet and each
code-embed variant's head file (embed-head-<variant>.zip, written by `embed-head` when the host
run kept its principal axes; 0.1-1 MB) under heads/. A variant already there is replaced, with
its head file; the others are kept. The external pairs' forecasts are stored in the eval role:
they are pairs of the eval split of the dataset version, told apart by their candidate's
generator (pipelines.surrogates.roles), and the report scores each split on its own pair ids.

The LoRA adapter of `code-lora` stays out of the committed folder, which travels with the
repository: `code-lora` is then a committed-forecasts variant like the heads. `--adapter` keeps
it there (adapters/code-lora/, bfloat16, ~5 MB) for a home that wants to run it on the CPU; an
ingest without it removes an earlier run's adapter, which would not match the new forecasts.

`register_variants` (`--register`, and `kernelcast run` for every variant `ingest` wrote into
the committed run folder: `register_ingested`) makes each variant a version of
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
"""

from __future__ import annotations

import json
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from models.registry import HELD_OUT_MODEL, SURROGATE_MODEL
from models.registry.versions import COMMITTED_ONLY, EMBED_HEAD_TAG, WEIGHTS_TAG
from models.training.gpu_host.bundle import BundleError, read_bundle
from models.training.gpu_host.jobfile import write_json
from pipelines.surrogates.code_embed import embed_head_file
from warehouse.bin_edges import P_COLS

FORECASTS_FILE = "forecasts.parquet"
TRAINING_FILE = "training.json"
CODE_PAIRS_FILE = "code_training_pairs.parquet"
ROLE_IN_RUN = {"external": "eval"}  # the external pairs are eval-split pairs of the dataset version
CODE_VERSION = "2"  # 2: a code-embed version with its head file is a pyfunc model of kernel sources
EMBED_HEAD_ARTIFACT = "embed_head"
HEADS_DIR = "heads"  # the committed run folder's code-embed head files
LORA_VARIANT = "code-lora"


def read_run(results: str | Path) -> tuple[pl.DataFrame, dict[str, Any]]:
    """(forecasts, metrics.json) of a host run's output folder; BundleError when unreadable."""
    root = Path(results)
    try:
        frame = pl.read_parquet(root / "forecasts.parquet")
        metrics = json.loads((root / "metrics.json").read_text())
    except FileNotFoundError as e:
        raise BundleError(f"{root}: not a host run's output ({Path(e.filename).name} missing)") from None
    except (OSError, ValueError, pl.exceptions.PolarsError) as e:
        raise BundleError(f"{root}: unreadable ({type(e).__name__}: {e})") from None
    return frame, metrics


def committed_rows(frame: pl.DataFrame, meta: dict[str, Any], pairs: list[dict[str, Any]]) -> pl.DataFrame:
    """The run's forecasts in the committed form (keys, true bin, dataset version per row).

    Raises:
        BundleError: a forecast of a pair the bundle lacks, in a role the pair does not serve,
            or whose probabilities are not a distribution.
    """
    by_id = {p["pair_id"]: p for p in pairs}
    unknown = sorted(set(frame["pair_id"].to_list()) - set(by_id))
    if unknown:
        raise BundleError(f"{len(unknown)} forecasts of pairs the bundle does not hold (first: {unknown[0]})")
    wrong = [(r, pid) for r, pid in frame.select("role", "pair_id").rows() if r not in by_id[pid]["roles"]]
    if wrong:
        raise BundleError(f"{len(wrong)} forecasts in a role their pair does not serve (first: {wrong[0]})")
    p = frame.select(P_COLS).to_numpy()
    if len(p) and (abs(p.sum(axis=1) - 1).max() > 1e-4 or p.min() < 0):
        raise BundleError("forecasts whose probabilities do not sum to 1")
    keys = pl.DataFrame([{k: by_id[pid][k] for k in ("pair_id", "task", "hardware_id", "anchor_kernel_id",
                                                       "candidate_kernel_id", "true_bin")} for pid in by_id])
    out = frame.join(keys, on="pair_id", how="left").with_columns(
        pl.col("role").replace(ROLE_IN_RUN), pl.lit(meta["dataset_version"]).alias("dataset_version"),
        pl.lit(True).alias("parse_ok"), pl.lit(None, dtype=pl.Utf8).alias("parse_error"),
        pl.col("true_bin").cast(pl.Int64), pl.col("repeat").cast(pl.Int64))
    cols = ["variant", "role", "readout", "repeat", "dataset_version", "pair_id", "task", "hardware_id",
            "anchor_kernel_id", "candidate_kernel_id", "true_bin", "parse_ok", "parse_error", *P_COLS]
    return out.select(cols)


def variant_records(metrics: dict[str, Any], meta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """training.json records of the run's variants: settings (name, style, held_out, kind,
    finetune), status, per-epoch history and the dataset version it was trained on."""
    out = {}
    for name, m in metrics.get("variants", {}).items():
        held = m.get("setting") == "held_out_task"
        settings = {"name": name, "style": m.get("style"), "held_out": held, "kind": m.get("kind"),
                    "finetune": {"lora": "lora", "grpo": "grpo", "embed_head": "embed_head"}.get(m.get("kind"), "head"),
                    **({"features": bool(m.get("features"))} if m.get("kind") in ("head", "embed_head") else {}),
                    **({"parts": m.get("parts"), "ablation_brier": m.get("ablation_brier")}
                       if m.get("kind") == "embed_head" else {}),
                    **{f"head_{k}": v for k, v in (m.get("settings") or {}).items() if m.get("kind") == "head"},
                    **({"trained": m.get("settings")} if m.get("kind") in ("lora", "grpo") else {})}
        status = {"name": name, "best_epoch": m.get("best_epoch"), "finished": m.get("finished", True),
                  "split": "held_out_task" if held else "in_distribution", "evaluated": True,
                  **{k: m[k] for k in ("fit_pairs", "calibration_pairs", "rows_used", "epochs_run", "seconds",
                                       "prefill", "width") if k in m}}
        out[name] = {"settings": settings, "status": status, "history": {"history": m.get("history", [])},
                     "dataset_version": meta["dataset_version"]}
    return out


def _write_parquet(frame: pl.DataFrame, path: Path) -> None:
    tmp = path.with_name(path.name + ".part")
    frame.write_parquet(tmp, compression="zstd")
    tmp.replace(path)


def _adapter_into(results: Path, target: Path) -> bool:
    """The LoRA variant's best adapter (config + weights in bfloat16) into target; False if none."""
    import torch
    from safetensors.torch import load, save_file

    tar_path = results / "lora-best.tar"
    if not tar_path.is_file():
        return False
    with tarfile.open(tar_path) as tar:
        files = {Path(m.name).name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    if "adapter_model.safetensors" not in files or "adapter_config.json" not in files:
        raise BundleError(f"{tar_path}: no adapter in it")
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    weights = load(files["adapter_model.safetensors"])
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()}, str(target / "adapter_model.safetensors"))
    (target / "adapter_config.json").write_bytes(files["adapter_config.json"])
    return True


def ingest(results: str | Path, bundle: str | Path, into: str | Path, adapter: bool = False) -> dict[str, Any]:
    """Merge a host run's variants into the committed run folder `into`; a summary.

    Args:
        adapter: also keep code-lora's adapter under adapters/code-lora/ (else any there goes).
    Raises:
        BundleError: the run is not of the bundle's dataset version, or a head file is not its
            variant's (nothing written).
    """
    from pipelines.surrogates.remote_results import training_pairs_frame

    results, into = Path(results), Path(into)
    meta, _, pairs = read_bundle(bundle)
    frame, metrics = read_run(results)
    if metrics.get("dataset_version") != meta["dataset_version"]:
        raise BundleError(f"{results} was trained on {metrics.get('dataset_version')}, the bundle is {meta['dataset_version']}")
    rows = committed_rows(frame, meta, pairs)
    # A variant without forecasts (a LoRA run that has not finished an epoch yet) waits for a later trip.
    records = {k: v for k, v in variant_records(metrics, meta).items() if k in set(frame["variant"].to_list())}
    heads = {}  # variant -> its head file in the results folder, or None (a host run without axes)
    for name, record in records.items():
        if record["settings"]["finetune"] == "embed_head":
            src = results / embed_head_file(name)
            if src.is_file():
                _check_head_file(src, name, meta["dataset_version"])
            heads[name] = src if src.is_file() else None
    into.mkdir(parents=True, exist_ok=True)
    new = set(records)
    if (into / FORECASTS_FILE).is_file():
        old = pl.read_parquet(into / FORECASTS_FILE).filter(~pl.col("variant").is_in(list(new)))
        rows = pl.concat([old, rows], how="diagonal_relaxed")
    training = json.loads((into / TRAINING_FILE).read_text()) if (into / TRAINING_FILE).is_file() else {
        "dataset_version": meta["dataset_version"], "held_out_task": meta.get("held_out_task"), "variants": {}}
    training["variants"] = {**training.get("variants", {}), **records}
    _write_parquet(rows, into / FORECASTS_FILE)
    _write_parquet(training_pairs_frame(pairs), into / CODE_PAIRS_FILE)
    write_json(into / TRAINING_FILE, training)
    for name, src in heads.items():  # an earlier run's head would not match these forecasts: replaced or removed
        dst = into / HEADS_DIR / embed_head_file(name)
        if src is None:
            dst.unlink(missing_ok=True)
        else:
            dst.parent.mkdir(exist_ok=True)
            shutil.copyfile(src, dst.with_name(dst.name + ".part"))
            dst.with_name(dst.name + ".part").replace(dst)
    copied = False
    if LORA_VARIANT in new:
        target = into / "adapters" / LORA_VARIANT
        copied = adapter and _adapter_into(results, target)
        if not copied:
            shutil.rmtree(target, ignore_errors=True)
    return {"variants": sorted(new), "forecasts": int(frame.height), "adapter": bool(copied),
            "head_files": {k: f"{HEADS_DIR}/{v.name}" for k, v in sorted(heads.items()) if v is not None},
            "dataset_version": meta["dataset_version"], "into": str(into)}


def ingested_variants(into: str | Path) -> list[str]:
    """The variants of a committed run folder that `ingest` wrote: their record names the
    dataset version they were trained on ([] without a training.json)."""
    path = Path(into) / TRAINING_FILE
    if not path.is_file():
        return []
    return sorted(k for k, v in json.loads(path.read_text()).get("variants", {}).items() if v.get("dataset_version"))


def _check_head_file(path: Path, variant: str, dataset_version: str) -> None:
    """BundleError (one line) when a results folder's head file is not this variant's of this data."""
    from models.training.embed_head import read_head_spec

    try:
        spec = read_head_spec(path)
    except ValueError as e:
        raise BundleError(str(e)) from None
    if (spec.get("variant"), spec.get("dataset_version")) != (variant, dataset_version):
        raise BundleError(f"{path} is the head of {spec.get('variant')} on {spec.get('dataset_version')}, "
                          f"not of {variant} on {dataset_version}: run embed-head again")


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
            _check_head_file(head_file, name, trained)
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
