"""The evaluation of every forecaster on an eval set, in one place (the reference forecasters'
rows: pipelines.forecasting.references.reference_forecasts).

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

from pipelines.evaluation import scores, selective
from pipelines.evaluation.evaluate import evaluate_forecasts, prepare
from pipelines.evaluation.report import lowest_brier, write_report


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


def split_folder(out_dir: Path, split: str) -> Path:
    return out_dir if split == "in_distribution" else out_dir / split.replace(":", "-")


SAME_KEYS = ("n", "brier", "nll", "ece", "accuracy", "recovered_mean")  # what "the same numbers" compares


def same_scores(a: Mapping[str, Mapping[str, Any]], b: Mapping[str, Mapping[str, Any]], suffix: str) -> bool:
    """Whether two splits' results give every forecaster the same numbers (`suffix`: the
    "|<split>" the second split's names may carry).

    >>> same_scores({"m": {"n": 4, "brier": 0.2}}, {"m|source_only": {"n": 4, "brier": 0.2}}, "|source_only")
    True
    >>> same_scores({"m": {"n": 4, "brier": 0.2}}, {"m": {"n": 4, "brier": 0.3}}, "|source_only")
    False
    """
    left = {k: v for k, v in a.items()}
    right = {k.removesuffix(suffix): v for k, v in b.items()}
    if not left or set(left) != set(right):
        return False
    for name, r in left.items():
        for key in SAME_KEYS:
            x, y = r.get(key), right[name].get(key)
            if isinstance(x, float) and isinstance(y, float):
                if not (x == y or (math.isnan(x) and math.isnan(y)) or abs(x - y) <= 1e-12):
                    return False
            elif x != y:
                return False
    return True


SOURCE_ONLY_SAME = ("source only (generator metadata withheld): the same numbers as in distribution for every "
                    "forecaster (none of them changed a forecast without the generator's labels), so it has no "
                    "page of its own")
SPLIT_NOTES = {
    "in_distribution": "@champion is decided on this split; @champion-external on the kernels people write "
                       "(the library split, else the held-out styles, else external).",
    "held_out_task": "Versions here were fitted without this task (model kernelcast-surrogate-held-out); they are "
                     "scored, never promoted: how a forecaster does on a task it never saw.",
    "external": "Kernels the template generator did not write, never learned from: the closest split to a "
                "user's own files.",
}


def write_split_reports(results: Mapping[str, Mapping[str, Any]], out_dir: Path, version: str,
                        runs: Mapping[str, Any] | None = None,
                        empty: Mapping[str, str] | None = None,
                        made_by: tuple[str, str] | None = None,
                        kinds: Mapping[str, str] | None = None,
                        promotion: Mapping[str, Any] | None = None,
                        ports_script: str | None = None) -> dict[str, Path]:
    """One page per split with results, each linking every other page; the empty splits named
    with their reason on every page. A source-only split that scores every forecaster as in
    distribution gets no page: the in-distribution page says so.

    Args:
        results: split -> {model: `evaluate_forecasts` result}.
        out_dir: the version's report folder, <reports>/<version> (the pages read its
            promotion.js when it exists).
        version: the dataset version (titles).
        runs: model -> its run links (`forecaster_table.run_fields`).
        empty: split -> why it has no results.
        made_by: (Dagster run id, URL) of the run writing the report.
        kinds: model -> its kind.
        promotion: the promotion decisions known now (`PromotionSummary.to_json()`).
        ports_script: the name of the file in <reports> naming the UIs' ports while they
            serve (orchestration.links.PORTS_SCRIPT); None: the links stay as written.
    Returns:
        split -> path of its index.html.
    """
    from pipelines.evaluation.decisions import PROMOTION_SCRIPT
    from pipelines.surrogates.roles import ordered_splits, split_title

    merged = ("source_only" in results and "in_distribution" in results
              and same_scores(results["in_distribution"], results["source_only"], "|source_only"))
    present = ordered_splits(s for s in results if results.get(s) and not (merged and s == "source_only"))
    pages = {s: split_folder(out_dir, s) / "index.html" for s in present}
    found = {s: lowest_brier(results[s]) for s in present}
    out = {}
    for split in present:
        here = pages[split].parent
        bests = [(split_title(s), "" if s == split else os.path.relpath(pages[s], here), *found[s])
                 for s in present if found[s]]
        links = [(split_title(s), "" if s == split else os.path.relpath(pages[s], here)) for s in present]
        notes = ([SPLIT_NOTES[split]] if split in SPLIT_NOTES else []) + \
            ([SOURCE_ONLY_SAME[0].upper() + SOURCE_ONLY_SAME[1:] + "."] if merged and split == "in_distribution" else [])
        shown = "$KERNELCAST_HOME/" + os.path.relpath(pages[split], out_dir.parent.parent)
        out[split] = write_report(results[split], here, title=f"kernelcast evaluation, dataset {version}, "
                                  f"{split_title(split)}", pages=links, runs=runs, empty=empty,
                                  made_by=made_by, kinds=kinds, promotion=promotion, split_notes=notes,
                                  shown_path=shown,
                                  ports_script=os.path.relpath(out_dir.parent / ports_script, here)
                                  if ports_script else None,
                                  promotion_script=os.path.relpath(out_dir / PROMOTION_SCRIPT, here), bests=bests)
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
