"""The reference forecasters on an eval set, and their evaluation, in one place.

Used by the `forecasts` / `calibration_report` assets; the LLM surrogate's forecasts join the same
tables and the same report when it is registered.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from models import baselines
from pipelines.evaluation import scores, selective
from pipelines.evaluation.evaluate import evaluate_forecasts, prepare
from pipelines.evaluation.report import write_report

REFERENCE_FORECASTERS = ("baseline:uniform", "baseline:bin_prior", "baseline:oracle")


def reference_forecasts(eval_pairs: pl.DataFrame, training_pairs: pl.DataFrame) -> pl.DataFrame:
    """Forecasts of uniform, training-set bin prior and oracle on every eval pair (+ discovery pairs)."""
    frames = [
        baselines.uniform_forecasts(eval_pairs).with_columns(pl.lit("baseline:uniform").alias("model_ref")),
        baselines.bin_prior_forecasts(eval_pairs, training_pairs).with_columns(pl.lit("baseline:bin_prior").alias("model_ref")),
        baselines.oracle_forecasts(eval_pairs).with_columns(pl.lit("baseline:oracle").alias("model_ref")),
    ]
    return pl.concat(frames, how="diagonal_relaxed")


def evaluate_models(forecasts: pl.DataFrame, *, n_boot: int, seed: int = 0,
                    progress: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
    """`evaluate_forecasts` per model_ref (the evaluator takes one model at a time)."""
    out: dict[str, dict[str, Any]] = {}
    for model_ref in sorted(forecasts["model_ref"].unique().to_list()):
        if progress:
            progress(model_ref)
        part = forecasts.filter(pl.col("model_ref") == model_ref).drop("model", "model_ref", strict=False)
        out[model_ref] = evaluate_forecasts(part, n_boot=n_boot, seed=seed)
    return out


HEADLINE = ("n", "parse_rate", "brier", "crps", "nll", "accuracy", "off_by_one", "ece", "aurc",
            "selective_risk_at_50", "recovered_mean", "recovered_at_10", "within_20", "recovered_random_mean")


def headline_markdown(results: dict[str, dict[str, Any]]) -> str:
    """One row per model with the headline metrics (and 95% intervals where computed)."""
    cols = ("brier", "crps", "accuracy", "ece", "aurc", "recovered_mean", "recovered_random_mean", "parse_rate", "n")
    lines = ["| model | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for model, r in results.items():
        cells = []
        for c in cols:
            v = r.get(c)
            ci = (r.get("intervals") or {}).get(c)
            if isinstance(v, float):
                cells.append(f"{v:.4f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""))
            else:
                cells.append(str(v))
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_evaluation_report(results: dict[str, dict[str, Any]], out_dir: Path, title: str) -> Path:
    return write_report(results, out_dir, title=title)


# The report's fixed splits; held-out styles and the library join them when they have pairs
# (pipelines.surrogates.roles.ordered_splits: page order, the in-distribution page the index).
SPLITS = ("in_distribution", "source_only", "held_out_task", "external")


def split_folder(out_dir: Path, split: str) -> Path:
    return out_dir if split == "in_distribution" else out_dir / split.replace(":", "-")


def write_split_reports(results: Mapping[str, Mapping[str, Any]], out_dir: Path, version: str,
                        runs: Mapping[str, Any] | None = None,
                        empty: Mapping[str, str] | None = None,
                        made_by: tuple[str, str] | None = None) -> dict[str, Path]:
    """One page per split with results, each linking every other page; the empty splits named
    with their reason on every page.

    Args:
        results: split -> {model: `evaluate_forecasts` result}.
        out_dir: the version's report folder.
        version: the dataset version (titles).
        runs: model -> its run links (`forecaster_table.run_fields`).
        empty: split -> why it has no results.
        made_by: (Dagster run id, URL) of the run writing the report.
    Returns:
        split -> path of its index.html.
    """
    from pipelines.surrogates.roles import ordered_splits, split_title

    present = ordered_splits(s for s in results if results.get(s))
    pages = {s: split_folder(out_dir, s) / "index.html" for s in present}
    out = {}
    for split in present:
        here = pages[split].parent
        links = [(split_title(s), "" if s == split else os.path.relpath(pages[s], here)) for s in present]
        out[split] = write_report(results[split], here, title=f"kernelcast evaluation, dataset {version}, "
                                  f"{split_title(split)}", pages=links, runs=runs, empty=empty,
                                  made_by=made_by)
    return out


def selective_coverage(forecasts: pl.DataFrame, exclude: tuple[str, ...] = ("baseline:oracle",)) -> dict[str, Any]:
    """Per forecaster, the coverage at which its forecasts selected by max-prob confidence reach
    the best forecaster's Brier at full coverage (method.md section 3, selective prediction).

    Args:
        forecasts: one split's rows of several forecasters (model_ref, the `prepare` columns).
        exclude: forecasters that know the truth, never the target (the oracle).
    Returns:
        {"target_brier", "best", "coverage": {model_ref: coverage in [0, 1]}}; the best
        forecaster reaches its own Brier at its parse rate.
    """
    arrays = {}
    main = forecasts.filter(pl.col("pair_type").cast(pl.Utf8).fill_null("") != "parent") \
        if "pair_type" in forecasts.columns else forecasts
    for ref in sorted(main["model_ref"].unique().to_list()):
        a = prepare(main.filter(pl.col("model_ref") == ref).drop("model", "model_ref", strict=False))
        arrays[ref] = (a, scores.brier(a.p, a.y))
    full = {r: float(np.mean(b)) for r, (_, b) in arrays.items() if r not in exclude}
    if not full:
        return {"target_brier": None, "best": None, "coverage": {}}
    best = min(full, key=lambda r: (full[r], r))
    target = full[best]
    cov = {r: selective.coverage_at_brier(selective.confidence_scores(a.p)["max_prob"], b, a.parse_ok, target)
           for r, (a, b) in arrays.items()}
    return {"target_brier": target if math.isfinite(target) else None, "best": best, "coverage": cov}
