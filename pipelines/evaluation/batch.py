"""Every forecaster of every report split evaluated at once: cached, de-duplicated, in parallel.

`evaluate_forecasts` with its bootstrap is the costly part of the calibration report (1,000
replicates overall and 200 per task, for each forecaster of each split). Three things make a
report cheaper without changing a number of it:

- a result is a pure function of the forecaster's rows, `n_boot`, `seed` and the evaluation
  code, so it is kept under a cache folder keyed by a digest of all four; a rerun with nothing
  new reads it back, and so does a forecaster whose rows are the same in two splits (the
  reference forecasters score the same eval pairs in the in-distribution and source-only splits);
- identical jobs of one call are evaluated once;
- the rest are spread over worker processes (`spawn`: the caller may hold threads, Dagster's
  in-process executor does, and a forked child of a threaded process can deadlock).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import polars as pl

from pipelines.evaluation.evaluate import evaluate_forecasts
from warehouse.bin_edges import P_COLS

log = logging.getLogger(__name__)

# The modules whose code decides a result: a change to any of them is a new cache key.
_CODE_MODULES = ("evaluate", "bootstrap", "calibration", "discovery", "scores", "selective", "utility")
_HERE = Path(__file__).resolve().parent


def code_digest() -> str:
    """sha256 of the evaluation code (and the bin table it scores against), short."""
    h = hashlib.sha256()
    for name in _CODE_MODULES:
        h.update((_HERE / f"{name}.py").read_bytes())
    h.update((_HERE.parent.parent / "models" / "bins.py").read_bytes())
    return h.hexdigest()[:16]


# The columns `evaluate_forecasts` reads (evaluate.py's module docstring): only they enter the
# digest, so a forecast written again (a new created_at, another latency) is the same result.
EVALUATED_COLUMNS = ("pair_id", "task", "true_speedup", "speedup", *P_COLS, "predicted_bin",
                     "repeat", "parse_ok", "candidate_kernel_id", "kernel_id", "candidate", "anchor_kernel_id",
                     "anchor", "hardware_id", "pair_type")


def rows_digest(frame: pl.DataFrame) -> str:
    """sha256 of the evaluated columns of a forecaster's rows, independent of row and column order."""
    cols = sorted(c for c in frame.columns if c in EVALUATED_COLUMNS)
    keys = [c for c in ("pair_id", "repeat") if c in cols]
    canonical = frame.select(cols).sort(keys or cols)
    # CSV text of the rows: floats are written in their shortest round-trip form, so equal
    # values give equal text whatever produced them.
    return hashlib.sha256(canonical.write_csv().encode()).hexdigest()


def job_key(frame: pl.DataFrame, n_boot: int, seed: int, code: str) -> str:
    return hashlib.sha256(json.dumps([rows_digest(frame), n_boot, seed, code]).encode()).hexdigest()[:32]


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _evaluate(frame: pl.DataFrame, n_boot: int, seed: int) -> dict[str, Any]:
    return evaluate_forecasts(frame, n_boot=n_boot, seed=seed)


def _read_cached(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # absent, or a torn write of a killed run: evaluate again
        return None


def _write_cached(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)  # atomic: a reader sees the whole file or none


def evaluate_splits(
    parts: Mapping[str, pl.DataFrame],
    *,
    n_boot: int,
    seed: int = 0,
    workers: int | None = None,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """`evaluate_forecasts` of each forecaster (model_ref) of each split.

    Args:
        parts: split -> forecasts of several forecasters (a model_ref column).
        n_boot: bootstrap replicates.
        seed: bootstrap seed.
        workers: processes evaluating side by side (default: the usable cores; 1: this process).
        cache_dir: where results are kept between calls (None: no cache).
        progress: called with one line per forecaster evaluated or read back.
    Returns:
        {split: {model_ref: result}}, splits in the given order, forecasters sorted.
    Raises:
        ValueError: one line, on bad forecasts (as `evaluate_forecasts`).
    """
    code = code_digest()
    jobs: dict[str, pl.DataFrame] = {}  # key -> rows
    slots: dict[tuple[str, str], str] = {}  # (split, model_ref) -> key
    for split, frame in parts.items():
        for ref in sorted(frame["model_ref"].unique().to_list()):
            rows = frame.filter(pl.col("model_ref") == ref).drop("model", "model_ref", strict=False)
            key = job_key(rows, n_boot, seed, code)
            slots[(split, ref)] = key
            jobs.setdefault(key, rows)
    names = {}
    for (split, ref), key in slots.items():
        names.setdefault(key, f"{ref} ({split})")
    done: dict[str, dict[str, Any]] = {}
    if cache_dir is not None:
        for key in jobs:
            if (hit := _read_cached(cache_dir / f"{key}.json")) is not None:
                done[key] = hit
                if progress:
                    progress(f"{names[key]}: unchanged, read back")
    todo = [k for k in jobs if k not in done]
    n = min(workers or default_workers(), len(todo))

    def finish(key: str, result: dict[str, Any]) -> None:
        done[key] = result
        if cache_dir is not None:
            _write_cached(cache_dir / f"{key}.json", result)
        if progress:
            progress(f"{names[key]}: evaluated [{len(done)}/{len(jobs)}]")

    if n <= 1:
        for key in todo:
            finish(key, _evaluate(jobs[key], n_boot, seed))
    else:
        import multiprocessing

        with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn")) as pool:
            # The largest first: the last job to start is a short one, so the workers end together.
            order = sorted(todo, key=lambda k: -jobs[k].height)
            futures = {pool.submit(_evaluate, jobs[k], n_boot, seed): k for k in order}
            for fut in as_completed(futures):
                finish(futures[fut], fut.result())
    out: dict[str, dict[str, dict[str, Any]]] = {}
    given: set[str] = set()
    for (split, ref), key in slots.items():
        # A result shared by two slots is copied, so a caller editing one leaves the other alone.
        out.setdefault(split, {})[ref] = copy.deepcopy(done[key]) if key in given else done[key]
        given.add(key)
    return out
