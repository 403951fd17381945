"""search_simulation: the budgeted search simulated on the measured space, every mode and seed."""


import dagster as dg

from orchestration.resources import MlflowResource, SettingsResource, WarehouseResource

GROUP = "search"
EVERY_MODE_SPENDS_THE_BUDGET = "every_mode_spends_the_budget"


@dg.asset(
    group_name=GROUP,
    kinds={"duckdb", "mlflow"},
    deps=["curated_pairs", "forecasts"],
    check_specs=[dg.AssetCheckSpec(EVERY_MODE_SPENDS_THE_BUDGET, asset="search_simulation",
                                   description="Every run of the simulation spent its whole measurement budget.")],
)
def search_simulation(context: dg.AssetExecutionContext, settings: SettingsResource, warehouse: WarehouseResource,
                      mlflow: MlflowResource) -> dg.MaterializeResult:
    """PUCT search on the measured space of one hardware (standard, surrogate-filtered,
    random-filtered, selective; several seeds per task): best true speedup vs GPU measurements,
    candidates considered and coverage; JSON + PNG under $KERNELCAST_HOME/reports/search/, MLflow run."""
    import json

    import mlflow as mlf

    from pipelines.search.forecasters import ForecasterContext
    from pipelines.search.registered import register_search_forecasters
    from pipelines.search.report import curves_figure, markdown_table, search_report
    from pipelines.search.simulate import SimulationPlan
    from pipelines.search.table import load_table_warehouse
    from pipelines.tasks import task_names

    register_search_forecasters()
    cfg = settings.get()
    sc = cfg.search
    with warehouse.connect(read_only=True) as con:
        table = load_table_warehouse(con, sc.hardware_id)
    tasks = sc.tasks or tuple(t for t in task_names() if t in table.tasks())
    plan = SimulationPlan(tasks=tuple(tasks), seeds=sc.seeds, budget=sc.budget, anchor=sc.anchor,
                          hardware_id=sc.hardware_id)
    report = search_report(plan, table, sc.forecaster, ForecasterContext(tracking_uri=cfg.mlflow_uri, home=cfg.home),
                           progress=lambda done, n: context.log.info(f"search simulation: {done}/{n} runs"))
    out_dir = cfg.reports_dir / "search" / sc.hardware_id
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "search.json").write_text(json.dumps(report, indent=1, default=str))
    png = out_dir / "curves.png"
    png.write_bytes(curves_figure(report))

    mlflow.client()
    with mlf.start_run(experiment_id=mlflow.experiment_id("kernelcast-search"),
                       run_name=f"search-{sc.hardware_id}-{sc.forecaster}") as run:
        mlf.set_tags({"dagster_run_id": context.run.run_id, "kind": "search_simulation",
                      "forecaster": sc.forecaster, "hardware_id": sc.hardware_id})
        mlf.log_params({"seeds": sc.seeds, "budget": sc.budget, "anchor": sc.anchor, "tasks": ",".join(tasks)})
        for task, modes in report["tasks"].items():
            for mode, r in modes.items():
                for key in ("final_best_mean", "candidates_considered", "forecasts", "improved_share"):
                    if r.get(key) is not None:
                        mlf.log_metric(f"{task}.{mode}.{key}", float(r[key]))
        for key in ("filtered_beats_standard", "filtered_beats_random", "n_tasks"):
            mlf.log_metric(key, float(report["summary"][key]))
        mlf.log_metric("coverage", float(report["coverage"]["coverage"]))
        mlf.log_artifacts(str(out_dir), artifact_path="search")

    short = [r for r in report["runs"] if r["measurements"] != r["budget"]]
    summary, cov = report["summary"], report["coverage"]
    return dg.MaterializeResult(
        metadata={
            "report": dg.MetadataValue.path(str(out_dir / "search.json")),
            "curves": dg.MetadataValue.path(str(png)),
            "forecaster": sc.forecaster, "seeds": sc.seeds, "budget": sc.budget, "runs": len(report["runs"]),
            "filtered_beats_standard": f"{summary['filtered_beats_standard']}/{summary['n_tasks']}",
            "filtered_beats_random": f"{summary['filtered_beats_random']}/{summary['n_tasks']}",
            "coverage": cov["coverage"], "measured_coverage": cov["measured_coverage"],
            "table": dg.MetadataValue.md(markdown_table(report)),
            "mlflow_run_id": run.info.run_id, "mlflow_url": dg.MetadataValue.url(mlflow.run_url(run.info.run_id)),
        },
        check_results=[dg.AssetCheckResult(
            check_name=EVERY_MODE_SPENDS_THE_BUDGET, passed=not short, severity=dg.AssetCheckSeverity.WARN,
            metadata={"runs": len(report["runs"]), "short_runs": len(short),
                      "offending": ", ".join(f"{r['task']}-{r['mode']}-s{r['seed']}" for r in short[:5]) or "none"},
        )],
    )


defs = dg.Definitions(assets=[search_simulation])
