"""Train, calibrate and apply the classical forecasters on a dataset version's roles.

    roles = version_roles(con, version)                       # pipelines.surrogates.export
    records = kernel_records(con, ids_of(roles))
    fitted = fit_classical("cost_model", roles, "in_distribution", records)
    frame = forecast_rows(fitted.model, roles.eval, records, model_ref)

Everything reads the warehouse through `warehouse`, and models through `models.classical`; the
assets only wire them together.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import polars as pl

from models.bins import NUM_BINS
from models.classical import BinClassifier, make_classical
from models.classical.features import COMPILE_FIELDS, pair_frame
from models.registry import HELD_OUT_MODEL
from pipelines.surrogates.roles import STYLE_SPLIT_PREFIX, Roles, is_style_split
from warehouse.bin_edges import P_COLS
from warehouse.kernels import forecast_features, read_kernels

log = logging.getLogger(__name__)

RECORD_FIELDS = ("kernel_id", "task", "source", "language", "generator", "algorithm", "knobs_json",
                 "parent_kernel_id", "mutation")
FEATURE_FIELDS = COMPILE_FIELDS  # compile and source features (pipelines.forecasting.source_features)


def ids_of(frames: Iterable[pl.DataFrame]) -> list[str]:
    """Every anchor and candidate kernel id of some pair frames."""
    ids: set[str] = set()
    for f in frames:
        if f.height:
            ids |= set(f["anchor_kernel_id"].to_list()) | set(f["candidate_kernel_id"].to_list())
    return sorted(ids)


def kernel_records(con: duckdb.DuckDBPyConnection, kernel_ids: Iterable[str], target: str = "sm_90") -> dict[str, dict[str, Any]]:
    """kernel_id -> kernel record with its compile and source features (None where unknown)."""
    ids = list(kernel_ids)
    kernels = read_kernels(con, kernel_ids=ids)
    feats = forecast_features(con, ids, target)
    out = {}
    for k in kernels.to_dicts():
        rec = {f: k.get(f) for f in RECORD_FIELDS}
        f = feats.get(k["kernel_id"], {})
        rec.update({name: f.get(name) for name in FEATURE_FIELDS})
        out[k["kernel_id"]] = rec
    return out


def frame_of(pairs: pl.DataFrame, records: Mapping[str, Mapping[str, Any]]):
    """The pair frame (models.classical.features) of some pairs."""
    return pair_frame([records[a] for a in pairs["anchor_kernel_id"]], [records[c] for c in pairs["candidate_kernel_id"]])


@dataclass
class Fitted:
    """A fitted, calibrated classical forecaster and what its fit measured."""

    model: BinClassifier
    kind: str
    split: str
    metrics: dict[str, float] = field(default_factory=dict)


def _brier(p: np.ndarray, y: np.ndarray) -> float:
    return float(0.5 * ((p - np.eye(NUM_BINS)[y - 1]) ** 2).sum(axis=1).mean()) if len(y) else float("nan")


PAIR_KEY = ("hardware_id", "anchor_kernel_id", "candidate_kernel_id")


def canonical_order(pairs: pl.DataFrame) -> pl.DataFrame:
    """Pairs sorted by (hardware, anchor, candidate), which no dataset version changes: a pair id
    is qualified by its version, so an order by pair id moves whenever anything else in the version
    does (a second card's pairs, say), and a fit whose optimiser stops at a tolerance (the text
    model's logistic regression) lands a little elsewhere.

    >>> f = pl.DataFrame({"hardware_id": ["h", "h"], "anchor_kernel_id": ["r", "r"], "candidate_kernel_id": ["b", "a"]})
    >>> canonical_order(f)["candidate_kernel_id"].to_list()
    ['a', 'b']
    """
    return pairs.sort(list(PAIR_KEY)) if pairs.height and set(PAIR_KEY) <= set(pairs.columns) else pairs


def _nll(p: np.ndarray, y: np.ndarray) -> float:
    """Mean negative log-likelihood of the true bins (p floored at 1e-12: a zero is a finite miss)."""
    if not len(y):
        return float("nan")
    return float(-np.log(np.clip(np.asarray(p)[np.arange(len(y)), np.asarray(y) - 1], 1e-12, None)).mean())


def calibration_metrics(p: np.ndarray, y: np.ndarray, when: str) -> dict[str, float]:
    """The calibration Brier and NLL of forecasts `p` (n, 8) of true bins `y`, named for `when`
    ("before" or "after" calibrating).

    >>> m = calibration_metrics(np.full((2, 8), 1 / 8), np.array([1, 8]), "after")
    >>> round(m["calibration_brier_after"], 4), round(m["calibration_nll_after"], 4)
    (0.4375, 2.0794)
    """
    return {f"calibration_brier_{when}": _brier(p, y), f"calibration_nll_{when}": _nll(p, y)}


def fit_classical(kind: str, roles: Roles, split: str, records: Mapping[str, Mapping[str, Any]],
                  params: Mapping[str, Any] | None = None, max_fit: int | None = None) -> Fitted:
    """Fit `kind` on the split's fit pairs (the first `max_fit` in `canonical_order`, if given),
    calibrate it on its calibration pairs; both in `canonical_order`, so the same pairs give the
    same model in any dataset version.

    Raises:
        ValueError: the split has no fit pairs.
    """
    fit, calibration, _ = roles.for_split(split)
    fit, calibration = canonical_order(fit), canonical_order(calibration)
    if max_fit is not None:
        fit = fit.head(max_fit)
    if fit.is_empty():
        raise ValueError(f"no fit pairs for split {split!r}")
    model = make_classical(kind, **dict(params or {}))
    t0 = time.perf_counter()
    model.fit(frame_of(fit, records), fit["true_bin"].to_numpy(), np.log2(fit["speedup"].to_numpy()))
    fit_s = time.perf_counter() - t0
    metrics = {"fit_pairs": float(fit.height), "calibration_pairs": float(calibration.height), "fit_seconds": fit_s}
    if calibration.height:
        cal_frame, y = frame_of(calibration, records), calibration["true_bin"].to_numpy()
        metrics.update(calibration_metrics(model.predict_proba(cal_frame), y, "before"))
        model.calibrate(cal_frame, y)
        metrics.update(calibration_metrics(model.predict_proba(cal_frame), y, "after"))
        metrics["temperature"] = model.calibrator_.temperature
    log.info("%s (%s): fit on %d pairs in %.1f s", kind, split, fit.height, fit_s)
    return Fitted(model, kind, split, metrics)


def forecast_rows(model: Any, pairs: pl.DataFrame, records: Mapping[str, Mapping[str, Any]], model_ref: str) -> pl.DataFrame:
    """Rows for the warehouse `forecasts` table: one per pair, repeat 0, always parsed."""
    if pairs.is_empty():
        return pl.DataFrame()
    p = np.asarray(model.predict_proba(frame_of(pairs, records)), dtype=np.float64)
    bins = (np.argmax(p, axis=1) + 1).astype(np.int64)
    base = pl.DataFrame({"pair_id": pairs["pair_id"], "model_ref": [model_ref] * pairs.height,
                         "repeat": [0] * pairs.height, "predicted_bin": bins, "argmax_bin": bins,
                         "raw_sum": p.sum(axis=1), "parse_ok": [True] * pairs.height, "tokens": [0] * pairs.height})
    return pl.concat([base, pl.DataFrame({c: p[:, i] for i, c in enumerate(P_COLS)})], how="horizontal")


FIT_THREADS = 1  # native threads (OpenMP, BLAS) per fit


def _fit_job(kind: str, roles: Roles, split: str, records: Mapping[str, Mapping[str, Any]],
             params: Mapping[str, Any], max_fit: int | None, threads: int = FIT_THREADS) -> Fitted:
    """One fit, its native thread pools capped. One thread per fit, fits side by side: the
    boosted trees run thousands of short OpenMP regions, each waiting for all its threads, and
    on a shared 2-core host a thread that loses its core stalls every region (the measurements:
    docs/results/operations.md)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(threads):
        return fit_classical(kind, roles, split, records, params, max_fit)


def fit_many(jobs: Sequence[tuple[str, str, Mapping[str, Any]]], roles: Roles,
             records: Mapping[str, Mapping[str, Any]], max_fit: int | None = None, *,
             workers: int | None = None, progress: Callable[[str], None] | None = None) -> list[Fitted]:
    """`fit_classical` of each (kind, split, params), side by side in worker processes.

    The fits are independent and each is one core's work (`_fit_job`), so on 2 cores two at a
    time take about half as long. Workers are spawned, not forked: the caller may hold threads (Dagster's
    in-process executor does). `workers` None: the usable cores; 1: this process.

    Returns:
        The fitted models in job order.
    Raises:
        ValueError: a split has no fit pairs (from the first job that fails).
    """
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = min(workers or cores, len(jobs))

    def done(i: int, fitted: Fitted, finished: int) -> None:
        kind, split, _ = jobs[i]
        if progress:
            progress(f"{kind} ({split}): fit on {int(fitted.metrics['fit_pairs'])} pairs in "
                     f"{fitted.metrics['fit_seconds']:.1f} s [{finished}/{len(jobs)}]")

    if n <= 1:
        out = []
        for i, (kind, split, params) in enumerate(jobs):
            out.append(_fit_job(kind, roles, split, records, params, max_fit))
            done(i, out[-1], i + 1)
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    results: dict[int, Fitted] = {}
    with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_fit_job, kind, roles, split, records, params, max_fit): i
                   for i, (kind, split, params) in enumerate(jobs)}
        for fut in as_completed(futures):
            i = futures[fut]
            results[i] = fut.result()
            done(i, results[i], len(results))
    return [results[i] for i in range(len(jobs))]


