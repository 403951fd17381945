"""The cross-hardware settings: forecasters fitted on each card other than the reference, how
far the reference card's forecasters carry to it, and the card's champion alias.

    card_forecasters        the classical kinds fitted on every pair of each target card, versions
        |                   of models:/kernelcast-surrogate tagged hardware=<card> (training)
    cross_hardware_report   zero shot, calibrated on n of the card's pairs, fitted on n of them,
        |                   the curve over n and the bin agreement of kernels measured on both cards:
        |                   <reports>/<version>/cross_hardware/ and an MLflow run (evaluation)
    card_champions          @champion-<card> for each card (promotion)

With one card in the dataset version the three have nothing to do and say so. The reference
card's assets (classical_forecasters, forecasts, the report's splits, model_promotion) never see
another card's pairs: pipelines.curation.hardware.
"""

import dagster as dg

from assets._metadata import markdown_table
from models.registry import SURROGATE_MODEL
from orchestration.resources import MlflowResource, SettingsResource, WarehouseResource


@dg.asset(
    group_name="training",
    kinds={"scikit-learn", "mlflow"},
    pool="duckdb_writer",
    deps=["rl_training_pool", "eval_set", "classical_forecasters"],
)
def card_forecasters(context: dg.AssetExecutionContext, settings: SettingsResource, warehouse: WarehouseResource,
                     mlflow: MlflowResource) -> dg.MaterializeResult:
    """Classical forecasters fitted on the pairs of each hardware other than the reference card
    (the cross-hardware pool, every fifth pair calibrating), registered as versions of
    models:/kernelcast-surrogate tagged `hardware` with their card."""
    from assets.training import _dataset_failures, _run_tags
    from pipelines.forecasting.pyfunc import log_classical_sources_model
    from pipelines.surrogates.cards import train_card_forecasters

    cfg = settings.get()
    mlflow.client()
    with _dataset_failures():
        out = train_card_forecasters(warehouse.path, mlflow.tracking_uri, cfg.surrogate, cfg.curation,
                                     context.run.run_id, _run_tags(context), progress=context.log.info,
                                     model_logger=log_classical_sources_model)
    table = markdown_table(["card", "eval pairs", "fit pairs", "calibration pairs"],
                           [(card, *sizes) for card, sizes in sorted(out.pairs.items())])
    versions = markdown_table(["version", "kind", "card", "trained", "calibration Brier"],
                              [(r.version, r.kind, card, "re-used" if r.reused else "trained",
                                r.metrics.get("calibration_brier_after", "")) for card, r in out.registered])
    return dg.MaterializeResult(metadata={
        "dataset_version": out.dataset_version, "reference_hardware": out.reference_hardware or "none",
        "cards": dg.MetadataValue.md(table if out.pairs else "(no card but the reference card)"),
        "versions": dg.MetadataValue.md(versions if out.registered else "(none)")})


