"""model_promotion: the promotion rule applied on every run, and its decision recorded.

The rule is `pipelines.promotion.rule` (read its docstring), applied by
`pipelines.promotion.apply.apply_promotion`: every registered version of
`kernelcast-surrogate` with forecasts on the current version's report splits (in_distribution,
source_only, external: pipelines.forecasting.registered.split_frames over the forecasts asset's
listing), whatever its kind, is scored with the uniform forecaster on the pairs all of them
forecast in each split (`pipelines.promotion.scores.score_splits`), and `decide_over_splits` moves
@champion and @champion-external, each with its challenger alias (@challenger,
@challenger-external: the best eligible version that is not the champion). Both decisions
(promoted, kept, held back) are written to DuckDB `promotion_decisions` / `promotion_scores`
(column `alias`; @champion's with the in-distribution scores and the reason naming the split that
vetoed, @champion-external's with the scores of the split it was decided on), to the registered
model's tags and the asset's metadata; @champion's also to MLflow tags of each version weighed. Holding a challenger back is a normal decision:
the gate checks report it as a warning and the run succeeds. A blocking check guards the data
itself: forecasts of a registered version that are not probability distributions stop the run
before any alias moves.
"""

import dagster as dg

from assets._metadata import markdown_table
from orchestration.resources import MlflowResource, SettingsResource, WarehouseResource

GROUP = "promotion"
CHALLENGER_PARSE_RATE_ABOVE_FLOOR = "challenger_parse_rate_above_floor"
CHALLENGER_BRIER_NOT_WORSE_THAN_UNIFORM = "challenger_brier_not_worse_than_uniform"
REGISTERED_FORECASTS_ARE_DISTRIBUTIONS = "registered_forecasts_are_distributions"


def _scores_table(scored, failures) -> str:
    """The in-distribution scores of the champion and every challenger, with the gates each failed."""
    rows = ([(scored.champion, "champion")] if scored.champion else []) + [(s, "challenger") for s in scored.challengers]
    return markdown_table(
        ["version", "kind", "role", "reward", "pairs", "parse rate", "Brier", "uniform Brier", "failed gates"],
        [(s.version, s.kind, role, s.reward, s.n_pairs, f"{s.parse_rate:.3f}", f"{s.brier:.4f}",
          f"{s.uniform_brier:.4f}", ", ".join(failures.get(s.version, [])) or ("-" if role == "champion" else "none"))
         for s, role in rows])


def _split_table(by_split, notes) -> str:
    """Per split: its common pairs, every version's Brier there, how the candidate compared."""
    return markdown_table(
        ["split", "common pairs", "versions (Brier)", "candidate there"],
        [(split, len(by_split.pairs.get(split, [])),
          ", ".join(f"{v}: {s.brier:.4f}" for v, s in sorted(scores.items())) or "none", notes.get(split, "-"))
         for split, scores in by_split.scores.items()])


def _none(value):
    return value if value is not None else "none"


def _gate_checks(p) -> list[dg.AssetCheckResult]:
    """The two gates over the challengers of a promotion (pipelines.promotion.apply.Promotion):
    warnings, and passing when there is no challenger to hold back."""
    from pipelines.promotion.rule import GATE_BRIER

    scored, failures, none = p.scored, p.splits.champion.failures, not p.scored.challengers
    return [
        dg.AssetCheckResult(check_name=CHALLENGER_PARSE_RATE_ABOVE_FLOOR, passed=bool(p.parse_ok) or none,
                            severity=dg.AssetCheckSeverity.WARN,
                            metadata={"threshold": p.policy.parse_rate_floor,
                                      "value": max((s.parse_rate for s in scored.challengers), default=None),
                                      "passing": ", ".join(map(str, p.parse_ok)) or "none"}),
        dg.AssetCheckResult(check_name=CHALLENGER_BRIER_NOT_WORSE_THAN_UNIFORM, passed=bool(p.eligible) or none,
                            severity=dg.AssetCheckSeverity.WARN,
                            metadata={"threshold": "uniform Brier on the same pairs",
                                      "value": min((s.brier for s in scored.challengers if s.n_pairs), default=None),
                                      "passing": ", ".join(map(str, p.eligible)) or "none",
                                      "offending": ", ".join(str(s.version) for s in scored.challengers
                                                             if GATE_BRIER in failures.get(s.version, [])) or "none"}),
    ]


@dg.asset_check(asset="forecasts", name=REGISTERED_FORECASTS_ARE_DISTRIBUTIONS, blocking=True, pool="duckdb_writer",
                description="Every registered version's eval forecasts are valid distributions over the 8 bins "
                            "(wrong data stops promotion; a weak model does not).")
