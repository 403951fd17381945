"""GRPO surrogates of the newest dataset version: every reward variant of the settings trained
here (format warm-up + TRL GRPO, models.training) or re-used, one registered version each."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from models.registry import SURROGATE_MODEL
from models.registry.lifecycle import SurrogateVersion


@dataclass(frozen=True)
class GrpoSurrogates:
    """The variants' versions, in settings order, and what the lineage check reads."""

    dataset_version: str
    train_rows: int  # training pairs of the version
    produced: list[tuple[str, SurrogateVersion]]  # (reward variant, its version)
    missing_lineage: list[str]  # versions registered without a model_lineage row


def _training_inputs(con: duckdb.DuckDBPyConnection, version: str):
    """(training pairs, kernel id -> prompt source, task -> description) of `version`."""
    from pipelines.curation.hardware import on_card
    from pipelines.surrogates.export import version_hardware
    from pipelines.tasks import get_task, prompt_source
    from warehouse.datasets import read_pairs
    from warehouse.kernels import read_kernels

    train = on_card(read_pairs(con, version, "train"), version_hardware(con, version))  # the reference card's
    ids = sorted(set(train["anchor_kernel_id"]) | set(train["candidate_kernel_id"]))
    kernels = read_kernels(con, kernel_ids=ids)
    sources = {r["kernel_id"]: prompt_source(r["task"], r["source"], r["generator"]) for r in kernels.iter_rows(named=True)}
    tasks = {t: get_task(t).description for t in train["task"].unique().to_list()}
    return train, sources, tasks


def train_grpo_surrogates(warehouse_path: str | Path, tracking_uri: str, home: Path, surrogate: Any,
                          dagster_run_id: str, log: Callable[[str], None] = lambda line: None) -> GrpoSurrogates:
    """Train (or re-use) one registered version per reward variant of `surrogate.variants`.

    Args:
        warehouse_path: the DuckDB file (written: `model_lineage`, at each registration).
        tracking_uri: MLflow tracking and registry URI.
        home: the state folder (the base model; each variant's work folder until registered).
        surrogate: the surrogate settings (base_model, variants, training_profile,
            training_overrides, force_retrain).
        dagster_run_id: the training batch; tags the runs, versions and lineage rows.
        log: receives one line per variant.
    Raises:
        NoDatasetVersion: nothing curated yet.
    """
    from models.base_model import resolve_base_model
    from models.registry.lifecycle import base_model_identity, train_or_reuse
    from models.service import fingerprints_or_default
    from models.training.rows import build_training_rows
    from models.training.settings import TrainingSettings
    from pipelines.surrogates.export import NoDatasetVersion
    from warehouse.datasets import current_dataset_version, pair_measurement_ids
    from warehouse.db import connect
    from warehouse.lineage import read_model_lineage

    sur = surrogate
    with connect(warehouse_path, read_only=True) as con:
        version = current_dataset_version(con)
        if version is None:
            raise NoDatasetVersion("no dataset version in the warehouse")
        train, sources, tasks = _training_inputs(con, version)
        measurement_ids = pair_measurement_ids(con, version, train)  # behind its training pairs only
        by_hw = fingerprints_or_default(con, train["hardware_id"].unique().to_list())
    identity = base_model_identity(resolve_base_model(sur.base_model, home))
    produced = []
    for variant in sur.variants:
        ts = TrainingSettings.profile(sur.training_profile, **{**dict(sur.training_overrides),
                                                               "base_model": sur.base_model, "reward": variant})
        rows = build_training_rows(train, sources, tasks, by_hw, style=ts.prompt_style)
        log(f"{variant}: {len(rows)} training rows, profile {sur.training_profile}")
        work = home / "training" / dagster_run_id / variant.replace("+", "_")
        with connect(warehouse_path) as con:  # the lineage row is written at registration
            out = train_or_reuse(ts, rows, work, tracking_uri, version, identity, batch=dagster_run_id,
                                 measurement_ids=measurement_ids, con=con, dagster_run_id=dagster_run_id,
                                 force=sur.force_retrain)
        shutil.rmtree(work, ignore_errors=True)  # the adapter now lives in MLflow's artifacts
        produced.append((variant, out))
    with connect(warehouse_path, read_only=True) as con:
        lineage = read_model_lineage(con, SURROGATE_MODEL)
    recorded = set(lineage["model_version"].to_list()) if lineage.height else set()
    missing = [str(out.version) for _, out in produced if str(out.version) not in recorded]
    return GrpoSurrogates(version, train.height, produced, missing)
