"""The reference forecasters on an eval set, and their evaluation, in one place.

Used by the `forecasts` / `calibration_report` assets; the LLM surrogate's forecasts join the same
tables and the same report when it is registered.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from models import baselines
from pipelines.evaluation.evaluate import evaluate_forecasts
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
