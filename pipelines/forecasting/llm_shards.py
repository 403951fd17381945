"""The language-model part of the forecasts, one shard per GPU: plan, split, forecast, merge.

A registered LLM version without committed forecasts, and a configured base language model, is
forecast here, one forward pass per pair: the expensive part of the forecasts. Its prompts are
built where the warehouse is (`plan_llm_job`, `plan_base_job`); every (model, pair) is dealt
into N shards of about equal prompt length (`split_jobs`); each shard is forecast by one
process on its own device (`forecast_shard`); the shards are merged (`merge_shards`), which
refuses a pair forecast twice or not at all. A shard travels as a JSON file (`write_shard`,
`read_shard`): forecasting it needs MLflow and the model, never the DuckDB file, so N shards
run at once beside the one writer.

    jobs = [plan_llm_job(uri, name, v, info, pairs, rows_for, downloads) for ...]
    shards = split_jobs(jobs, n_gpus)                       # shard i: its pairs of each job
    frame, passes = forecast_shard(uri, job, home, forecast_device(i), downloads_i)   # per GPU
    rows = merge_shards(expected_pairs(jobs), frames)       # every planned pair exactly once
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from models.bins import NUM_BINS
from models.calibration import Calibrator
from pipelines.forecasting.llm_backend import LlmBackend, TransformersBackend
from pipelines.sharding import balanced_shards
from warehouse.bin_edges import P_COLS


class ShardCoverageError(ValueError):
    """The merged shards do not hold every planned forecast exactly once."""


@dataclass(frozen=True)
class LlmJob:
    """One language model forecast here: what to load and the prompts it answers.

    A registered version (name and version; its calibrator applies) or a base model
    (base_model: 'smollm2' or a checkpoint, forecast as it is)."""

    model_ref: str  # what its rows are stored under
    style: str  # the prompt style its prompts are built in
    requests: tuple[dict[str, Any], ...]  # {"pair_id", "prompt": chat messages}, one per pair
    name: str | None = None  # registered model name
    version: int | None = None
    calibrator: dict[str, Any] = field(default_factory=dict)  # the version's (tag `calibrator`); {}: identity
    base_model: str | None = None

    def pair_ids(self) -> list[str]:
        return [r["pair_id"] for r in self.requests]


def version_calibrator(tags: dict[str, str]) -> Calibrator:
    """The calibrator a version's tags carry; the identity when there is none or it is unreadable."""
    try:
        return Calibrator.from_dict(json.loads(tags.get("calibrator") or "{}"))
    except (ValueError, TypeError):
        return Calibrator()


def plan_llm_job(tracking_uri: str, name: str, version: int, info: dict[str, Any], pairs: pl.DataFrame,
                 rows_for: Callable[[pl.DataFrame, str], list[dict[str, Any]]], downloads: Path,
                 model_ref: str) -> LlmJob:
    """The job of one registered LLM version on `pairs`: its prompts, in the style it was trained on."""
    from models.registry.lifecycle import registered_prompt_style

    style = registered_prompt_style(tracking_uri, version, downloads, name)
    requests = tuple({"pair_id": r["pair_id"], "prompt": r["prompt"]} for r in rows_for(pairs, style))
    return LlmJob(model_ref, style, requests, name=name, version=int(version),
                  calibrator=version_calibrator(info["tags"]).to_dict())


def plan_base_job(con: Any, spec: str, pairs: pl.DataFrame, style: str) -> LlmJob:
    """The job of a base language model ('smollm2' or a checkpoint) on `pairs`, stored as base:<spec>."""
    from pipelines.forecasting.lm_forecasts import pair_requests

    return LlmJob(f"base:{spec}", style, pair_requests(con, pairs, style), base_model=spec)


def prompt_length(prompt: Any) -> int:
    """Characters of a prompt (chat messages or text): what a forward pass's cost grows with."""
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(str(m.get("content", ""))) for m in prompt)


