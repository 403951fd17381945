"""forecasts -> calibration_report, utility_report: every forecaster scored on the eval set."""


import dagster as dg

from assets._metadata import markdown_table
from orchestration.resources import MlflowResource, SettingsResource, WarehouseResource

GROUP = "evaluation"
ORACLE_IS_PERFECT = "oracle_scores_perfect"
REFERENCE_FORECASTERS_PRESENT = "reference_forecasters_present"


@dg.asset(
    group_name=GROUP,
    kinds={"duckdb", "polars"},
    pool="duckdb_writer",
    deps=["eval_set", "rl_training_pool", "discovery_pairs", "surrogate_model", "classical_forecasters"],
    check_specs=[dg.AssetCheckSpec(REFERENCE_FORECASTERS_PRESENT, asset="forecasts", blocking=True,
                                   description="Uniform, bin prior and oracle forecast every eval pair.")],
)
def forecasts(context: dg.AssetExecutionContext, settings: SettingsResource, warehouse: WarehouseResource,
              mlflow: MlflowResource) -> dg.MaterializeResult:
    """Forecasts of every forecaster on the eval and discovery pairs of the current dataset
    version (DuckDB `forecasts`): the reference forecasters on every pair; the surrogate
    versions just trained (@challenger's batch) and @champion on a capped eval subset."""
    import polars as pl

    from pipelines.evaluation.suite import REFERENCE_FORECASTERS, reference_forecasts
    from warehouse.datasets import current_dataset_version, read_pairs
    from warehouse.forecasts import write_forecasts

    with warehouse.connect() as con:
        version = current_dataset_version(con)
        if version is None:
            raise dg.Failure("no dataset version yet: materialise curated_pairs first")
        evals = pl.concat([read_pairs(con, version, "eval"), read_pairs(con, version, "discovery")], how="diagonal_relaxed")
        train = read_pairs(con, version, "train")
        frame = reference_forecasts(evals, train)
        written = write_forecasts(con, frame.select([c for c in frame.columns if c not in ("task", "hardware_id", "anchor_kernel_id", "candidate_kernel_id", "pair_type", "true_speedup", "model")]))
    lm_rows = _language_model_forecasts(context, settings.get(), warehouse, read_pairs, version)
    surrogate_rows = _registered_forecasts(context, settings.get(), warehouse, mlflow, version)
    lm_rows = pl.concat([f for f in (lm_rows, surrogate_rows) if f is not None and f.height], how="diagonal_relaxed") \
        if (lm_rows is not None or surrogate_rows is not None) else None
    if lm_rows is not None:
        with warehouse.connect() as con:
            written += write_forecasts(con, lm_rows)
    n_eval = evals.height
    per_model = frame.group_by("model_ref").len()
    missing = [m for m in REFERENCE_FORECASTERS if per_model.filter(pl.col("model_ref") == m)["len"].sum() != n_eval]
    return dg.MaterializeResult(
        metadata={"table": "forecasts", "rows": frame.height + (lm_rows.height if lm_rows is not None else 0),
                  "rows_written": written, "dataset_version": version,
                  "models": ", ".join(sorted(per_model["model_ref"].to_list()) + (sorted(set(lm_rows["model_ref"])) if lm_rows is not None else []))},
        check_results=[dg.AssetCheckResult(check_name=REFERENCE_FORECASTERS_PRESENT, passed=not missing and n_eval > 0,
                                           severity=dg.AssetCheckSeverity.ERROR,
                                           metadata={"eval_pairs": n_eval, "missing": ", ".join(missing) or "none"})],
    )


