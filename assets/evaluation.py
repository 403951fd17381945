"""forecasts -> calibration_report, utility_report: every forecaster scored on the eval set."""


import dagster as dg

from orchestration.resources import MlflowResource, SettingsResource, WarehouseResource

GROUP = "evaluation"
ORACLE_IS_PERFECT = "oracle_scores_perfect"
REFERENCE_FORECASTERS_PRESENT = "reference_forecasters_present"


def _current_version(con) -> str | None:
    from warehouse.datasets import list_dataset_versions

    versions = list_dataset_versions(con)
    return None if versions.is_empty() else versions["dataset_version"][0]


@dg.asset(
    group_name=GROUP,
    kinds={"duckdb", "polars"},
    pool="duckdb_writer",
    deps=["eval_set", "rl_training_pool", "discovery_pairs", "surrogate_model"],
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
    from warehouse.datasets import read_pairs
    from warehouse.forecasts import write_forecasts

    with warehouse.connect() as con:
        version = _current_version(con)
        if version is None:
            raise dg.Failure("no dataset version yet: materialise curated_pairs first")
        evals = pl.concat([read_pairs(con, version, "eval"), read_pairs(con, version, "discovery")], how="diagonal_relaxed")
        train = read_pairs(con, version, "train")
        frame = reference_forecasts(evals, train)
        written = write_forecasts(con, frame.select([c for c in frame.columns if c not in ("task", "hardware_id", "anchor_kernel_id", "candidate_kernel_id", "pair_type", "true_speedup", "model")]))
    lm_rows = _language_model_forecasts(context, settings.get(), warehouse, read_pairs, version)
    surrogate_rows = _surrogate_forecasts(context, settings.get(), warehouse, mlflow, read_pairs, version)
    lm_rows = pl.concat([f for f in (lm_rows, surrogate_rows) if f is not None], how="diagonal_relaxed") \
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


def _surrogate_forecasts(context, cfg, warehouse, mlflow, read_pairs, version):
    """Logprob forecasts of each challenger version and the champion on the capped eval subset."""
    from models.registry import alias_version, version_info
    from models.surrogate import challengers, eval_subset, model_ref, registered_forecaster
    from pipelines.evaluation.lm_forecasts import forecast_by_hardware, pair_sources

    mlflow.client()
    champion = alias_version(mlflow.tracking_uri, "champion")
    versions = sorted(set(challengers(mlflow.tracking_uri)) | ({champion} if champion else set()))
    # Only LLM adapters forecast here; versions of other kinds (a cost model) bring their own forecasts.
    versions = [v for v in versions if (version_info(mlflow.tracking_uri, v) or {}).get("tags", {}).get("kind", "llm") == "llm"]
    if not versions:
        return None
    import polars as pl

    # The same subset for every version (and the champion), so promotion compares like with like.
    with warehouse.connect(read_only=True) as con:
        evals = eval_subset(read_pairs(con, version, "eval"), cfg.surrogate.eval_pairs)
        sources = pair_sources(con, evals)
    frames = []
    for v in versions:
        forecaster, info = registered_forecaster(mlflow.tracking_uri, v, cfg.home, cache_dir=cfg.home / "forecast-cache")
        context.log.info(f"{model_ref(v)}: reward {info['reward']}")
        frames += forecast_by_hardware(evals, sources, cfg.warehouse_path, forecaster, model_ref(v),
                                       style=info["prompt_style"], log=context.log.info)
        del forecaster
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

    from pipelines.evaluation.suite import (
        evaluate_models,
        headline_markdown,
        write_evaluation_report,
    )
    from warehouse.forecasts import read_forecasts

    cfg = settings.get()
    with warehouse.connect(read_only=True) as con:
        version = _current_version(con)
        frame = read_forecasts(con, dataset_version=version, with_pairs=True)
    frame = frame.rename({"speedup": "true_speedup"}) if "speedup" in frame.columns else frame
    results = evaluate_models(frame, n_boot=cfg.evaluation.n_boot, progress=lambda m: context.log.info(f"evaluating {m}"))
    out_dir = cfg.reports_dir / version
    html = write_evaluation_report(results, out_dir, title=f"kernelcast evaluation, dataset {version}")
    (out_dir / "metrics.json").write_text(json.dumps(results, indent=1, default=str))
    run_id = _log_evaluation(context, mlflow, results, version, frame, out_dir)
    oracle = results.get("baseline:oracle", {})
    table = headline_markdown(results)
    common = {"dataset_version": version, "mlflow_run_id": run_id, "mlflow_url": dg.MetadataValue.url(mlflow.run_url(run_id))}
    yield dg.MaterializeResult(asset_key="calibration_report", metadata={**common, "report": dg.MetadataValue.path(str(html)),
                                                                         "headline": dg.MetadataValue.md(table)})
    util = "| model | recovered_mean | recovered_at_10 | within_20 | random | discovery F1 |\n|---|---|---|---|---|---|\n" + "\n".join(
        f"| {m} | {r.get('recovered_mean')} | {r.get('recovered_at_10')} | {r.get('within_20')} | {r.get('recovered_random_mean')} | {(r.get('discovery') or {}).get('f1')} |"
        for m, r in results.items())
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