def split_jobs(jobs: Sequence[LlmJob], n_shards: int) -> list[list[LlmJob]]:
    """The jobs' pairs dealt into at most n_shards shards of about equal forward-pass work.

    Every (model, pair) is weighed by its prompt's length and dealt by
    `pipelines.sharding.balanced_shards` across all jobs at once, so the shards' totals differ
    by at most one prompt however many models there are. Shard i holds, per job with pairs in
    it, that job with those pairs; a shard with no work (fewer pairs than GPUs) is left out.
    """
    models = [job.model_ref for job in jobs]
    if len(set(models)) != len(models):
        raise ValueError(f"{next(m for m in models if models.count(m) > 1)} is listed twice among the language models")
    items = [(j, r) for j, job in enumerate(jobs) for r in range(len(job.requests))]
    keys = [f"{jobs[j].model_ref}|{jobs[j].requests[r]['pair_id']}" for j, r in items]
    weights = [prompt_length(jobs[j].requests[r]["prompt"]) for j, r in items]
    shards = []
    for idx in balanced_shards(keys, weights, n_shards):
        by_job: dict[int, list[int]] = {}
        for i in idx:
            by_job.setdefault(items[i][0], []).append(items[i][1])
        shard = [replace(jobs[j], requests=tuple(jobs[j].requests[r] for r in rows)) for j, rows in sorted(by_job.items())]
        if shard:
            shards.append(shard)
    return shards


def expected_pairs(jobs: Sequence[LlmJob]) -> dict[str, list[str]]:
    """model_ref -> the pair ids its rows must cover: what the merge checks against."""
    out: dict[str, list[str]] = {}
    for job in jobs:
        out.setdefault(job.model_ref, []).extend(job.pair_ids())
    return out


def write_shard(path: Path, jobs: Sequence[LlmJob]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(job) for job in jobs]))
    return path


def read_shard(path: Path) -> list[LlmJob]:
    return [LlmJob(**{**d, "requests": tuple(d["requests"])}) for d in json.loads(Path(path).read_text())]