def _language_model_forecasts(context, cfg, warehouse, read_pairs, version):
    """Forecasts of each configured language model on a deterministic sample of eval pairs."""
    if not cfg.evaluation.lm_models:
        return None
    import polars as pl

    from models.backends.transformers_backend import TransformersForecaster
    from models.base_model import resolve_base_model
    from models.cache import ForecastCache
    from pipelines.evaluation.lm_forecasts import forecast_by_hardware, pair_sources, sample_pairs

    with warehouse.connect(read_only=True) as con:
        evals = sample_pairs(read_pairs(con, version, "eval"), cfg.evaluation.lm_pairs_per_task)
        sources = pair_sources(con, evals)
    frames = []
    for spec in cfg.evaluation.lm_models:
        path = resolve_base_model(spec, cfg.home)
        forecaster = TransformersForecaster(str(path), readout="logprob", batch_size=1,
                                            cache=ForecastCache(cfg.home / "forecast-cache"))
        frames += forecast_by_hardware(evals, sources, cfg.warehouse_path, forecaster, f"base:{spec}",
                                       style=cfg.evaluation.lm_prompt_style, log=context.log.info)
    return pl.concat(frames, how="diagonal_relaxed") if frames else None


def _registered_forecasts(context, cfg, warehouse, mlflow, version):
    """Forecasts of every registered forecaster of the version (all kinds, both report splits),
    the committed H200 variants and the held-out reference forecasters; the list of them goes
    to <reports>/<version>/forecasters.json for the reports."""
    import dataclasses
    import json

    import polars as pl

    from pipelines.training.classical import ids_of, kernel_records
    from pipelines.training.export import row_builder, version_roles
    from pipelines.training.forecasting import held_out_reference_forecasts, registered_forecasts

    mlflow.client()
    with warehouse.connect(read_only=True) as con:
        roles = version_roles(con, version, cfg.surrogate.held_out_task)
        records = kernel_records(con, ids_of([roles.eval, roles.held_out_eval]))
        committed = cfg.data_dir / cfg.surrogate.committed_run
        rows, listed = registered_forecasts(mlflow.tracking_uri, version, roles, records, cfg.home,
                                            committed if committed.is_dir() else None, row_builder(con),
                                            cfg.surrogate.eval_pairs, progress=context.log.info)
    held_rows, held_listed = held_out_reference_forecasts(roles)
    out_dir = cfg.reports_dir / version
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "forecasters.json").write_text(json.dumps(
        {"held_out_task": roles.held_out_task, "held_out_pairs": roles.held_out_eval["pair_id"].to_list(),
         "forecasters": [dataclasses.asdict(f) for f in listed + held_listed]}, indent=1))
    frames = [f for f in (rows, held_rows) if f.height]
    return pl.concat(frames, how="diagonal_relaxed") if frames else None


