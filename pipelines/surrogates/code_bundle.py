"""The code-reading LLM's job of a dataset version (models/training/gpu_host/job.py, kind "code"),
written here.

    kernelcast train code build-bundle --out .gpu-batches/llm-bundle
    # on the GPU host: python3 -m models.training.gpu_host.llm_code train --job ... --out OUT
    kernelcast train ingest OUT --job .gpu-batches/llm-bundle --register

The pairs of every role are the evaluation's (pipelines.surrogates.roles.forecasting_roles on the
stored dataset version, the external split included), so what a variant is scored on is what
the report scores; the build refuses a bundle in which a training role touches an eval,
external or held-out lineage (pipelines.curation.splits.find_leakage, then the bundle's own
check models.training.gpu_host.job.leaking_pairs). Each pair carries its source-derived feature vector:
the numeric columns of the cost model's feature table (models.classical.features.FeatureSpace,
fitted on the fit pairs) computed from records with the generator's metadata withheld, as the
LLM itself never sees `algorithm` or `knobs_json`; signed log1p keeps byte counts and program
counts in the range of the rest (pipelines.surrogates.embed_rows, which lays the same vector out
for a pair no bundle held).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from models.training.gpu_host.job import leaking_pairs, write_job
from pipelines.surrogates.embed_rows import pair_feature_vectors, signed_rows
from pipelines.surrogates.roles import DEFAULT_HELD_OUT_TASK, Roles, strip_metadata

PAIR_FIELDS = ("pair_id", "task", "hardware_id", "anchor_kernel_id", "candidate_kernel_id", "true_bin", "speedup")


def role_frames(roles: Roles) -> dict[str, pl.DataFrame]:
    """Every role of the bundle, the external pairs included."""
    return {**roles.by_name(), "external": roles.external_pairs()}


def check_no_leakage(roles: Roles, lineage: pl.DataFrame) -> None:
    """ValueError (one line) when a fit or calibration pair leaks an eval, external or held-out
    lineage (pipelines.curation.splits.find_leakage, per setting)."""
    from pipelines.curation.splits import find_leakage

    def stack(*frames: pl.DataFrame) -> pl.DataFrame:
        frames = tuple(f for f in frames if f.height)
        return pl.concat(frames, how="diagonal_relaxed") if frames else roles.fit.head(0)

    checks = [("in distribution", stack(roles.eval, roles.external_pairs()), stack(roles.fit, roles.calibration), ())]
    if roles.held_out_task:
        checks.append(("held-out task", stack(roles.held_out_eval, roles.external_pairs()),
                       stack(roles.held_out_fit, roles.held_out_calibration), (roles.held_out_task,)))
    for name, scored, train, held in checks:
        if scored.is_empty() or train.is_empty():
            continue
        bad = find_leakage(scored, train, lineage, holdout_tasks=held)
        if bad:
            raise ValueError(f"{name}: {len(bad)} training pairs leak a scored lineage (first: {bad[0]})")


def feature_vectors(frames: Mapping[str, pl.DataFrame], records: dict[str, dict[str, Any]]) -> tuple[dict[str, list[float]], list[str]]:
    """pair_id -> the pair's source-derived feature vector, and the names of its entries."""
    from models.classical.features import FeatureSpace
    from pipelines.surrogates.classical import frame_of

    fit = frames["fit"]
    if fit.is_empty():
        return {}, []
    stripped = strip_metadata(records)
    space = FeatureSpace().fit(frame_of(fit, stripped))
    out: dict[str, list[float]] = {}
    names: list[str] = []
    for frame in frames.values():
        frame = frame.filter(~pl.col("pair_id").is_in(list(out)))
        if frame.is_empty():
            continue
        table = space.transform(frame_of(frame, stripped))
        names = names or [c for c in table.columns if table[c].dtype.kind in "fiub"]
        out.update(zip(frame["pair_id"].to_list(), signed_rows(table, names), strict=True))
    return out, names


def named_feature_vectors(names: list[str], pairs: pl.DataFrame,
                          records: Mapping[str, Mapping[str, Any]]) -> list[list[float]]:
    """The feature vector `feature_vectors` gives a pair, for pairs no bundle held (a user's
    files): the columns `names` (the bundle's `feature_names`) of each pair in order, from
    records with the generator's metadata withheld, as the bundle's were.

    Raises:
        ValueError: a name that is not a numeric column of the cost model's table (one line).
    """
    if pairs.is_empty():
        return []
    return pair_feature_vectors(names, [records[a] for a in pairs["anchor_kernel_id"]],
                                [records[c] for c in pairs["candidate_kernel_id"]])


def build_bundle(con: duckdb.DuckDBPyConnection, out: str | Path, version: str | None = None,
                 held_out_task: str | None = DEFAULT_HELD_OUT_TASK) -> dict[str, Any]:
    """Write the code-reading LLM's job of a dataset version (default: the newest) into `out`;
    its job.json.

    Raises:
        ValueError: no dataset version or eval pairs, or a training role leaks (one line).
    """
    from pipelines.surrogates.classical import ids_of, kernel_records
    from pipelines.surrogates.export import job_meta, kernel_rows, latest_version, version_roles
    from warehouse.kernels import read_kernels

    version = version or latest_version(con)
    roles = version_roles(con, version, held_out_task)
    lineage = read_kernels(con, with_source=False).select("kernel_id", "parent_kernel_id", "generator")
    check_no_leakage(roles, lineage)
    frames = role_frames(roles)
    ids = ids_of(frames.values())
    records = kernel_records(con, ids)
    vectors, names = feature_vectors(frames, records)
    by_pair: dict[str, dict[str, Any]] = {}
    for role, frame in frames.items():
        for p in frame.select(PAIR_FIELDS).to_dicts():
            row = by_pair.setdefault(p["pair_id"], {**p, "roles": [], "features": vectors.get(p["pair_id"], [])})
            row["roles"].append(role)
    pairs = sorted(by_pair.values(), key=lambda p: p["pair_id"])
    kernels = kernel_rows(con, ids)
    leaks = leaking_pairs(pairs, {k["kernel_id"]: k for k in kernels}, roles.held_out_task)
    if leaks:
        raise ValueError(f"{len(leaks)} training pairs of the job touch a scored lineage (first: {leaks[0]})")
    meta = {**job_meta(con, version, roles.held_out_task, pairs), "feature_names": names,
            "counts": {role: frame.height for role, frame in frames.items()} | {"kernels": len(kernels)}}
    return write_job(out, "code", meta, kernels, pairs)