@dg.asset(
    group_name="evaluation",
    kinds={"mlflow", "html"},
    deps=["card_forecasters"],
    pool="duckdb_writer",
)
def cross_hardware_report(context: dg.AssetExecutionContext, settings: SettingsResource, warehouse: WarehouseResource,
                          mlflow: MlflowResource) -> dg.MaterializeResult:
    """The cross-hardware page of the report (<reports>/<version>/cross_hardware/): the reference
    card's forecasters on each other card zero shot and recalibrated on n of its pairs, forecasters
    fitted on n of its pairs, Brier against n (a curve), and the bin agreement of the kernels
    measured on both cards; its figures logged to an MLflow run."""
    from orchestration.links import dagster_run_url, live_ports
    from pipelines.evaluation.card_study import study_cards
    from pipelines.evaluation.cross_hardware import headline, write_cross_hardware_report
    from pipelines.surrogates.export import latest_version
    from warehouse.db import connect

    cfg = settings.get()
    mlflow.client()
    with connect(warehouse.path, read_only=True) as con:
        version = latest_version(con)
    studies = study_cards(warehouse.path, mlflow.tracking_uri, cfg.home, cfg.surrogate, cfg.curation,
                          cfg.evaluation.cross_hardware_pairs, cfg.evaluation.n_boot, progress=context.log.info)
    made_by = (context.run.run_id, dagster_run_url(context.run.run_id, live_ports(cfg.home)["dagster"]))
    page = write_cross_hardware_report(studies, cfg.reports_dir / version, version, made_by)
    heads = [headline(s) for s in studies]
    run_id = _log_run(mlflow, version, studies, page.parent, context.run.run_id) if studies else None
    rows = [(h["hardware_id"], _fmt(h["zero_shot"]), _fmt(h["calibrated"]), h["calibrated_gap"], _fmt(h["fitted"]),
             h["same_bin"]) for h in heads]
    return dg.MaterializeResult(metadata={
        "dataset_version": version, "report": dg.MetadataValue.path(str(page)), "cards": len(studies),
        "headline": dg.MetadataValue.md(markdown_table(
            ["card", "zero shot (best)", "calibrated <= 300 pairs (best)", "gap to in distribution", "fitted on all",
             "same bin on both cards"], rows) if rows else "(no card but the reference card)"),
        **({"mlflow_run_id": run_id, "mlflow_url": dg.MetadataValue.url(mlflow.run_url(run_id))} if run_id else {})})


def _fmt(best) -> str:
    if not best:
        return "-"
    kind, brier, *n = best
    return f"{kind} {brier:.4f}" + (f" ({n[0]} pairs)" if n else "")


def _log_run(mlflow: MlflowResource, version: str, studies, folder, dagster_run_id: str) -> str:
    """An MLflow run of the evaluation experiment: each card's Brier per setting and forecaster,
    and the page's folder as artifacts."""
    from models.registry.tracking import log_cross_hardware

    return log_cross_hardware(mlflow.tracking_uri, mlflow.experiment_id("kernelcast-evaluation"), version, studies,
                              folder, {"dagster_run_id": dagster_run_id})


@dg.asset(
    group_name="promotion",
    kinds={"mlflow"},
    deps=["cross_hardware_report"],
    pool="duckdb_writer",  # it reads the current dataset version: DuckDB locks the file for readers too
)
def card_champions(context: dg.AssetExecutionContext, settings: SettingsResource, warehouse: WarehouseResource,
                   mlflow: MlflowResource) -> dg.MaterializeResult:
    """@champion-<card> of models:/kernelcast-surrogate for each card other than the reference:
    the version fitted on the card with the lowest Brier on its eval pairs, when it beats uniform
    (pipelines.promotion.hardware)."""
    import json

    from pipelines.evaluation.cross_hardware import FOLDER, SUMMARY_FILE
    from pipelines.promotion.hardware import promote_card_champions
    from pipelines.surrogates.export import latest_version
    from warehouse.db import connect

    cfg = settings.get()
    mlflow.client()
    with connect(warehouse.path, read_only=True) as con:
        version = latest_version(con)
    summary = cfg.reports_dir / version / FOLDER / SUMMARY_FILE
    if not summary.is_file():
        raise dg.Failure(f"no cross-hardware report of dataset version {version}: materialise cross_hardware_report")
    studies = json.loads(summary.read_text())["cards"]
    decisions = promote_card_champions(mlflow.tracking_uri, studies, SURROGATE_MODEL)
    for d in decisions:
        context.log.info(f"@{d.alias}: {d.outcome} ({d.reason})")
    return dg.MaterializeResult(metadata={
        "dataset_version": version,
        "decisions": dg.MetadataValue.md(markdown_table(
            ["card", "alias", "before", "after", "outcome", "reason"],
            [(d.hardware_id, d.alias, d.before or "none", d.after or "none", d.outcome, d.reason) for d in decisions])
            if decisions else "(no card but the reference card)")})


defs = dg.Definitions(assets=[card_forecasters, cross_hardware_report, card_champions])