# bump when features or models change: a registered version is re-used only if equal
# (3: every version is a pyfunc model of kernel sources, pipelines.forecasting.pyfunc;
#  4: the work prior counts the same arithmetic on both sides of a pair, host and device overlapping)
CODE_VERSION = "4"


@dataclass
class Registered:
    """A classical version in the registry and how this run got it."""

    name: str
    version: int
    kind: str
    split: str
    run_id: str | None
    reused: bool
    metrics: dict[str, float] = field(default_factory=dict)


def model_name_for(split: str, name: str) -> str:
    """The registered model a split's versions go to (held-out ones apart, never promoted)."""
    return name if split == "in_distribution" else HELD_OUT_MODEL


def train_and_register(
    con: duckdb.DuckDBPyConnection,
    roles: Roles,
    records: Mapping[str, Mapping[str, Any]],
    kinds: Iterable[str],
    tracking_uri: str,
    dataset_version: str,
    batch: str,
    name: str,
    tags: Mapping[str, str] | None = None,
    force: bool = False,
    params: Mapping[str, Mapping[str, Any]] | None = None,
    max_fit: int | None = None,
    workers: int | None = None,
    progress: Callable[[str], None] | None = None,
    *,
    model_logger: Callable[[Any, Any], Any],
) -> list[Registered]:
    """Fit, calibrate and register every kind for both splits (or re-use a registered version
    of the same kind, split, dataset version, code and card); tag them all with `batch` so they
    are evaluated together as challengers; record lineage rows. Each run lists the measurements
    behind its own fit and calibration pairs (read from `con`).

    Args:
        con: a writable warehouse connection (lineage rows).
        roles: the dataset version's roles.
        records: kernel records of every pair's kernels (`kernel_records`).
        kinds: classical kinds to train ("cost_model", "text_model"), and "ensemble" (the mean of
            the split's fitted kinds and the bin prior, composed after them).
        tracking_uri: MLflow URI.
        dataset_version: the version the roles come from.
        batch: the training batch (the orchestrating run id).
        name: the registered model of in-distribution versions.
        model_logger: (model, example) -> MLflow's ModelInfo: what each version is logged as
            (models.classical.registry.log_classical). The product passes
            pipelines.forecasting.pyfunc.log_classical_sources_model, the pyfunc model of kernel
            sources; it comes from the caller because the forecasting package stands above this one.
        tags: extra tags (dagster_run_id, git_commit).
        force: train even when an equal version exists.
        params: kind -> hyper-parameter overrides.
        max_fit: cap on fit pairs (None: all).
        workers: processes fitting side by side (`fit_many`).
        progress: called with a line per finished fit.
    Returns:
        One Registered per (kind, split) trained or re-used.
    """
    from models.classical import COMPOSED_KINDS
    from models.registry.hardware import HARDWARE_TAG
    from models.registry.versions import find_versions, set_version_tag

    kinds = list(kinds)
    fitted_kinds = [k for k in kinds if k not in COMPOSED_KINDS]
    splits = ["in_distribution"] + roles.held_out_splits()
    slots: list[Registered | None] = []  # plan order; None: fitted or composed below
    planned = []  # (slot, split, kind, registered model, its params, its registry key) to fit
    composed = []  # the same, for kinds composed from this split's fitted members
    for split in splits:
        target = model_name_for(split, name)
        for kind in kinds:
            kind_params = dict((params or {}).get(kind, {}))
            if kind in COMPOSED_KINDS:  # its version depends on its members' settings
                kind_params = {"members": {k: dict((params or {}).get(k, {})) for k in fitted_kinds}, **kind_params}
            digest = hashlib.sha256(json.dumps([kind_params, max_fit], sort_keys=True).encode()).hexdigest()[:12]
            key = {"kind": kind, "split": split, "dataset_version": dataset_version,
                   "code_version": f"{CODE_VERSION}-{digest}",
                   # the card it is fitted on (models.registry.hardware): one card's version is never another's
                   **({HARDWARE_TAG: roles.hardware_id} if roles.hardware_id else {})}
            found = [] if force else find_versions(tracking_uri, target, **key)
            if found:
                version, run_id = found[0]["version"], found[0]["run_id"]
                set_version_tag(tracking_uri, version, "training_batch", batch, target)
                slots.append(Registered(target, version, kind, split, run_id, reused=True))
                continue
            (composed if kind in COMPOSED_KINDS else planned).append((len(slots), split, kind, target, kind_params, key))
            slots.append(None)
    fits = fit_many([(kind, split, kind_params) for _, split, kind, _, kind_params, _ in planned], roles, records,
                    max_fit, workers=workers, progress=progress)
    members: dict[tuple[str, str], BinClassifier] = {}  # (split, kind) -> fitted model
    # Registered one at a time, in plan order: MLflow's store and DuckDB are written here.
    for (slot, split, kind, target, _, key), fitted in zip(planned, fits, strict=True):
        members[(split, kind)] = fitted.model
        slots[slot] = _register(con, fitted, roles, records, tracking_uri, target, dataset_version, batch, key,
                                max_fit, tags, model_logger)
    for slot, split, kind, target, _, key in composed:
        models = [members.get((split, k)) or _load_member(tracking_uri, slots, split, k) for k in fitted_kinds]
        fitted = compose(kind, [m for m in models if m is not None], roles, split, records, max_fit)
        if progress:
            progress(f"{kind} ({split}): the mean of {', '.join(fitted.model.member_kinds())}")
        slots[slot] = _register(con, fitted, roles, records, tracking_uri, target, dataset_version, batch, key,
                                max_fit, tags, model_logger)
    return [r for r in slots if r is not None]


