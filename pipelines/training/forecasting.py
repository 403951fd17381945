"""Forecasts of every registered forecaster of a dataset version, whatever its kind.

For the in-distribution report: every version of the surrogate's registered model tagged with
the current dataset version, and the champion. Classical versions forecast every eval pair; an
LLM version with committed H200 forecasts uses them (pipelines.training.committed); an LLM
version without them is planned to forecast a capped subset here (CPU budgets), shard by
shard (pipelines.training.llm_shards). Every LLM forecast goes through the version's
calibrator (tag `calibrator`).

For the held-out-task report: the held-out versions of the dataset version on every reference
pair of the held-out task, the reference forecasters there (the bin prior of the training pool
without that task), and the committed held-out LLM variants.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from models.bins import NUM_BINS
from pipelines.training.classical import HELD_OUT_MODEL, forecast_rows
from pipelines.training.llm_shards import LlmJob, plan_llm_job
from pipelines.training.roles import Roles

log = logging.getLogger(__name__)

P_COLS = [f"p{i}" for i in range(1, NUM_BINS + 1)]
SURROGATE = "kernelcast-surrogate"
HELD_OUT_SUFFIX = "|held_out_task"  # the held-out twins of the reference forecasters


@dataclass(frozen=True)
class Forecaster:
    """A forecaster of the report: its model_ref, kind, split and where it came from."""

    model_ref: str
    kind: str
    split: str
    source: str


def model_ref(name: str, version: int) -> str:
    return f"models:/{name}/{int(version)}"


def _with_ref(frame: pl.DataFrame, ref: str) -> pl.DataFrame:
    return frame.with_columns(pl.lit(ref).alias("model_ref"))


def registered_forecasts(
    tracking_uri: str,
    dataset_version: str,
    roles: Roles,
    records: dict[str, dict[str, Any]],
    home: Path,
    committed_dir: Path | None,
    rows_for: Callable[[pl.DataFrame, str], list[dict[str, Any]]],
    llm_cap: int | None,
    progress: Callable[[str], None] = lambda m: None,
) -> tuple[pl.DataFrame, list[Forecaster], list[LlmJob]]:
    """Forecast rows of every registered and committed forecaster of the version, both splits,
    and the LLM versions to forecast here, planned but not run: their forward passes are what
    a host spreads over its GPUs (pipelines.training.llm_shards).

    Returns:
        (rows for the warehouse `forecasts` table, the forecasters they and the jobs belong to,
        the LLM jobs).
    """
    from models.classical.registry import load_classical
    from models.registry import alias_version, find_versions
    from models.surrogate import eval_subset
    from pipelines.training.committed import calibrated_variants

    frames: list[pl.DataFrame] = []
    listed: list[Forecaster] = []
    jobs: list[LlmJob] = []
    committed = {}
    if committed_dir is not None and (committed_dir / "forecasts.parquet").is_file():
        committed = {v.name: v for v in calibrated_variants(committed_dir, roles.eval, roles.held_out_eval)}
    champion = alias_version(tracking_uri, "champion", SURROGATE)
    for name, split, pairs in ((SURROGATE, "in_distribution", roles.eval), (HELD_OUT_MODEL, "held_out_task", roles.held_out_eval)):
        if pairs.is_empty():
            continue
        versions = {v["version"]: v for v in find_versions(tracking_uri, name, dataset_version=dataset_version)}
        if name == SURROGATE and champion is not None and champion not in versions:
            versions.update({v["version"]: v for v in find_versions(tracking_uri, name) if v["version"] == champion})
        for version, info in sorted(versions.items()):
            kind, ref = info["tags"].get("kind", "llm"), model_ref(name, version)
            progress(f"forecasting with {ref} ({kind})")
            if kind in ("cost_model", "text_model"):
                frames.append(_with_ref(forecast_rows(load_classical(tracking_uri, name, version), pairs, records, ref), ref))
                source = "registered"
            elif info["tags"].get("committed_variant") in committed:
                frames.append(_with_ref(committed[info["tags"]["committed_variant"]].forecasts, ref))
                source = f"committed H200 forecasts of {info['tags']['committed_variant']}"
            else:
                jobs.append(plan_llm_job(tracking_uri, name, version, info, eval_subset(pairs, llm_cap), rows_for,
                                         home / "surrogates" / "plan", ref))
                source = "forecast here"
            listed.append(Forecaster(ref, kind, split, source))
    registered_variants = {f.source.rsplit(" ", 1)[-1] for f in listed if f.source.startswith("committed")}
    for name, variant in sorted(committed.items()):
        if name in registered_variants:
            continue
        ref = f"h200:{name}"
        frames.append(_with_ref(variant.forecasts, ref))
        listed.append(Forecaster(ref, "llm", variant.split, "committed H200 forecasts (weights not committed)"))
    frames = [f for f in frames if f.height]
    return (pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()), listed, jobs


def held_out_reference_forecasts(roles: Roles) -> tuple[pl.DataFrame, list[Forecaster]]:
    """Uniform, bin prior (of the training pool without the task) and oracle on the held-out pairs."""
    from models import baselines

    pairs = roles.held_out_eval
    if pairs.is_empty():
        return pl.DataFrame(), []
    made = [("baseline:uniform", baselines.uniform_forecasts(pairs)),
            ("baseline:bin_prior", baselines.bin_prior_forecasts(pairs, roles.held_out_fit)),
            ("baseline:oracle", baselines.oracle_forecasts(pairs))]
    keep = ["pair_id", "repeat", "parse_ok", "predicted_bin", *P_COLS]
    frames = [f.select(keep).with_columns(pl.lit(ref + HELD_OUT_SUFFIX).alias("model_ref")) for ref, f in made]
    return pl.concat(frames), [Forecaster(ref + HELD_OUT_SUFFIX, "baseline", "held_out_task", "reference") for ref, _ in made]


def split_frames(frame: pl.DataFrame, listing: dict[str, Any]) -> dict[str, pl.DataFrame]:
    """The forecasts of each report split.

    Args:
        frame: forecasts of the version joined with their pairs (with `split`, the pair's split).
        listing: the forecasters.json the forecasts asset wrote (held-out pairs, forecasters).
    Returns:
        {"in_distribution": rows of eval and discovery pairs of every forecaster not of the
        held-out split, "held_out_task": rows of the held-out pairs of the held-out forecasters}.
    """
    held = {f["model_ref"] for f in listing.get("forecasters", []) if f["split"] == "held_out_task"}
    held_pairs = listing.get("held_out_pairs", [])
    ind = frame.filter(pl.col("split").is_in(["eval", "discovery"]) & ~pl.col("model_ref").is_in(list(held)))
    out = {"in_distribution": ind}
    if held and held_pairs:
        out["held_out_task"] = frame.filter(pl.col("model_ref").is_in(list(held)) & pl.col("pair_id").is_in(held_pairs))
    return out
