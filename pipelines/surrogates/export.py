"""Export a dataset version as a training job for a GPU host (`kernelcast train export`).

The job (models/training/gpu_host/job.py, kind "variants") holds the pairs of every role (pipelines.surrogates.roles),
the prompt source and compile features of each kernel they use, the task descriptions and
benchmark cases, the hardware fingerprints and the variants to train; the host builds the
prompts itself. Nothing about a pair's measured runtime travels but its true bin (the label).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from models.service import fingerprints_or_default
from models.training.gpu_host.job import PROMPT_FEATURES, write_job
from models.training.gpu_host.variants import DEFAULT_VARIANTS, Variant
from pipelines.surrogates.roles import DEFAULT_HELD_OUT_TASK, forecasting_roles
from pipelines.tasks import get_task, prompt_source
from warehouse.datasets import current_dataset_version, read_pairs
from warehouse.kernels import read_kernel_features, read_kernels

PAIR_FIELDS = ("pair_id", "task", "hardware_id", "anchor_kernel_id", "candidate_kernel_id", "true_bin", "speedup")
FEATURE_FIELDS = PROMPT_FEATURES  # the compile features a job's kernel rows carry


class NoDatasetVersion(ValueError):
    """The warehouse holds no dataset version yet (curation has not run)."""


def latest_version(con: duckdb.DuckDBPyConnection) -> str:
    """The newest dataset version; ValueError (one line) when there is none."""
    version = current_dataset_version(con)
    if version is None:
        raise NoDatasetVersion("no dataset version in the warehouse: run `kernelcast run` first")
    return version


def version_hardware(con: duckdb.DuckDBPyConnection, version: str) -> str | None:
    """The reference card of a stored dataset version (pipelines.curation.hardware)."""
    from pipelines.curation.hardware import version_reference_hardware
    from warehouse.datasets import read_dataset_version

    record = read_dataset_version(con, version) or {}
    return version_reference_hardware(record.get("counts") or {}, read_pairs(con, version, "eval"))


def hardware_lineage(con: duckdb.DuckDBPyConnection, hardware_id: str | None) -> pl.DataFrame:
    """kernel_id, parent_kernel_id and generator (which names the external split) of the kernels a
    card's roles may see: every kernel but those measured only on other cards (the generated
    candidates not yet measured anywhere stay, as they did before any second card)."""
    from warehouse.measurements import kernel_hardware

    lineage = read_kernels(con).select("kernel_id", "parent_kernel_id", "generator")
    if hardware_id is None:
        return lineage
    where = kernel_hardware(con)
    here = set(where.filter(pl.col("hardware_id") == hardware_id)["kernel_id"].to_list())
    elsewhere = set(where.filter(pl.col("hardware_id") != hardware_id)["kernel_id"].to_list()) - here
    return lineage.filter(~pl.col("kernel_id").is_in(list(elsewhere))) if elsewhere else lineage


def version_roles(con: duckdb.DuckDBPyConnection, version: str, held_out_task: str | None = DEFAULT_HELD_OUT_TASK,
                  hardware_id: str | None = None):
    """`forecasting_roles` of a stored dataset version, on the pairs of one card.

    Args:
        con: an open connection.
        version: the dataset version.
        held_out_task: the held-out-task setting's task.
        hardware_id: the card (None: the version's reference card; a version of one card is that card).
    Raises:
        ValueError: the version has no eval pairs on the card (one line).
    """
    hardware_id = hardware_id or version_hardware(con, version)
    train, evals = read_pairs(con, version, "train"), read_pairs(con, version, "eval")
    if hardware_id is not None:
        train = train.filter(pl.col("hardware_id") == hardware_id)
        evals = evals.filter(pl.col("hardware_id") == hardware_id)
    if evals.is_empty():
        raise ValueError(f"dataset version {version} has no eval pairs" + (f" on {hardware_id}" if hardware_id else ""))
    return forecasting_roles(train, evals, hardware_lineage(con, hardware_id), held_out_task)


def kernel_rows(con: duckdb.DuckDBPyConnection, kernel_ids: Sequence[str], target: str = "sm_90") -> list[dict[str, Any]]:
    """kernel_id, task, parent_kernel_id, prompt_source and compile features (None if never
    compiled) per kernel: the rows of a job's kernels file."""
    kernels = read_kernels(con, kernel_ids=list(kernel_ids))
    feats = {r["kernel_id"]: r for r in read_kernel_features(con, target, kernel_ids).to_dicts()
             if r["status"] == "compiled"}
    return [{"kernel_id": k["kernel_id"], "task": k["task"], "parent_kernel_id": k.get("parent_kernel_id"),
             "prompt_source": prompt_source(k["task"], k["source"], k["generator"]),
             "features": ({f: feats[k["kernel_id"]][f] for f in FEATURE_FIELDS} if k["kernel_id"] in feats else None)}
            for k in kernels.to_dicts()]


def export_job(
    con: duckdb.DuckDBPyConnection,
    out: str | Path,
    version: str | None = None,
    variants: Sequence[Variant] = DEFAULT_VARIANTS,
    held_out_task: str | None = DEFAULT_HELD_OUT_TASK,
) -> dict[str, Any]:
    """Write the job folder of a dataset version; its job.json.

    Raises:
        ValueError: no dataset version, or a variant needs the held-out setting the data lacks.
    """
    version = version or latest_version(con)
    roles = version_roles(con, version, held_out_task)
    if any(v.held_out for v in variants) and roles.held_out_task is None:
        raise ValueError(f"held-out variants need task {held_out_task!r} in dataset version {version}")
    by_pair: dict[str, dict[str, Any]] = {}
    for role, frame in roles.by_name().items():
        for p in frame.select([c for c in PAIR_FIELDS if c in frame.columns]).to_dicts():
            by_pair.setdefault(p["pair_id"], {**p, "roles": []})["roles"].append(role)
    pairs = sorted(by_pair.values(), key=lambda p: p["pair_id"])
    ids = sorted({p[k] for p in pairs for k in ("anchor_kernel_id", "candidate_kernel_id")})
    kernels = kernel_rows(con, ids)
    meta = {**job_meta(con, version, roles.held_out_task, pairs), "variants": [v.to_dict() for v in variants],
            "counts": {role: frame.height for role, frame in roles.by_name().items()} | {"kernels": len(kernels)}}
    return write_job(out, "variants", meta, kernels, pairs)


def job_meta(con: duckdb.DuckDBPyConnection, version: str, held_out_task: str | None,
             pairs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The fields of job.json every kind shares: dataset version, held-out task, creation time,
    the pairs' tasks (description, benchmark cases) and hardware fingerprints."""
    tasks = sorted({p["task"] for p in pairs})
    return {"dataset_version": version, "held_out_task": held_out_task,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "tasks": {t: {"description": get_task(t).description,
                          "benchmark_cases": [dict(c) for c in get_task(t).benchmark_cases]} for t in tasks},
            "hardware": fingerprints_or_default(con, sorted({p["hardware_id"] for p in pairs}))}


def row_builder(con: duckdb.DuckDBPyConnection):
    """A function (pairs frame, style) -> training rows, reading sources, compile features,
    tasks and hardware from the warehouse once per call (what the GPU job builds on its host)."""
    from models.training.rows import build_training_rows
    def rows(pairs: pl.DataFrame, style: str) -> list[dict[str, Any]]:
        if pairs.is_empty():
            return []
        ids = sorted(set(pairs["anchor_kernel_id"].to_list()) | set(pairs["candidate_kernel_id"].to_list()))
        kernels = {k["kernel_id"]: k for k in kernel_rows(con, ids)}
        tasks = {t: {"description": get_task(t).description, "benchmark_cases": [dict(c) for c in get_task(t).benchmark_cases]}
                 for t in pairs["task"].unique().to_list()}
        hardware = fingerprints_or_default(con, pairs["hardware_id"].unique().to_list())
        return build_training_rows(pairs, {k: v["prompt_source"] for k, v in kernels.items()}, tasks, hardware,
                                   style=style, features={k: v["features"] for k, v in kernels.items() if v["features"]})

    return rows