@dg.multi_asset(
    specs=[
        dg.AssetSpec("calibration_report", group_name=GROUP, kinds={"mlflow", "html"}, deps=["forecasts"],
                     description="Brier, CRPS, NLL, ECE, selective risk per forecaster with 95% bootstrap intervals; HTML report + MLflow run."),
        dg.AssetSpec("utility_report", group_name=GROUP, kinds={"mlflow"}, deps=["forecasts"],
                     description="Speedup recovered under a measurement budget (1-50%) and discovery precision/recall per forecaster."),
    ],
    check_specs=[dg.AssetCheckSpec(ORACLE_IS_PERFECT, asset="calibration_report", blocking=True,
                                   description="The oracle scores Brier 0 and accuracy 1: the scoring pipeline is wired right.")],
    pool="duckdb_writer",
)
def evaluation_reports(context: dg.AssetExecutionContext, settings: SettingsResource,
                       warehouse: WarehouseResource, mlflow: MlflowResource):
    """Evaluate every forecaster of the current dataset version and log the report to MLflow."""
    import json

    from pipelines.evaluation.forecaster_table import TABLE_FILE, forecaster_rows
    from pipelines.evaluation.suite import (
        evaluate_models,
        headline_markdown,
        write_evaluation_report,
    )
    from pipelines.training.forecasting import split_frames
    from warehouse.datasets import current_dataset_version
    from warehouse.forecasts import read_forecasts

    cfg = settings.get()
    with warehouse.connect(read_only=True) as con:
        version = current_dataset_version(con)
        frame = read_forecasts(con, dataset_version=version, with_pairs=True)
    frame = frame.rename({"speedup": "true_speedup"}) if "speedup" in frame.columns else frame
    out_dir = cfg.reports_dir / version
    listing_path = out_dir / "forecasters.json"
    listing = json.loads(listing_path.read_text()) if listing_path.is_file() else {}
    parts = split_frames(frame, listing)
    kinds = {f["model_ref"]: f["kind"] for f in listing.get("forecasters", [])}
    sources = {f["model_ref"]: f["source"] for f in listing.get("forecasters", [])}
    table_rows = []
    for split, part in parts.items():
        res = evaluate_models(part, n_boot=cfg.evaluation.n_boot, progress=lambda m, s=split: context.log.info(f"evaluating {m} ({s})"))
        folder = out_dir if split == "in_distribution" else out_dir / split
        page = write_evaluation_report(res, folder, title=f"kernelcast evaluation, dataset {version}, {split.replace('_', ' ')}")
        (folder / "metrics.json").write_text(json.dumps(res, indent=1, default=str))
        table_rows += forecaster_rows(res, kinds, split, sources)
        if split == "in_distribution":
            results, html = res, page
    (out_dir / TABLE_FILE).write_text(json.dumps({"dataset_version": version, "held_out_task": listing.get("held_out_task"),
                                                  "forecasters": table_rows}, indent=1, default=str))
    run_id = _log_evaluation(context, mlflow, results, version, parts["in_distribution"], out_dir)
    oracle = results.get("baseline:oracle", {})
    table = headline_markdown(results)
    common = {"dataset_version": version, "mlflow_run_id": run_id, "mlflow_url": dg.MetadataValue.url(mlflow.run_url(run_id))}
    yield dg.MaterializeResult(asset_key="calibration_report", metadata={**common, "report": dg.MetadataValue.path(str(html)),
                                                                         "headline": dg.MetadataValue.md(table)})
    util = markdown_table(["model", "recovered_mean", "recovered_at_10", "within_20", "random", "discovery F1"],
                          [(m, r.get("recovered_mean"), r.get("recovered_at_10"), r.get("within_20"),
                            r.get("recovered_random_mean"), (r.get("discovery") or {}).get("f1")) for m, r in results.items()])
    yield dg.MaterializeResult(asset_key="utility_report", metadata={**common, "utility": dg.MetadataValue.md(util)})
    ok = oracle.get("brier") == 0.0 and oracle.get("accuracy") == 1.0
    yield dg.AssetCheckResult(asset_key="calibration_report", check_name=ORACLE_IS_PERFECT, passed=bool(ok),
                              severity=dg.AssetCheckSeverity.ERROR,
                              metadata={"oracle_brier": oracle.get("brier"), "oracle_accuracy": oracle.get("accuracy")})


def _log_evaluation(context, mlflow: MlflowResource, results: dict, version: str, frame, out_dir) -> str:
    """The evaluation run: each forecaster's scores logged against its model and the eval pairs."""
    import polars as pl

    from models.registry import model_id_of
    from models.tracking import log_evaluation
    from pipelines.promotion import registered_version

    mlflow.client()
    pairs = frame.filter(pl.col("split") == "eval").unique("pair_id").sort("pair_id")
    model_ids = {ref: mid for ref in results
                 if (v := registered_version(ref, "kernelcast-surrogate")) is not None
                 and (mid := model_id_of(mlflow.tracking_uri, v))}
    return log_evaluation(mlflow.tracking_uri, mlflow.experiment_id("kernelcast-evaluation"), results, version,
                          pairs["pair_id"].to_list(), pairs["true_bin"].to_list(), model_ids,
                          {"dagster_run_id": context.run.run_id, "dataset_version": version, "kind": "evaluation"},
                          report_dir=out_dir)


defs = dg.Definitions(assets=[forecasts, evaluation_reports])
