"""Forecasts of a language model (base or trained surrogate) on curated pairs.

Turns each pair into the method's prompt (task description, anchor and candidate sources, the
measured device's hardware table; never a runtime), runs any `models.backends.Forecaster`, and
returns rows for the warehouse `forecasts` table. The task reference is stored as a thin wrapper
module, so its prompt shows the reference's actual PyTorch code instead.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import polars as pl

from models.backends import Forecaster, ForecastRequest
from models.prompts import build_prompt
from pipelines.tasks import TASK_MODULES, get_task


def prompt_source(task: str, source: str, generator: str | None) -> str:
    """The code the model reads for a kernel: the reference's PyTorch body for the reference."""
    if generator == "reference" and task in TASK_MODULES:
        module = importlib.import_module(TASK_MODULES[task])
        return inspect.getsource(module.ref_kernel)
    return source


def sample_pairs(pairs: pl.DataFrame, per_task: int | None) -> pl.DataFrame:
    """The first `per_task` pairs of each task by pair id (all when None): deterministic."""
    ordered = pairs.sort("task", "pair_id")
    return ordered if per_task is None else ordered.group_by("task", maintain_order=True).head(per_task)


def forecast_pairs(pairs: pl.DataFrame, kernels: dict[str, tuple[str, str | None]], hardware: dict[str, Any],
                   forecaster: Forecaster, model_ref: str, *, style: str = "full", repeats: int = 1,
                   progress: Callable[[int, int], None] | None = None) -> pl.DataFrame:
    """One forecast row per (pair, repeat).

    Args:
        pairs: pair_id, task, anchor_kernel_id, candidate_kernel_id (curated pairs).
        kernels: kernel_id -> (source, generator) for every anchor and candidate.
        hardware: the measured device's fingerprint (see models.hardware).
        forecaster: any backend.
        model_ref: the name the rows are stored under (e.g. 'base:smollm2', 'models:/...@champion').
        style: 'full' or 'diff' prompts.
        repeats: forecasts per pair.
    Returns:
        Rows with pair_id, model_ref and the `Forecast.to_row()` columns.
    """
    requests, ids = [], []
    for row in pairs.iter_rows(named=True):
        requests.append(ForecastRequest(pair_messages(row, kernels, hardware, style), request_id=row["pair_id"]))
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


def pair_messages(row: dict[str, Any], kernels: dict[str, tuple[str, str | None]], hardware: dict[str, Any],
                  style: str) -> list[dict[str, str]]:
    """The prompt of one pair (a row with task, anchor_kernel_id, candidate_kernel_id)."""
    task = get_task(row["task"])
    a_src, a_gen = kernels[row["anchor_kernel_id"]]
    c_src, c_gen = kernels[row["candidate_kernel_id"]]
    return build_prompt(task.name, task.description, prompt_source(task.name, a_src, a_gen),
                        prompt_source(task.name, c_src, c_gen), hardware, style=style)


def pair_requests(con: Any, pairs: pl.DataFrame, style: str) -> tuple[dict[str, Any], ...]:
    """{"pair_id", "prompt"} per pair, each prompt showing its device's stored fingerprint (the
    default H200 table for a device the warehouse does not know), read in one pass."""
    from models.service import fingerprints_or_default

    kernels = pair_sources(con, pairs)
    hardware = fingerprints_or_default(con, pairs["hardware_id"].unique().to_list())
    return tuple({"pair_id": row["pair_id"], "prompt": pair_messages(row, kernels, hardware[row["hardware_id"]], style)}
                 for row in pairs.iter_rows(named=True))