def registered_forecasts_are_distributions(settings: SettingsResource, warehouse: WarehouseResource,
                                           mlflow: MlflowResource) -> dg.AssetCheckResult:
    from pipelines.promotion.apply import ForecastListingError, forecast_errors

    mlflow.client()
    try:
        errors = forecast_errors(warehouse.path)
    except ForecastListingError as exc:
        raise dg.Failure(str(exc)) from None
    return dg.AssetCheckResult(
        passed=not errors, severity=dg.AssetCheckSeverity.ERROR,
        metadata={"value": len(errors), "threshold": 0,
                  "offending": "; ".join(f"version {v}: {e}" for v, e in sorted(errors.items())) or "none"},
    )


@dg.asset(
    group_name=GROUP,
    kinds={"mlflow", "duckdb"},
    pool="duckdb_writer",
    deps=["calibration_report", "utility_report"],
    check_specs=[
        dg.AssetCheckSpec(CHALLENGER_PARSE_RATE_ABOVE_FLOOR, asset="model_promotion",
                          description="Some challenger's parse rate on the common eval pairs reaches the floor "
                                      "(a warning: otherwise every challenger is held back)."),
        dg.AssetCheckSpec(CHALLENGER_BRIER_NOT_WORSE_THAN_UNIFORM, asset="model_promotion",
                          description="Some challenger passing the parse floor has a Brier no worse than the uniform "
                                      "forecaster's on the same pairs (a warning: otherwise every challenger is held back)."),
    ],
)
def model_promotion(context: dg.AssetExecutionContext, settings: SettingsResource, warehouse: WarehouseResource,
                    mlflow: MlflowResource) -> dg.MaterializeResult:
    """The promotion decision of this run (DuckDB `promotion_decisions`, MLflow tags): @champion moves
    to the best challenger that passes the gates, beats the champion on the same eval pairs and is
    no worse on source_only and external; @champion-external to the best on the kernels people
    write: the library split where the run was given one, else the held-out styles, else external
    (source_only while external is empty). The decision is `pipelines.promotion.rule.decide_over_splits`."""
    from models.registry import SURROGATE_MODEL
    from pipelines.promotion.apply import ForecastListingError, apply_promotion
    from pipelines.promotion.rule import CHAMPION_EXTERNAL, PromotionPolicy
    from pipelines.promotion.summary import read_summary, write_promotion_script

    sur = settings.get().surrogate
    policy = PromotionPolicy(parse_rate_floor=sur.parse_rate_floor, min_brier_gain=sur.min_brier_gain)
    mlflow.client()
    try:
        p = apply_promotion(warehouse.path, mlflow.tracking_uri, policy, context.run.run_id,
                            settings.get().reports_dir)
    except ForecastListingError as exc:
        raise dg.Failure(str(exc)) from None
    splits, scored = p.splits, p.scored
    decision, ext = splits.champion, splits.champion_external
    context.log.info(f"promotion: {decision.outcome}: {decision.reason}")
    context.log.info(f"promotion ({CHAMPION_EXTERNAL}): {ext.outcome}: {ext.reason}")
    if p.dataset_version:  # the report was written before this decision: its pages read the new one
        write_promotion_script(settings.get().reports_dir / p.dataset_version, read_summary(warehouse.path))
    table = (_scores_table(scored, decision.failures) if scored.champion or scored.challengers
             else "(no registered version has eval forecasts)")
    return dg.MaterializeResult(
        metadata={"outcome": decision.outcome, "reason": decision.reason, "decision_id": p.decision_id,
                  "table": "promotion_decisions", "dataset_version": p.dataset_version or "none",
                  "registered_model": SURROGATE_MODEL, "common_eval_pairs": len(scored.pairs),
                  "promoted": _none(decision.promote), "champion_before": _none(p.champion_before),
                  "champion": _none(splits.champion_after), "versions": dg.MetadataValue.md(table),
                  "champion_external": _none(splits.champion_external_after),
                  "champion_external_outcome": ext.outcome, "champion_external_reason": ext.reason,
                  "champion_external_split": splits.external_split,
                  "champion_external_decision_id": p.external_decision_id,
                  "challenger": _none(splits.challenger), "challenger_external": _none(splits.challenger_external),
                  "splits": dg.MetadataValue.md(_split_table(p.by_split, splits.splits))},
        check_results=_gate_checks(p),
    )


defs = dg.Definitions(assets=[model_promotion], asset_checks=[registered_forecasts_are_distributions])