def forecast_device(gpu: int | None) -> str:
    """The torch device of a forecasting process meant for GPU `gpu`, after CUDA_VISIBLE_DEVICES=gpu.

    A process that sees one GPU (pinned, or a pod holding one) uses it; one that still sees
    several started CUDA before the pin (steps sharing a process), so it names the GPU."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    count = torch.cuda.device_count()
    return "cuda:0" if gpu is None or count == 1 else f"cuda:{gpu % count}"


def forecast_shard(tracking_uri: str, job: LlmJob, home: Path, device: str,
                   downloads: Path, backend: LlmBackend = TransformersBackend()) -> tuple[pl.DataFrame, int]:
    """Logprob forecasts of one job's pairs on `device`: a registered version's calibrated, a
    base model's as they come.

    Args:
        tracking_uri: MLflow tracking URI.
        job: the model and the prompts of this shard.
        home: KERNELCAST_HOME (base models, the forecast cache).
        device: "cpu", "cuda:0", ...
        downloads: this process's own folder for the adapter download.
        backend: which backend answers (pipelines.forecasting.llm_backend; default in process).
    Returns:
        (rows for the warehouse `forecasts` table, forward passes made: answers not from the cache).
    Raises:
        FileNotFoundError: the registered version does not exist.
        ValueError: the version reads another prompt style than the one its prompts were built
            in, or the backend makes no forward pass (committed).
    """
    from models.backends import ForecastRequest
    from models.cache import ForecastCache

    requests = [ForecastRequest(r["prompt"], r["pair_id"]) for r in job.requests]
    cache = ForecastCache(home / "forecast-cache")
    if job.base_model is not None:
        answers = backend.base_forecaster(job.base_model, home, device, cache).forecast(requests)
        frame = pl.DataFrame([{"pair_id": pid, "model_ref": job.model_ref, **a.to_row()}
                              for pid, a in zip(job.pair_ids(), answers, strict=True)], infer_schema_length=None)
        return frame, sum(not a.cached for a in answers)
    forecaster, style = backend.registered_forecaster(tracking_uri, job.name, job.version, job.model_ref, home, device,
                                                      downloads, cache)
    if style != job.style:
        raise ValueError(f"{job.model_ref} reads {style!r} prompts, the shard holds {job.style!r}")
    answers = forecaster.forecast(requests)
    return _calibrated_rows(job, answers), sum(not a.cached for a in answers)


def forecast_shard_file(plan: Path, rows: Path, tracking_uri: str, home: Path, device: str, downloads: Path,
                        log: Callable[[str], None] | None = None, backend: LlmBackend = TransformersBackend()) -> int:
    """Every job of one shard plan (`write_shard`) forecast on `device` by `backend`, the rows
    written to `rows` (Parquet) for the merge; returns the forward passes made.

    Raises:
        ValueError: the plan cannot be read, a version does not exist or reads another prompt
            style (one line, naming the model).
    """
    try:
        jobs = read_shard(plan)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"cannot read its plan {plan.name}: {type(exc).__name__}: {exc}") from None
    frames, passes = [], 0
    for job in jobs:
        if log is not None:
            log(f"{job.model_ref} on {len(job.requests)} pairs ({backend.kind})")
        try:
            frame, made = forecast_shard(tracking_uri, job, home, device, downloads, backend)
        except (FileNotFoundError, ValueError) as exc:
            raise ValueError(f"{job.model_ref}: {exc}") from None
        frames.append(frame)
        passes += made
    pl.concat(frames, how="diagonal_relaxed").write_parquet(rows)
    return passes


def _calibrated_rows(job: LlmJob, answers: Sequence[Any]) -> pl.DataFrame:
    """A registered version's rows: its calibrator on each answer's bins (uniform where none)."""
    p = np.array([a.p if a.p else [1 / NUM_BINS] * NUM_BINS for a in answers]).reshape(-1, NUM_BINS)
    p = Calibrator.from_dict(job.calibrator).apply(p)
    bins = (np.argmax(p, axis=1) + 1).astype(np.int64)
    base = pl.DataFrame({"pair_id": job.pair_ids(), "model_ref": [job.model_ref] * len(answers),
                         "repeat": [0] * len(answers), "parse_ok": [bool(a.parse_ok) for a in answers],
                         "predicted_bin": bins, "argmax_bin": bins, "raw_sum": [a.raw_sum for a in answers],
                         "parse_error": [a.parse_error for a in answers]},
                        schema_overrides={"raw_sum": pl.Float64, "parse_error": pl.Utf8})
    return pl.concat([base, pl.DataFrame({c: p[:, i] for i, c in enumerate(P_COLS)})], how="horizontal")


def merge_shards(expected: dict[str, Sequence[str]], frames: Sequence[pl.DataFrame]) -> pl.DataFrame:
    """The shards' rows as one frame, once every planned (model_ref, pair) is there exactly once.

    Args:
        expected: model_ref -> the pair ids planned for it (`expected_pairs`).
        frames: each shard's rows (model_ref, pair_id, ...).
    Returns:
        The rows, sorted by (model_ref, pair_id).
    Raises:
        ShardCoverageError: a pair held twice, a planned pair missing, or a row nobody planned (one line).
    """
    frames = [f for f in frames if f.height]
    if not frames:
        merged = pl.DataFrame(schema={"model_ref": pl.Utf8, "pair_id": pl.Utf8})
    else:
        merged = pl.concat(frames, how="diagonal_relaxed")
    counts = merged.group_by("model_ref", "pair_id").len().sort("model_ref", "pair_id")
    twice = counts.filter(pl.col("len") > 1)
    if twice.height:
        ref, pair, n = twice.row(0)
        raise ShardCoverageError(f"forecast shards hold pair {pair} of {ref} {n} times ({twice.height} pairs repeated)")
    held = {(r, p) for r, p, _ in counts.iter_rows()}
    planned = {(ref, p) for ref, ids in expected.items() for p in ids}
    missing = sorted(planned - held)
    if missing:
        ref, pair = missing[0]
        raise ShardCoverageError(f"forecast shards miss {len(missing)} of {len(planned)} planned forecasts "
                                 f"(first: pair {pair} of {ref})")
    extra = sorted(held - planned)
    if extra:
        ref, pair = extra[0]
        raise ShardCoverageError(f"forecast shards hold {len(extra)} forecasts nobody planned (first: pair {pair} of {ref})")
    return merged.sort("model_ref", "pair_id")
