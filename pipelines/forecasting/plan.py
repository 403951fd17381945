"""What the forecasts asset forecasts in its first step, for one dataset version.

Every registered forecaster of the version on each report split (pipelines.forecasting.registered),
the held-out reference forecasters, the fetched external kernels when a folder of them is set
(pipelines.surrogates.library_dir; their rows go beside the report, they are not warehouse
pairs), and the jobs of the language models forecast here: the configured base models on a
sample of eval pairs and the LLM versions without committed forecasts. With them, the listing
the store step writes to the warehouse beside the forecasts (who forecast which pairs of which
split, and why a split is empty).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from pipelines.curation.hardware import on_card
from pipelines.surrogates.roles import LIBRARY_SPLIT

LIBRARY_DIR_ROWS = "library-dir.parquet"  # forecasts of the library split's kernels, beside the report


@dataclass(frozen=True)
class VersionPlan:
    """rows: the forecasts made here and now (None when there are none); jobs: the language
    models' forecasts left to the GPU steps; listing: what the store step records."""

    rows: pl.DataFrame | None
    jobs: list
    listing: dict[str, Any]


def plan_version_forecasts(warehouse_path: str | Path, tracking_uri: str, cfg: Any, version: str,
                           forecast_here: bool, log: Callable[[str], None] = print,
                           warn: Callable[[str], None] | None = None) -> VersionPlan:
    """The registered, held-out and fetched forecasts of `version` and the language-model jobs.

    Args:
        warehouse_path: the DuckDB file (read only).
        tracking_uri: the MLflow registry the versions are read from.
        cfg: the settings (surrogate: held_out_task, committed_run, eval_pairs; evaluation:
            lm_models, lm_pairs_per_task, lm_prompt_style, library_dir; home, data_dir, reports_dir).
        version: the dataset version.
        forecast_here: whether the LLM backend makes forward passes (else no LLM job is planned).
        log: where progress lines go; warn: where a warning goes (default: log).
    Raises:
        ValueError: a language model's jobs cannot be planned.
    """
    from pipelines.forecasting.registered import (
        empty_reasons,
        held_out_reference_forecasts,
        reference_listing,
        registered_forecasts,
        split_pairs,
    )
    from pipelines.surrogates.classical import ids_of, kernel_records
    from pipelines.surrogates.export import row_builder, version_roles
    from warehouse.db import connect

    committed = cfg.data_dir / cfg.surrogate.committed_run
    committed = committed if committed.is_dir() else None
    with connect(warehouse_path, read_only=True) as con:
        roles = version_roles(con, version, cfg.surrogate.held_out_task)
        records = kernel_records(con, ids_of(roles.scored_frames()))
        rows, listed, jobs = registered_forecasts(tracking_uri, version, roles, records, cfg.home, committed,
                                                  row_builder(con), cfg.surrogate.eval_pairs, progress=log,
                                                  forecast_here=forecast_here)
    held_rows, held_listed = held_out_reference_forecasts(roles)
    out_dir = cfg.reports_dir / version
    out_dir.mkdir(parents=True, exist_ok=True)
    pairs, empty = split_pairs(roles), empty_reasons(roles, version)
    fetched, fetched_listed, fetched_note = _fetched_library(warehouse_path, tracking_uri, cfg, version, roles,
                                                             records, listed, committed, out_dir, log, warn or log)
    if fetched:
        pairs[LIBRARY_SPLIT] = fetched
    elif fetched_note:
        empty[LIBRARY_SPLIT] = fetched_note
    listing = {"held_out_task": roles.held_out_task, "pairs": pairs, "empty": empty, "library_dir": fetched_note,
               "forecasters": [dataclasses.asdict(f) for f in reference_listing(roles) + listed + held_listed
                               + fetched_listed]}
    frames = [f for f in (rows, held_rows) if f.height]
    base_jobs = base_model_jobs(warehouse_path, cfg.evaluation, version) if forecast_here else []
    return VersionPlan(pl.concat(frames, how="diagonal_relaxed") if frames else None, base_jobs + jobs, listing)


