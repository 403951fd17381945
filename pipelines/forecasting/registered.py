"""Forecasts of every registered forecaster of a dataset version, whatever its kind.

For the in-distribution report: every version of the surrogate's registered model tagged with
the current dataset version, and the champion. Classical versions forecast every eval pair; an
LLM version with committed H200 forecasts uses them (pipelines.surrogates.committed); an LLM
version without them is planned to forecast a capped subset here (CPU budgets), shard by
shard (pipelines.forecasting.llm_shards). Every LLM forecast goes through the version's
calibrator (tag `calibrator`).

The source-only and external splits: the same in-distribution versions, on the eval pairs from
records stripped of the generator's metadata, and on the external pairs (pipelines.surrogates.roles).

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

from models import baselines
from models.registry import HELD_OUT_MODEL, SURROGATE_MODEL
from pipelines.forecasting.llm_shards import LlmJob, plan_llm_job
from pipelines.forecasting.load import CLASSICAL_KINDS
from pipelines.surrogates.roles import LIBRARY_SPLIT, Roles, held_out_split, strip_metadata
from warehouse.bin_edges import P_COLS

log = logging.getLogger(__name__)

SOURCE_ONLY_SUFFIX = "|source_only"  # a version's forecasts from records without generator metadata


@dataclass(frozen=True)
class ForecasterListing:
    """A row of the report's forecaster listing (a record, not a forecaster): its model_ref,
    kind, split, where it came from and its MLflow run (the run that logged a registered
    version; empty for the others)."""

    model_ref: str
    kind: str
    split: str
    source: str
    run_id: str = ""


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
    forecast_here: bool = True,
) -> tuple[pl.DataFrame, list[ForecasterListing], list[LlmJob]]:
    """Forecast rows of every registered and committed forecaster of the version, every split,
    and the LLM versions to forecast here, planned but not run: their forward passes are what
    a host spreads over its GPUs (pipelines.forecasting.llm_shards).

    Splits (pipelines.surrogates.roles.SPLITS): an in-distribution version forecasts the eval
    pairs (`in_distribution`), the same pairs again from records stripped of the generator's
    metadata (`source_only`, stored as `<ref>|source_only`) and the external pairs (`external`,
    same ref: other pair ids); a held-out version forecasts the held-out pairs. Every version is
    loaded once through `pipelines.forecasting.load_forecaster` and its adapter answers all of
    them, except an LLM version forecast here, whose prompts are planned for the GPU steps
    without loading its weights: its prompts are the two sources and their compile features,
    never `algorithm`/`knobs_json`, so its source-only forecasts are its in-distribution rows.
    With `forecast_here` False (the committed LLM backend: no forward pass here) such a version
    is left out, neither planned nor listed.

    Returns:
        (rows for the warehouse `forecasts` table, the forecasters they and the jobs belong to,
        the LLM jobs).
    """
    from models.registry.hardware import fitted_for
    from models.registry.lifecycle import eval_subset
    from models.registry.versions import alias_version, find_versions
    from pipelines.forecasting import load_forecaster
    from pipelines.surrogates.committed import calibrated_variants

    frames: list[pl.DataFrame] = []
    listed: list[ForecasterListing] = []
    jobs: list[LlmJob] = []
    registered_variants: set[str] = set()
    external = roles.external_pairs()
    stripped = strip_metadata(records)
    committed = {}
    if committed_dir is not None and (committed_dir / "forecasts.parquet").is_file():
        # The eval and the external pairs: a committed variant forecast both (an ingested host run does).
        targets = pl.concat([roles.eval, external], how="diagonal_relaxed") if external.height else roles.eval
        committed = {v.name: v for v in calibrated_variants(committed_dir, targets, roles.held_out_eval)}
    champion = alias_version(tracking_uri, "champion", SURROGATE_MODEL)
    settings = [(SURROGATE_MODEL, "in_distribution", roles.eval)]
    settings += [(HELD_OUT_MODEL, split, roles.for_split(split)[2]) for split in roles.held_out_splits()]
    for name, split, pairs in settings:
        if pairs.is_empty():
            continue
        # A version fitted on another card's pairs is scored in the cross-hardware report, not here.
        versions = {v["version"]: v for v in find_versions(tracking_uri, name, dataset_version=dataset_version)
                    if (name == SURROGATE_MODEL or version_split(v) == split)
                    and fitted_for(v, roles.hardware_id, roles.hardware_id)}
        if name == SURROGATE_MODEL and champion is not None and champion not in versions:
            versions.update({v["version"]: v for v in find_versions(tracking_uri, name) if v["version"] == champion})
        in_dist = split == "in_distribution"
        for version, info in sorted(versions.items()):
            kind, ref = info["tags"].get("kind", "llm"), model_ref(name, version)
            needs_passes = _forecast_here(info, committed)
            if needs_passes and not forecast_here:
                progress(f"{ref} ({kind}) left out: no committed forecasts, and the LLM backend makes no forward pass")
                continue
            progress(f"forecasting with {ref} ({kind})")
            run_id = str(info.get("run_id") or "")
            adapter = None if needs_passes else load_forecaster(
                ref, tracking_uri=tracking_uri, home=home, committed_dir=committed_dir)
            if adapter is None:  # an LLM whose forward passes the GPU steps make: planned, weights not loaded
                subset = eval_subset(pairs, llm_cap)
                if in_dist and external.height:  # one job: the eval subset and the external pairs, capped alike
                    subset = pl.concat([subset, eval_subset(external, llm_cap)], how="diagonal_relaxed")
                jobs.append(plan_llm_job(tracking_uri, name, version, info, subset, rows_for,
                                         home / "surrogates" / "plan", ref))
                source = "forecast here"
                listed.append(ForecasterListing(ref, kind, split, source, run_id))
                if in_dist:
                    # Its prompts are the two sources and their compile features: no algorithm or
                    # knobs_json to withhold, so its source-only forecasts are these rows.
                    listed.append(ForecasterListing(ref, kind, "source_only", f"{source} (its prompt carries no metadata)", run_id))
                    if external.height:
                        listed.append(ForecasterListing(ref, kind, "external", source, run_id))
                continue
            if getattr(adapter, "variant", None):  # a committed variant a version carries: not listed again
                registered_variants.add(adapter.variant)
            source = "registered" if kind in CLASSICAL_KINDS else getattr(adapter, "source", "registered")
            frames.append(adapter.forecast_rows(pairs, records))
            listed.append(ForecasterListing(ref, kind, split, source, run_id))
            if not in_dist:
                continue
            twin = ref + SOURCE_ONLY_SUFFIX  # the same adapter called on records without generator metadata
            frames.append(adapter.forecast_rows(pairs, stripped).with_columns(pl.lit(twin).alias("model_ref")))
            listed.append(ForecasterListing(twin, kind, "source_only", f"{source}, metadata withheld", run_id))
            ext_rows = adapter.forecast_rows(external, records) if external.height else pl.DataFrame()
            if ext_rows.height:  # committed forecasts hold only the pairs of their run
                frames.append(ext_rows)
                listed.append(ForecasterListing(ref, kind, "external", source, run_id))
    for name, variant in sorted(committed.items()):
        if name in registered_variants:
            continue
        ref = f"h200:{name}"
        frames.append(_with_ref(variant.forecasts, ref))
        source = "committed H200 forecasts (weights not committed)"
        listed.append(ForecasterListing(ref, "llm", variant.split, source))
        if variant.split == "in_distribution":
            listed.append(ForecasterListing(ref, "llm", "source_only", f"{source}; an LLM reads no metadata"))
            if external.height and variant.forecasts["pair_id"].is_in(external["pair_id"].to_list()).any():
                listed.append(ForecasterListing(ref, "llm", "external", source))
    frames = [f for f in frames if f.height]
    return (pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()), listed, jobs


def version_split(info: dict[str, Any]) -> str:
    """The setting a held-out version was fitted for (its `split` tag; older ones: the task's)."""
    return info["tags"].get("split") or "held_out_task"


def _forecast_here(info: dict[str, Any], committed: dict[str, Any]) -> bool:
    """A registered LLM version without committed forecasts: its pairs go to the GPU steps."""
    return info["tags"].get("kind", "llm") == "llm" and info["tags"].get("committed_variant") not in committed


def reference_listing(roles: Roles) -> list[ForecasterListing]:
    """The reference forecasters (stored once on every eval pair) in the splits that use them."""
    splits = ["in_distribution", "source_only"] + (["external"] if roles.external_pairs().height else [])
    return [ForecasterListing(ref, "baseline", split, "reference") for split in splits for ref in baselines.REFERENCES]


def split_pairs(roles: Roles) -> dict[str, list[str]]:
    """The pair ids each split is scored on (what the forecaster listing records)."""
    return {"in_distribution": roles.eval["pair_id"].to_list(), "source_only": roles.eval["pair_id"].to_list(),
            "held_out_task": roles.held_out_eval["pair_id"].to_list(),
            **{split: frames[2]["pair_id"].to_list() for split, frames in sorted(roles.styles.items())},
            "external": roles.external_pairs()["pair_id"].to_list()}


def empty_reasons(roles: Roles, dataset_version: str) -> dict[str, str]:
    """Why a split has no pairs, for the report (a split is never dropped in silence)."""
    out = {}
    if roles.eval.is_empty():
        out["in_distribution"] = out["source_only"] = f"dataset version {dataset_version} has no eval pairs"
    if roles.held_out_eval.is_empty():
        out["held_out_task"] = f"no held-out task in dataset version {dataset_version}"
    if roles.external_pairs().is_empty():
        out["external"] = (f"dataset version {dataset_version} holds no correct kernel that no learned generator "
                           "wrote (rewrites, hand-written or LLM-written kernels)")
    return out


def held_out_reference_forecasts(roles: Roles) -> tuple[pl.DataFrame, list[ForecasterListing]]:
    """Uniform, bin prior (of the setting's fit pairs: the training pool without the task or the
    style) and oracle on the pairs of each held-out setting, as `<ref>|<split>`."""
    frames, listed = [], []
    keep = ["pair_id", "repeat", "parse_ok", "predicted_bin", *P_COLS]
    for split in roles.held_out_splits():
        fit, _, pairs = roles.for_split(split)
        made = [("baseline:uniform", baselines.uniform_forecasts(pairs)),
                ("baseline:bin_prior", baselines.bin_prior_forecasts(pairs, fit)),
                ("baseline:oracle", baselines.oracle_forecasts(pairs))]
        frames += [f.select(keep).with_columns(pl.lit(f"{ref}|{split}").alias("model_ref")) for ref, f in made]
        listed += [ForecasterListing(f"{ref}|{split}", "baseline", split, "reference") for ref, _ in made]
    return (pl.concat(frames) if frames else pl.DataFrame()), listed


LISTING_KEYS = ("pairs", "forecasters")


def split_frames(frame: pl.DataFrame, listing: dict[str, Any]) -> dict[str, pl.DataFrame]:
    """The forecasts of each report split, model_ref set to the forecaster's name.

    Args:
        frame: forecasts of the version joined with their pairs (with `split`, the pair's split).
        listing: the forecaster listing the forecasts asset stored (`pairs` of each split,
            `forecasters` with model_ref and split; warehouse.forecasts.read_forecast_listing).
    Returns:
        {split: rows}: `in_distribution`, rows of the eval pairs (and discovery pairs) of every
        forecaster not listed only for another split; `source_only`, the eval pairs' rows of the
        forecasters listed there (a `|source_only` twin renamed to its forecaster); `held_out_task`
        and `external`, the rows of their listed forecasters on their pairs. A split without rows
        is left out (its reason is in the listing's `empty`).
    Raises:
        ValueError: the listing lacks its pairs or forecasters (one line).
    """
    missing = [k for k in LISTING_KEYS if k not in listing]
    if missing:
        raise ValueError(f"forecasters listing lacks {', '.join(missing)}: materialise `forecasts` again")
    by_split: dict[str, set[str]] = {}
    for f in listing["forecasters"]:
        by_split.setdefault(f["split"], set()).add(f["model_ref"])
    # A `|source_only` twin says its split by name, listed or not (forecasts written after the listing).
    twins = {r for r in frame["model_ref"].unique().to_list() if r.endswith(SOURCE_ONLY_SUFFIX)} if frame.height else set()
    by_split.setdefault("source_only", set()).update(twins)
    pairs = listing["pairs"]
    held = set().union(*(refs for split, refs in by_split.items() if held_out_split(split)))
    other = (held | by_split.get("source_only", set())) - by_split.get("in_distribution", set())
    out = {"in_distribution": frame.filter(
        (pl.col("pair_id").is_in(pairs.get("in_distribution", [])) | (pl.col("split") == "discovery"))
        & ~pl.col("model_ref").is_in(list(other)))}
    for split in ("source_only", *(s for s in pairs if held_out_split(s)), "external", LIBRARY_SPLIT):
        refs = by_split.get(split, set())
        part = frame.filter(pl.col("model_ref").is_in(list(refs)) & pl.col("pair_id").is_in(pairs.get(split, [])))
        out[split] = part.with_columns(pl.col("model_ref").str.replace(SOURCE_ONLY_SUFFIX, "", literal=True))
    return {k: v for k, v in out.items() if v.height}


def folder_forecasts(
    listed: list[ForecasterListing],
    pairs: pl.DataFrame,
    records: dict[str, dict[str, Any]],
    tracking_uri: str,
    home: Path,
    committed_dir: Path | None,
    training_pairs: pl.DataFrame,
) -> tuple[pl.DataFrame, list[ForecasterListing]]:
    """Forecasts of the library split's pairs (pipelines.surrogates.library_dir) by the reference
    forecasters and every in-distribution forecaster listed that answers here; they are not in
    the warehouse, so the rows go beside the report, not to `forecasts`.

    An LLM version forecast on the GPU steps is not run here (its prompts are planned from the
    warehouse), and committed forecasts hold none of these pairs: both are left out, and the
    returned listing says which forecasters scored the folder.
    """
    from pipelines.forecasting import REFERENCES, load_forecaster

    if pairs.is_empty():
        return pl.DataFrame(), []
    frames, out = [], []
    for ref in REFERENCES:
        f = load_forecaster(ref, training_pairs=training_pairs)
        frames.append(f.forecast_rows(pairs, records))
        out.append(ForecasterListing(ref, "baseline", LIBRARY_SPLIT, "reference"))
    seen = set()
    for f in listed:
        if f.split != "in_distribution" or not f.model_ref.startswith("models:/") or f.source == "forecast here" \
                or f.model_ref in seen:
            continue
        seen.add(f.model_ref)
        rows = load_forecaster(f.model_ref, tracking_uri=tracking_uri, home=home, committed_dir=committed_dir) \
            .forecast_rows(pairs, records)
        if rows.height:
            frames.append(rows)
            out.append(ForecasterListing(f.model_ref, f.kind, LIBRARY_SPLIT, f"{f.source}, on the published kernels",
                                  f.run_id))
    frames = [f for f in frames if f.height]
    return (pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()), out