def _register(con, fitted: Fitted, roles: Roles, records, tracking_uri: str, target: str, dataset_version: str,
              batch: str, key: Mapping[str, str], max_fit: int | None, tags,
              model_logger: Callable[[Any, Any], Any]) -> Registered:
    """Log and register one fitted (or composed) model, with the measurements behind its fit and
    calibration pairs, and record its lineage row."""
    from models.classical.registry import log_classical
    from warehouse.datasets import pair_measurement_ids
    from warehouse.lineage import record_model_lineage

    split, kind = fitted.split, fitted.kind
    fit, calibration, _ = roles.for_split(split)
    if max_fit is not None:  # the pairs fit_classical used
        fit = fit.sort("pair_id").head(max_fit)
    run_id, version = log_classical(
        fitted.model, tracking_uri, frame_of(fit.head(8), records), target, dataset_version, split,
        metrics=fitted.metrics, measurement_ids=pair_measurement_ids(con, dataset_version, fit),
        calibration_measurement_ids=pair_measurement_ids(con, dataset_version, calibration),
        training_pairs=fit.select("pair_id", "true_bin").to_pandas(),
        tags={**dict(tags or {}), **key, "training_batch": batch,
              **({"held_out_task": roles.held_out_task} if split == "held_out_task" else {}),
              **({"held_out_style": split.removeprefix(STYLE_SPLIT_PREFIX)} if is_style_split(split) else {})},
        model_logger=model_logger,
    )
    record_model_lineage(con, target, version, dataset_version, mlflow_run_id=run_id,
                         base_model=kind, git_commit=(tags or {}).get("git_commit"),
                         dagster_run_id=(tags or {}).get("dagster_run_id"))
    return Registered(target, version, kind, split, run_id, reused=False, metrics=fitted.metrics)