def base_model_jobs(warehouse_path: str | Path, evaluation: Any, version: str) -> list:
    """The jobs of each configured base language model on a deterministic sample of eval pairs."""
    if not evaluation.lm_models:
        return []
    from pipelines.forecasting.llm_shards import plan_base_job
    from pipelines.forecasting.lm_forecasts import sample_pairs
    from pipelines.surrogates.export import version_hardware
    from warehouse.datasets import read_pairs
    from warehouse.db import connect

    with connect(warehouse_path, read_only=True) as con:
        evals = sample_pairs(on_card(read_pairs(con, version, "eval"), version_hardware(con, version)),
                             evaluation.lm_pairs_per_task)
        return [plan_base_job(con, spec, evals, evaluation.lm_prompt_style) for spec in evaluation.lm_models]


def _fetched_library(warehouse_path, tracking_uri, cfg, version, roles, records, listed, committed, out_dir, log,
                     warn):
    """The `library` split: the published kernels of settings.evaluation.library_dir
    (KERNELCAST_LIBRARY_DIR), when set, forecast by every forecaster that answers here, rows
    written beside the report. Returns (their pair ids, their forecasters, a one-line note: the
    folder and what came of it); a bad folder, or one holding a kernel the version learns from, is
    the report's note, not a failed run."""
    from pipelines.forecasting.registered import folder_forecasts
    from pipelines.surrogates.classical import kernel_records
    from pipelines.surrogates.library_dir import ENV, read_library_dir
    from warehouse.checks_curation import reference_kernel_ids
    from warehouse.datasets import read_pairs
    from warehouse.db import connect

    rows_path = out_dir / LIBRARY_DIR_ROWS
    rows_path.unlink(missing_ok=True)  # never score an earlier run's folder
    folder = cfg.evaluation.library_dir
    if not folder:
        return [], [], None
    try:
        with connect(warehouse_path, read_only=True) as con:
            train = on_card(read_pairs(con, version, "train"), roles.hardware_id)
            # Each task's reference kernel: what the worker timed the published kernels against.
            refs = reference_kernel_ids(con)
            anchors = kernel_records(con, refs.values())
        learned = {k for f in roles.all_frames() for c in ("candidate_kernel_id", "anchor_kernel_id")
                   for k in f[c].to_list()}
        pairs, fetched_records = read_library_dir(folder, refs, learned - set(refs.values()))
        fetched_records = _as_read(fetched_records, cfg.home, log)
        rows, fetched_listed = folder_forecasts(listed, pairs, {**anchors, **records, **fetched_records}, tracking_uri,
                                                cfg.home, committed, train)
    except ValueError as exc:
        note = f"{ENV}={folder}: {str(exc).splitlines()[0]}"
        warn(note)
        return [], [], note
    if rows.height:
        rows.join(pairs.drop("split"), on="pair_id").with_columns(pl.lit(LIBRARY_SPLIT).alias("split")) \
            .write_parquet(rows_path)
    note = f"{ENV}={folder}: {pairs.height} pairs of published kernels"
    log(note)
    return (pairs["pair_id"].to_list() if rows.height else []), fetched_listed, note


