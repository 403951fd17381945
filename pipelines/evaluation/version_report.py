"""The evaluation of one dataset version: every forecaster's stored forecasts scored on each report
split, the pages written, the forecaster table beside them and the MLflow evaluation run.

Reads the `forecasts` of the version (and the fetched external kernels' rows beside the report,
pipelines.forecasting.plan) with the forecasts asset's listing; writes under
<reports_dir>/<version>/: one page and `metrics.json` per split and `forecasters.table.json`
(the table `kernelcast report` prints). The table names the pages by their path under the home
(<reports_dir>'s parent), so a moved or copied home reports its own pages (`page_path`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl


class EvaluationError(ValueError):
    """The version cannot be evaluated (no forecasts, an unusable listing): one line."""


@dataclass(frozen=True)
class VersionEvaluation:
    """version; results: split -> model_ref -> scores; pages: split -> HTML page; empty: split ->
    why it has no forecasts; run_id: the MLflow evaluation run."""

    version: str
    results: dict[str, dict[str, Any]]
    pages: dict[str, Path]
    empty: dict[str, str]
    run_id: str

    @property
    def main(self) -> dict[str, Any]:
        return self.results["in_distribution"]


@dataclass(frozen=True)
class VersionForecasts:
    """The stored forecasts of a dataset version split by report split, and their listing."""

    version: str
    parts: dict[str, pl.DataFrame]
    listing: dict[str, Any]


def read_version_forecasts(warehouse_path: str | Path, reports_dir: Path) -> VersionForecasts:
    """The current dataset version's forecasts (with the fetched external kernels' rows beside its
    report) split by report split.

    Raises:
        EvaluationError: no dataset version, no listing or no in-distribution forecasts of it.
    """
    from pipelines.forecasting.plan import LIBRARY_DIR_ROWS
    from pipelines.forecasting.registered import split_frames
    from warehouse.datasets import current_dataset_version
    from warehouse.db import connect
    from warehouse.errors import ValidationError
    from warehouse.forecasts import read_forecast_listing, read_forecasts

    with connect(warehouse_path, read_only=True) as con:
        version = current_dataset_version(con)
        if version is None:
            raise EvaluationError("no dataset version yet: materialise curated_pairs first")
        frame = read_forecasts(con, dataset_version=version, with_pairs=True)
        try:
            listing = read_forecast_listing(con, version)
        except ValidationError as exc:
            raise EvaluationError(str(exc)) from None
    rows = reports_dir / version / LIBRARY_DIR_ROWS
    if rows.is_file():
        frame = pl.concat([frame, pl.read_parquet(rows)], how="diagonal_relaxed")
    frame = frame.rename({"speedup": "true_speedup"}) if "speedup" in frame.columns else frame
    try:
        parts = split_frames(frame, listing)
    except (ValueError, KeyError) as exc:
        raise EvaluationError(f"forecaster listing of dataset version {version} unusable: "
                              f"{str(exc).splitlines()[0]}") from None
    if "in_distribution" not in parts:
        raise EvaluationError(f"no in-distribution forecasts of dataset version {version}: materialise `forecasts`")
    return VersionForecasts(version, parts, listing)


def home_relative(page: Path, home: Path) -> str:
    """How the table stores a page: its path under the home (a page elsewhere: absolute).

    >>> home_relative(Path("/h/reports/ds-1/index.html"), Path("/h"))
    'reports/ds-1/index.html'
    """
    page, home = Path(page).resolve(), Path(home).resolve()
    return str(page.relative_to(home)) if page.is_relative_to(home) else str(page)


def page_path(home: Path, stored: str) -> Path:
    """A page the table names, under `home`: the table stores paths relative to the home (older
    tables: absolute paths, returned as they are).

    >>> str(page_path(Path("/new/home"), "reports/ds-1/index.html"))
    '/new/home/reports/ds-1/index.html'
    """
    path = Path(stored)
    return path if path.is_absolute() else Path(home) / path


def evaluate_version(forecasts: VersionForecasts, tracking_uri: str, experiment_id: str, evaluation: Any,
                     reports_dir: Path, cache_dir: Path, made_by: tuple[str, str],
                     run_links: Callable[[str], Mapping[str, Any]], run_url: Callable[[str], str],
                     progress: Callable[[str], None] = print, promotion: Mapping[str, Any] | None = None,
                     ports_script: str | None = None) -> VersionEvaluation:
    """Score, write and log the evaluation of a dataset version's forecasts.

    Args:
        forecasts: read_version_forecasts' answer.
        tracking_uri, experiment_id: where the evaluation run is logged.
        evaluation: the settings (n_boot, workers).
        reports_dir: the reports' root; cache_dir: the bootstrap cache.
        made_by: (Dagster run id, its URL), written on the pages and in the table.
        run_links: an MLflow run id -> its links (run_id, mlflow_url, dagster_run_id, dagster_url).
        run_url: an MLflow run id -> its URL in the MLflow UI.
        promotion: the promotion decisions known now (pipelines.promotion.summary), marked on
            the pages until model_promotion writes the newer ones beside them.
        ports_script: the file in `reports_dir` naming the UIs' ports while they serve.
    Raises:
        EvaluationError: forecasts the scoring refuses.
    """
    from pipelines.evaluation.batch import evaluate_splits
    from pipelines.evaluation.forecaster_table import TABLE_FILE, forecaster_rows
    from pipelines.evaluation.suite import selective_coverage, split_folder, write_split_reports
    from pipelines.surrogates.roles import SPLITS

    version, parts, listing = forecasts.version, forecasts.parts, forecasts.listing
    out_dir = reports_dir / version
    kinds = {f["model_ref"]: f["kind"] for f in listing["forecasters"]}
    sources = {f["model_ref"]: f["source"] for f in listing["forecasters"]}
    runs = {f["model_ref"]: run_links(f["run_id"]) for f in listing["forecasters"] if f.get("run_id")}
    empty = {s: why for s, why in listing.get("empty", {}).items() if s not in parts}
    empty.update({s: "no forecaster has forecasts on its pairs" for s in SPLITS if s not in parts and s not in empty})
    try:
        results = evaluate_splits(parts, n_boot=evaluation.n_boot, workers=evaluation.workers, cache_dir=cache_dir,
                                  progress=progress)
    except ValueError as exc:
        raise EvaluationError(f"forecasts of dataset version {version} not evaluated: "
                              f"{str(exc).splitlines()[0]}") from None
    coverage = selective_coverage(parts["external"]) if "external" in parts else None
    pages = write_split_reports(results, out_dir, version, runs, empty, made_by, kinds, promotion, ports_script)
    table_rows = []
    for split, res in results.items():  # every split's numbers, a page or not (source only may have none)
        folder = split_folder(out_dir, split)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.json").write_text(json.dumps(res, indent=1, default=str))
        table_rows += forecaster_rows(res, kinds, split, sources, runs,
                                      coverage["coverage"] if coverage and split == "external" else None)
    run_id = log_version_evaluation(tracking_uri, experiment_id, results, version, parts["in_distribution"], out_dir,
                                    made_by[0])
    home = reports_dir.parent
    (out_dir / TABLE_FILE).write_text(json.dumps({
        "dataset_version": version, "held_out_task": listing.get("held_out_task"),
        "report": home_relative(pages["in_distribution"], home),
        "pages": {s: home_relative(p, home) for s, p in pages.items()},
        "evaluation_run_id": run_id, "evaluation_run_url": run_url(run_id), "empty_splits": empty,
        "same_as": {s: "in_distribution" for s in ("source_only",) if s in results and s not in pages},
        "evaluation_dagster_run_id": made_by[0], "evaluation_dagster_run_url": made_by[1],
        "selective_external": {k: v for k, v in (coverage or {}).items() if k != "coverage"} or None,
        "forecasters": table_rows}, indent=1, default=str))
    return VersionEvaluation(version, results, pages, empty, run_id)


def log_version_evaluation(tracking_uri: str, experiment_id: str, results: Mapping[str, Mapping[str, Any]],
                           version: str, frame: pl.DataFrame, out_dir: Path, dagster_run_id: str) -> str:
    """The evaluation run: every split's scores of each forecaster under its own name, the
    registered versions it scored as the run's model inputs, the eval pairs; returns the run id.

    Args:
        results: split -> forecaster (model ref) -> its scores.
        frame: the in-distribution forecasts (the eval pairs are logged as the run's dataset).
    """
    from models.registry import HELD_OUT_MODEL, SURROGATE_MODEL
    from models.registry.tracking import log_evaluation
    from models.registry.versions import model_id_of, registered_version

    pairs = frame.filter(pl.col("split") == "eval").unique("pair_id").sort("pair_id")
    model_ids = {}
    for ref in sorted({r.split("|")[0] for split in results.values() for r in split}):
        for name in (SURROGATE_MODEL, HELD_OUT_MODEL):
            v = registered_version(ref, name)
            if v is not None and (mid := model_id_of(tracking_uri, v, name)):
                model_ids[ref] = mid
    return log_evaluation(tracking_uri, experiment_id, results, version, pairs["pair_id"].to_list(),
                          pairs["true_bin"].to_list(), model_ids,
                          {"dagster_run_id": dagster_run_id, "dataset_version": version, "kind": "evaluation"},
                          report_dir=out_dir)
