"""forecasts -> calibration_report, utility_report: every forecaster scored on the eval set.

`forecasts` is a graph, so the language models' forward passes fan out over the GPUs of a host
as measuring does (assets/profiling.py):

    plan_forecasts               reference, classical and committed forecasts (one step, set
        |  one output per GPU    aside); the pairs of each language model forecast here split
    forecast_llm_shard[gpu_i]    by prompt length into one shard per GPU (KERNELCAST_GPUS, default
        |  collect               every CUDA device; one on a CPU host), CUDA_VISIBLE_DEVICES=i
    store_forecasts              the shards merged (every planned pair exactly once), then all
                                 rows written to DuckDB `forecasts` at once

Only the first and last steps touch DuckDB (pool `duckdb_writer`); the shard steps read MLflow
and the model only, so N of them run side by side on the multiprocess executor.
"""


import time
from pathlib import Path

import dagster as dg

from assets._metadata import markdown_table
from assets.profiling import GPU_STEP_TAGS, pinned_gpu
from orchestration.resources import (
    LlmBackendResource,
    MlflowResource,
    ProfilerResource,
    SettingsResource,
    WarehouseResource,
)

GROUP = "evaluation"
ORACLE_IS_PERFECT = "oracle_scores_perfect"
REFERENCE_FORECASTERS_PRESENT = "reference_forecasters_present"


FORECAST_DEPS = ("eval_set", "rl_training_pool", "discovery_pairs", "surrogate_model", "classical_forecasters")
REFERENCE_CHECK = dg.AssetCheckSpec(REFERENCE_FORECASTERS_PRESENT, asset="forecasts", blocking=True,
                                    description="Uniform, bin prior and oracle forecast every eval pair.")
CHECK_OUTPUT = REFERENCE_CHECK.get_python_identifier()  # the graph output that carries the check


@dg.op(ins={name: dg.In(dg.Nothing) for name in FORECAST_DEPS},
       out={"plan": dg.Out(dict), "shards": dg.DynamicOut(dict)}, pool="duckdb_writer")
def plan_forecasts(context: dg.OpExecutionContext, settings: SettingsResource, warehouse: WarehouseResource,
                   mlflow: MlflowResource, llm_backend: LlmBackendResource):
    """The forecasts made in one step (reference, classical, committed), set aside for the store
    step; the pairs of the language models forecast here (base models, LLM versions without
    committed forecasts), one shard per GPU: none with the committed LLM backend."""
    from pipelines.forecasting.plan import plan_forecast_step
    from pipelines.profiling.hardware import forecast_gpus

    cfg = settings.get()
    mlflow.client()
    try:
        backend = llm_backend.backend()
        plan, shards = plan_forecast_step(warehouse.path, mlflow.tracking_uri, cfg, backend.forecasts_here,
                                          forecast_gpus(cfg.profiling),
                                          cfg.home / "forecast-shards" / context.run.run_id[:8],
                                          log=context.log.info, warn=context.log.warning)
    except ValueError as exc:
        raise dg.Failure(str(exc).splitlines()[0]) from None
    yield dg.Output(plan, "plan")
    for shard in shards:
        context.log.info(f"shard {shard['gpu']}: {shard['pairs']} forecasts of {shard['models']} language model(s) "
                         f"-> GPU {shard['gpu']}")
        yield dg.DynamicOutput(shard, mapping_key=f"gpu_{shard['gpu']}", output_name="shards")