def _load_member(tracking_uri: str, slots: Sequence[Registered | None], split: str, kind: str) -> BinClassifier | None:
    """A member this run re-used from the registry instead of fitting it."""
    from models.classical.registry import load_classical

    for r in slots:
        if r is not None and r.split == split and r.kind == kind:
            return load_classical(tracking_uri, r.name, r.version)
    return None


def compose(kind: str, members: Sequence[BinClassifier], roles: Roles, split: str,
            records: Mapping[str, Mapping[str, Any]], max_fit: int | None = None) -> Fitted:
    """The `kind` (models.classical.COMPOSED_KINDS) of fitted members: its bin prior counted on
    the split's fit pairs (the ones the members were fitted on), its calibration Brier reported.

    Raises:
        ValueError: no member, or the split has no fit pairs.
    """
    from models.classical.ensemble import EnsembleModel

    if kind != "ensemble":
        raise ValueError(f"unknown composed kind {kind!r}")
    fit, calibration, _ = roles.for_split(split)
    fit, calibration = canonical_order(fit), canonical_order(calibration)
    if max_fit is not None:
        fit = fit.head(max_fit)
    if fit.is_empty():
        raise ValueError(f"no fit pairs for split {split!r}")
    model = EnsembleModel.from_members(members, fit["task"].to_list(), fit["true_bin"].to_list())
    metrics = {"fit_pairs": float(fit.height), "calibration_pairs": float(calibration.height), "fit_seconds": 0.0,
               "members": float(len(members))}
    if calibration.height:
        metrics.update(calibration_metrics(model.predict_proba(frame_of(calibration, records)),
                                           calibration["true_bin"].to_numpy(), "after"))
    return Fitted(model, kind, split, metrics)


