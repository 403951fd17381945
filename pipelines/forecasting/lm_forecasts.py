"""Forecasts of a language model (base or trained surrogate) on curated pairs.

Turns each pair into the method's prompt (task description, anchor and candidate sources, the
measured device's hardware table; never a runtime; with "+features" styles the benchmark shapes
and each kernel's compile features), runs any `models.backends.PromptAnswerer`, and returns rows for
the warehouse `forecasts` table. The prompt is the training row builder's
(models.training.rows.pair_prompt), byte for byte. The task reference is stored as a thin wrapper
module, so its prompt shows the reference's actual PyTorch code instead (pipelines.tasks.prompt_source).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import polars as pl

from models.backends import ForecastRequest, PromptAnswerer
from models.training.rows import pair_prompt
from pipelines.tasks import get_task, prompt_source


def task_facts(task: str) -> dict[str, Any]:
    """What a prompt tells of a task: its description and benchmark cases (the training rows' form)."""
    spec = get_task(task)
    return {"description": spec.description, "benchmark_cases": [dict(c) for c in spec.benchmark_cases]}


def sample_pairs(pairs: pl.DataFrame, per_task: int | None) -> pl.DataFrame:
    """The first `per_task` pairs of each task by pair id (all when None): deterministic."""
    ordered = pairs.sort("task", "pair_id")
    return ordered if per_task is None else ordered.group_by("task", maintain_order=True).head(per_task)


def forecast_pairs(pairs: pl.DataFrame, kernels: dict[str, tuple[str, str | None]], hardware: dict[str, Any],
                   forecaster: PromptAnswerer, model_ref: str, *, style: str = "full", repeats: int = 1,
                   progress: Callable[[int, int], None] | None = None,
                   features: Mapping[str, Mapping[str, Any] | None] | None = None) -> pl.DataFrame:
    """One forecast row per (pair, repeat).

    Args:
        pairs: pair_id, task, anchor_kernel_id, candidate_kernel_id (curated pairs).
        kernels: kernel_id -> (source, generator) for every anchor and candidate.
        hardware: the measured device's fingerprint (see models.hardware).
        forecaster: any backend.
        model_ref: the name the rows are stored under (e.g. 'base:smollm2', 'models:/...@champion').
        style: prompt style ('full', 'diff', 'compact', optionally '+features').
        repeats: forecasts per pair.
        progress: called with (done, total) as forecasts come.
        features: kernel_id -> compile features, shown by "+features" styles (absent: n/a).
    Returns:
        Rows with pair_id, model_ref and the `Forecast.to_row()` columns.
    """
    requests, ids = [], []
    for row in pairs.iter_rows(named=True):
        requests.append(ForecastRequest(pair_messages(row, kernels, hardware, style, features),
                                        request_id=row["pair_id"]))
        ids.append(row["pair_id"])
    results = forecaster.forecast(requests, repeats=repeats, progress=progress)
    rows = []
    for i, f in enumerate(results):
        rows.append({"pair_id": ids[i // repeats], "model_ref": model_ref, **f.to_row()})
    return pl.DataFrame(rows, infer_schema_length=None)


def pair_sources(con: Any, pairs: pl.DataFrame) -> dict[str, tuple[str, str | None]]:
    """kernel_id -> (source, generator) for every anchor and candidate of `pairs` (one read)."""
    from warehouse.kernels import read_kernels

    ids = sorted(set(pairs["anchor_kernel_id"]) | set(pairs["candidate_kernel_id"]))
    kernels = read_kernels(con, kernel_ids=ids)
    return {r["kernel_id"]: (r["source"], r["generator"]) for r in kernels.iter_rows(named=True)}


def pair_messages(row: Mapping[str, Any], kernels: Mapping[str, tuple[str, str | None]], hardware: Mapping[str, Any],
                  style: str, features: Mapping[str, Mapping[str, Any] | None] | None = None) -> list[dict[str, str]]:
    """The prompt of one pair (a row with task, anchor_kernel_id, candidate_kernel_id): the
    training row builder's, fed each kernel's prompt source and, for "+features", its features."""
    ids = (row["anchor_kernel_id"], row["candidate_kernel_id"])
    shown = {k: prompt_source(row["task"], *kernels[k]) for k in ids}
    return pair_prompt(row, shown, {row["task"]: task_facts(row["task"])}, hardware, style, features)


def compiled_features(con: Any, kernel_ids: list[str], target: str = "sm_90") -> dict[str, dict[str, Any]]:
    """kernel_id -> compile features of the kernels compiled for `target` (others are left out)."""
    from warehouse.kernels import read_kernel_features

    return {r["kernel_id"]: {k: v for k, v in r.items() if k not in ("kernel_id", "status")}
            for r in read_kernel_features(con, target, kernel_ids).to_dicts() if r["status"] == "compiled"}


def pair_requests(con: Any, pairs: pl.DataFrame, style: str) -> tuple[dict[str, Any], ...]:
    """{"pair_id", "prompt"} per pair, each prompt showing its device's stored fingerprint (the
    default H200 table for a device the warehouse does not know) and, for "+features" styles,
    the kernels' stored compile features; read in one pass."""
    from models.prompts import FEATURES_FLAG
    from models.service import fingerprints_or_default

    kernels = pair_sources(con, pairs)
    hardware = fingerprints_or_default(con, pairs["hardware_id"].unique().to_list())
    features = compiled_features(con, list(kernels)) if style.endswith(FEATURES_FLAG) else None
    return tuple({"pair_id": row["pair_id"],
                  "prompt": pair_messages(row, kernels, hardware[row["hardware_id"]], style, features)}
                 for row in pairs.iter_rows(named=True))