@dg.op(tags=GPU_STEP_TAGS)
def forecast_llm_shard(context: dg.OpExecutionContext, settings: SettingsResource, mlflow: MlflowResource,
                       profiler: ProfilerResource, llm_backend: LlmBackendResource, shard: dict) -> dict:
    """The forward passes of one shard of pairs, every language model of it, pinned to its GPU,
    made by the configured LLM backend."""
    from pipelines.forecasting.llm_shards import forecast_device, forecast_shard_file

    cfg = settings.get()
    mlflow.client()
    i = shard["gpu"]
    gpu = i if profiler.pin_gpu_per_step else None
    rows = Path(shard["shard"]).with_name(f"rows-gpu{i}.parquet")
    t0 = time.perf_counter()
    with pinned_gpu(gpu):
        device = forecast_device(gpu)
        try:
            passes = forecast_shard_file(Path(shard["shard"]), rows, mlflow.tracking_uri, cfg.home, device,
                                         cfg.home / "surrogates" / f"gpu{i}",
                                         log=lambda line: context.log.info(f"GPU {i} ({device}): {line}"),
                                         backend=llm_backend.backend())
        except ValueError as exc:
            raise dg.Failure(f"forecasting shard {i}: {exc}") from None
    return {**shard, "rows": str(rows), "forward_passes": passes, "device": device,
            "seconds": round(time.perf_counter() - t0, 1), "cuda_visible_devices": "" if gpu is None else str(gpu)}


@dg.op(out={"result": dg.Out(dg.Nothing), CHECK_OUTPUT: dg.Out(dg.Nothing)}, pool="duckdb_writer")
def store_forecasts(context: dg.OpExecutionContext, warehouse: WarehouseResource, plan: dict, shards: list[dict]):
    """The shards merged, every planned pair exactly once, then all rows written to DuckDB `forecasts`
    in one transaction."""
    import polars as pl

    from pipelines.forecasting.llm_shards import ShardCoverageError, merge_shards
    from warehouse.errors import ValidationError
    from warehouse.forecasts import write_forecast_listing, write_forecasts

    try:
        llm = merge_shards(plan["expected"], [pl.read_parquet(s["rows"]) for s in shards])
    except ShardCoverageError as exc:
        raise dg.Failure(str(exc)) from None
    except (OSError, pl.exceptions.ComputeError) as exc:
        raise dg.Failure(f"a forecasting shard's rows cannot be read: {str(exc).splitlines()[0]}") from None
    frames = [pl.read_parquet(p) for p in plan["single_step"]] + ([llm] if llm.height else [])
    with warehouse.connect() as con:
        try:  # every frame checked before any row is written, all in one transaction
            listing = (plan["dataset_version"], plan["listing"])
            written = write_forecasts(con, *frames, listing=listing) if frames else 0
            if not frames:
                write_forecast_listing(con, *listing)
        except ValidationError as exc:
            raise dg.Failure(f"forecasts not stored, none of them: {exc}") from None
    others = sorted({m for f in frames[1:] for m in f["model_ref"].unique().to_list()})
    table = markdown_table(["GPU", "CUDA_VISIBLE_DEVICES", "device", "pairs", "forward passes", "seconds"],
                           [(s["gpu"], s["cuda_visible_devices"] or "-", s["device"], s["pairs"], s["forward_passes"],
                             s["seconds"]) for s in sorted(shards, key=lambda s: s["gpu"])])
    yield dg.Output(None, "result", metadata={
        "table": "forecasts", "rows": sum(f.height for f in frames), "rows_written": written,
        "dataset_version": plan["dataset_version"], "models": ", ".join(plan["reference_models"] + others),
        "forecasting_steps": len(shards), "llm_rows": llm.height,
        "shards": dg.MetadataValue.md(table if shards else "(no LLM version forecast here)")})
    missing = plan["missing_reference"]
    yield dg.AssetCheckResult(check_name=REFERENCE_FORECASTERS_PRESENT, asset_key="forecasts",
                              passed=not missing and plan["eval_pairs"] > 0, severity=dg.AssetCheckSeverity.ERROR,
                              metadata={"eval_pairs": plan["eval_pairs"], "missing": ", ".join(missing) or "none"})