@dataclass(frozen=True)
class ClassicalSurrogates:
    """The classical versions of a dataset version, and the sizes of the pairs behind them."""

    dataset_version: str
    registered: list[Registered]
    fit_pairs: int
    calibration_pairs: int


def classical_params(entries: Iterable[tuple[str, str, Any]]) -> dict[str, dict[str, Any]]:
    """(kind, parameter, value) settings as {kind: {parameter: value}}.

    >>> classical_params([("cost_model", "max_iter", 50), ("cost_model", "max_depth", 4)])
    {'cost_model': {'max_iter': 50, 'max_depth': 4}}
    """
    out: dict[str, dict[str, Any]] = {}
    for kind, name, value in entries:
        out.setdefault(kind, {})[name] = value
    return out


def train_classical_surrogates(warehouse_path: Any, tracking_uri: str, surrogate: Any, batch: str, name: str,
                               tags: Mapping[str, str], progress: Callable[[str], None] | None = None, *,
                               model_logger: Callable[[Any, Any], Any]) -> ClassicalSurrogates:
    """`train_and_register` on the newest dataset version of the warehouse, as the settings ask.

    Args:
        warehouse_path: the DuckDB file (written: `model_lineage`).
        tracking_uri: MLflow URI.
        surrogate: the surrogate settings (held_out_task, classical, classical_params,
            classical_max_fit, classical_workers).
        batch: the training batch (the orchestrating run id).
        name: the registered model of in-distribution versions.
        tags: extra tags (dagster_run_id, git_commit).
        progress: called with a line per finished fit.
        model_logger: what each version is logged as (`train_and_register`).
    Raises:
        NoDatasetVersion: nothing curated yet.
    """
    from pipelines.surrogates.export import latest_version, version_roles
    from warehouse.db import connect

    with connect(warehouse_path) as con:
        version = latest_version(con)
        roles = version_roles(con, version, surrogate.held_out_task)
        records = kernel_records(con, ids_of(roles.all_frames()))
        registered = train_and_register(con, roles, records, surrogate.classical, tracking_uri, version, batch, name,
                                        tags=tags,
                                        params=classical_params(surrogate.classical_params),
                                        max_fit=surrogate.classical_max_fit, workers=surrogate.classical_workers,
                                        progress=progress, model_logger=model_logger)
    if roles.hardware_id and registered:
        from models.registry.hardware import set_reference_hardware

        set_reference_hardware(tracking_uri, name, roles.hardware_id)
    return ClassicalSurrogates(version, registered, roles.fit.height, roles.calibration.height)
