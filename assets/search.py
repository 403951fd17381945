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
    from pipelines.search.report import markdown_table
    from pipelines.search.simulation_run import run_search_simulation

    cfg = settings.get()
    sc = cfg.search
    sim = run_search_simulation(
        warehouse.path, cfg.mlflow_uri, mlflow.experiment_id("kernelcast-search"), cfg.home,
        cfg.reports_dir / "search" / sc.hardware_id, sc, context.run.run_id,
        progress=lambda done, n: context.log.info(f"search simulation: {done}/{n} runs"))
    report, short = sim.report, sim.short_runs
    summary, cov = report["summary"], report["coverage"]
    return dg.MaterializeResult(
        metadata={
            "report": dg.MetadataValue.path(str(sim.report_path)),
            "curves": dg.MetadataValue.path(str(sim.curves_path)),
            "forecaster": sc.forecaster, "seeds": sc.seeds, "budget": sc.budget, "runs": len(report["runs"]),
            "filtered_beats_standard": f"{summary['filtered_beats_standard']}/{summary['n_tasks']}",
            "filtered_beats_random": f"{summary['filtered_beats_random']}/{summary['n_tasks']}",
            "coverage": cov["coverage"], "measured_coverage": cov["measured_coverage"],
            "table": dg.MetadataValue.md(markdown_table(report)),
            "mlflow_run_id": sim.mlflow_run_id, "mlflow_url": dg.MetadataValue.url(mlflow.run_url(sim.mlflow_run_id)),
        },
        check_results=[dg.AssetCheckResult(
            check_name=EVERY_MODE_SPENDS_THE_BUDGET, passed=not short, severity=dg.AssetCheckSeverity.WARN,
            metadata={"runs": len(report["runs"]), "short_runs": len(short),
                      "offending": ", ".join(f"{r['task']}-{r['mode']}-s{r['seed']}" for r in short[:5]) or "none"},
        )],
    )

defs = dg.Definitions(assets=[search_simulation])