@dg.graph_asset(
    group_name=GROUP,
    kinds={"duckdb", "polars"},
    ins={name: dg.AssetIn(dagster_type=dg.Nothing) for name in FORECAST_DEPS},
    check_specs=[REFERENCE_CHECK],
    description="Forecasts of every forecaster on the eval and discovery pairs of the current dataset version "
                "(DuckDB `forecasts`): the reference forecasters on every pair; the surrogate versions just "
                "trained (@challenger's batch) and @champion on a capped eval subset, the LLM versions' forward "
                "passes one step per GPU.",
)
def forecasts(eval_set, rl_training_pool, discovery_pairs, surrogate_model, classical_forecasters):
    # The dependencies only order the plan after them (Nothing inputs).
    plan, shards = plan_forecasts(eval_set=eval_set, rl_training_pool=rl_training_pool, discovery_pairs=discovery_pairs,
                                  surrogate_model=surrogate_model, classical_forecasters=classical_forecasters)
    result, check = store_forecasts(plan, shards.map(forecast_llm_shard).collect())
    return {"result": result, CHECK_OUTPUT: check}


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
    from orchestration.links import PORTS_SCRIPT, dagster_run_url, live_ports
    from pipelines.evaluation.suite import headline_markdown
    from pipelines.evaluation.version_report import (
        EvaluationError,
        evaluate_version,
        read_version_forecasts,
    )
    from pipelines.promotion.summary import read_summary

    cfg = settings.get()
    mlflow.client()
    try:
        forecasts = read_version_forecasts(warehouse.path, cfg.reports_dir)
        made_by = (context.run.run_id, dagster_run_url(context.run.run_id, live_ports(cfg.home)["dagster"]))
        ev = evaluate_version(forecasts, mlflow.tracking_uri, mlflow.experiment_id("kernelcast-evaluation"),
                              cfg.evaluation, cfg.reports_dir, cfg.home / "cache" / "evaluation", made_by,
                              mlflow.run_links, mlflow.run_url, progress=context.log.info,
                              promotion=read_summary(warehouse.path).to_json(), ports_script=PORTS_SCRIPT)
    except EvaluationError as exc:
        raise dg.Failure(str(exc)) from None
    main, oracle = ev.main, ev.main.get("baseline:oracle", {})
    common = {"dataset_version": ev.version, "mlflow_run_id": ev.run_id,
              "mlflow_url": dg.MetadataValue.url(mlflow.run_url(ev.run_id)), "splits": ", ".join(ev.results),
              "empty_splits": "; ".join(f"{s}: {w}" for s, w in ev.empty.items()) or "none"}
    # Under $KERNELCAST_HOME: the metadata stays true when the home is moved (`kernelcast report`
    # prints the full path).
    report = ev.pages["in_distribution"].resolve().relative_to(cfg.home.resolve())
    yield dg.MaterializeResult(asset_key="calibration_report", metadata={
        **common, "report": dg.MetadataValue.path(f"$KERNELCAST_HOME/{report}"),
        "headline": dg.MetadataValue.md(headline_markdown(main))})
    util = markdown_table(["model", "recovered_mean", "recovered_at_10", "within_20", "random", "discovery F1"],
                          [(m, r.get("recovered_mean"), r.get("recovered_at_10"), r.get("within_20"),
                            r.get("recovered_random_mean"), (r.get("discovery") or {}).get("f1")) for m, r in main.items()])
    yield dg.MaterializeResult(asset_key="utility_report", metadata={**common, "utility": dg.MetadataValue.md(util)})
    ok = oracle.get("brier") == 0.0 and oracle.get("accuracy") == 1.0
    yield dg.AssetCheckResult(asset_key="calibration_report", check_name=ORACLE_IS_PERFECT, passed=bool(ok),
                              severity=dg.AssetCheckSeverity.ERROR,
                              metadata={"oracle_brier": oracle.get("brier"), "oracle_accuracy": oracle.get("accuracy")})


defs = dg.Definitions(assets=[forecasts, evaluation_reports])