def _as_read(records: dict[str, dict[str, Any]], home: Path, log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """The library kernels' records as `kernelcast forecast` would read their files (the one
    reader, pipelines.forecasting.files: compile and trace on a stand-in device, features cached
    by source digest under the home), so the split scores forecasters on what a user's file gives
    them. A kernel the reader refuses keeps its bare record and the refusal is logged."""
    from pipelines.forecasting.files import read_kernel_sources
    from pipelines.forecasting.source_features import FeatureCache
    from pipelines.forecasting.sources import FEATURE_CACHE_DIR

    out = dict(records)
    cache = FeatureCache(home / FEATURE_CACHE_DIR)
    by_task: dict[str, list[str]] = {}
    for kid, rec in records.items():
        by_task.setdefault(str(rec.get("task")), []).append(kid)
    for task, ids in sorted(by_task.items()):
        read = read_kernel_sources(task, [records[k]["source"] for k in ids], names=ids, cache=cache)
        for kid, f in zip(ids, read, strict=True):
            if f.record is not None:
                out[kid] = {**f.record, **{k: v for k, v in records[kid].items() if v is not None}}
            else:
                log(f"library kernel {kid[:12]} ({task}) refused by the reader: {f.refused}")
    return out


# Columns of a reference forecast that describe its pair, not the forecast (the table joins pairs).
REFERENCE_PAIR_COLUMNS = ("task", "hardware_id", "anchor_kernel_id", "candidate_kernel_id", "pair_type", "true_speedup",
                          "model")


def plan_forecast_step(warehouse_path: str | Path, tracking_uri: str, cfg: Any, forecast_here: bool, n_gpus: int,
                       folder: Path, log: Callable[[str], None] = print,
                       warn: Callable[[str], None] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The first step of the forecasts asset: the reference forecasters on every eval and
    discovery pair and `plan_version_forecasts`' rows written to `folder` for the store step,
    and the language models' jobs dealt into at most `n_gpus` shard files there.

    Returns:
        (plan, shards). plan: dataset_version, eval_pairs, single_step (the row files),
        reference_models, missing_reference (reference forecasters short of a pair), expected
        (model_ref -> the pair ids its rows must cover), listing. shards: one {"gpu", "shard"
        (its file), "pairs", "models"} per GPU with work.
    Raises:
        ValueError: no dataset version, or jobs that cannot be planned or dealt (one line).
    """
    from models.baselines import REFERENCES
    from pipelines.forecasting.llm_shards import expected_pairs, split_jobs, write_shard
    from pipelines.forecasting.references import reference_forecasts
    from pipelines.surrogates.export import version_hardware
    from warehouse.datasets import current_dataset_version, read_pairs
    from warehouse.db import connect

    with connect(warehouse_path, read_only=True) as con:
        version = current_dataset_version(con)
        if version is None:
            raise ValueError("no dataset version yet: materialise curated_pairs first")
        # The reference card's pairs: another card's are the cross-hardware report's.
        card = version_hardware(con, version)
        evals = on_card(pl.concat([read_pairs(con, version, "eval"), read_pairs(con, version, "discovery")],
                                  how="diagonal_relaxed"), card)
        reference = reference_forecasts(evals, on_card(read_pairs(con, version, "train"), card))
    try:
        planned = plan_version_forecasts(warehouse_path, tracking_uri, cfg, version, forecast_here, log=log, warn=warn)
        shards = split_jobs(planned.jobs, n_gpus)  # one shard per GPU with work
    except ValueError as exc:
        raise ValueError(f"forecasts not planned: {str(exc).splitlines()[0]}") from None
    folder.mkdir(parents=True, exist_ok=True)
    frames = [reference.drop([c for c in REFERENCE_PAIR_COLUMNS if c in reference.columns])]
    frames += [planned.rows] if planned.rows is not None and planned.rows.height else []
    single_step = [folder / f"single-step-{i}.parquet" for i in range(len(frames))]
    for frame, path in zip(frames, single_step):
        frame.write_parquet(path)
    per_model = reference.group_by("model_ref").len()
    plan = {
        "dataset_version": version, "eval_pairs": evals.height, "single_step": [str(p) for p in single_step],
        "reference_models": sorted(per_model["model_ref"].to_list()),
        "missing_reference": [m for m in REFERENCES
                              if per_model.filter(pl.col("model_ref") == m)["len"].sum() != evals.height],
        "expected": expected_pairs(planned.jobs), "listing": planned.listing,
    }
    return plan, [{"gpu": i, "shard": str(write_shard(folder / f"shard-gpu{i}.json", shard)),
                   "pairs": sum(len(job.requests) for job in shard), "models": len(shard)}
                  for i, shard in enumerate(shards)]
