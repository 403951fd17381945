"""model_promotion: the promotion rule applied on every run, and its decision recorded.

The rule is `pipelines.promotion.rule` (read its docstring): every registered version of
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

from orchestration.resources import MlflowResource, SettingsResource, WarehouseResource

GROUP = "promotion"
MODEL_NAME = "kernelcast-surrogate"
CHALLENGER_PARSE_RATE_ABOVE_FLOOR = "challenger_parse_rate_above_floor"
CHALLENGER_BRIER_NOT_WORSE_THAN_UNIFORM = "challenger_brier_not_worse_than_uniform"
REGISTERED_FORECASTS_ARE_DISTRIBUTIONS = "registered_forecasts_are_distributions"
# Gates of the rule: failing one holds a challenger back, a decision shown as a warning.
PROMOTION_GATES = (CHALLENGER_PARSE_RATE_ABOVE_FLOOR, CHALLENGER_BRIER_NOT_WORSE_THAN_UNIFORM)
LEGACY_KIND = "llm"  # versions registered before the `kind` tag existed are LLM adapters


def _split_forecasts(settings: SettingsResource, warehouse: WarehouseResource):
    """(dataset version, {split: forecasts of it joined with their pairs}) of the current version.

    Raises:
        dg.Failure: the forecasts asset's listing of the version is missing or unreadable.
    """
    from pipelines.forecasting.registered import split_frames
    from warehouse.datasets import current_dataset_version
    from warehouse.errors import ValidationError
    from warehouse.forecasts import read_forecast_listing, read_forecasts

    with warehouse.connect(read_only=True) as con:
        version = current_dataset_version(con)
        frame = read_forecasts(con, dataset_version=version, with_pairs=True) if version else None
        if frame is None or frame.is_empty():
            return version, {}
        try:
            listing = read_forecast_listing(con, version)
        except ValidationError as exc:
            raise dg.Failure(str(exc)) from None
    try:
        return version, split_frames(frame, listing)
    except (ValueError, KeyError) as exc:
        raise dg.Failure(f"forecaster listing of dataset version {version} unusable: {str(exc).splitlines()[0]}") from None


def _version_tags(tracking_uri: str) -> dict[int, dict[str, str]]:
    from models.registry.versions import find_versions

    return {v["version"]: v["tags"] for v in find_versions(tracking_uri, MODEL_NAME)}


def _policy(settings: SettingsResource):
    from pipelines.promotion.rule import PromotionPolicy

    sur = settings.get().surrogate
    return PromotionPolicy(parse_rate_floor=sur.parse_rate_floor, min_brier_gain=sur.min_brier_gain)


def _table(scored, failures) -> str:
    lines = ["| version | kind | role | reward | pairs | parse rate | Brier | uniform Brier | failed gates |",
             "|---|---|---|---|---|---|---|---|---|"]
    rows = ([(scored.champion, "champion")] if scored.champion else []) + [(s, "challenger") for s in scored.challengers]
    for s, role in rows:
        gates = ", ".join(failures.get(s.version, [])) or ("-" if role == "champion" else "none")
        lines.append(f"| {s.version} | {s.kind} | {role} | {s.reward} | {s.n_pairs} | {s.parse_rate:.3f} | "
                     f"{s.brier:.4f} | {s.uniform_brier:.4f} | {gates} |")
    return "\n".join(lines)


def _split_table(by_split, notes) -> str:
    lines = ["| split | common pairs | versions (Brier) | candidate there |", "|---|---|---|---|"]
    for split, scores in by_split.scores.items():
        briers = ", ".join(f"{v}: {s.brier:.4f}" for v, s in sorted(scores.items())) or "none"
        lines.append(f"| {split} | {len(by_split.pairs.get(split, []))} | {briers} | {notes.get(split, '-')} |")
    return "\n".join(lines)


@dg.asset_check(asset="forecasts", name=REGISTERED_FORECASTS_ARE_DISTRIBUTIONS, blocking=True, pool="duckdb_writer",
                description="Every registered version's eval forecasts are valid distributions over the 8 bins "
                            "(wrong data stops promotion; a weak model does not).")
def registered_forecasts_are_distributions(settings: SettingsResource, warehouse: WarehouseResource,
                                           mlflow: MlflowResource) -> dg.AssetCheckResult:
    from pipelines.promotion.scores import score_splits

    mlflow.client()
    _, parts = _split_forecasts(settings, warehouse)
    errors = score_splits(parts, MODEL_NAME).errors
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
    no worse on source_only and external; @champion-external to the best on external (source_only
    while external is empty). The decision is `pipelines.promotion.rule.decide_over_splits`."""
    import dataclasses

    from models.registry.versions import alias_version, set_aliases, set_model_tags, set_version_tag
    from pipelines.promotion.rule import (
        CHAMPION,
        CHAMPION_EXTERNAL,
        GATE_BRIER,
        GATE_PARSE_RATE,
        decide_over_splits,
    )
    from pipelines.promotion.scores import ScoredVersions, score_splits
    from warehouse.promotions import record_promotion_decision

    policy = _policy(settings)
    mlflow.client()
    uri = mlflow.tracking_uri
    champion = alias_version(uri, CHAMPION, MODEL_NAME)
    champion_ext = alias_version(uri, CHAMPION_EXTERNAL, MODEL_NAME)
    tags = _version_tags(uri)
    version, parts = _split_forecasts(settings, warehouse)
    by_split = score_splits(parts, MODEL_NAME, kinds={v: t.get("kind", LEGACY_KIND) for v, t in tags.items()},
                            rewards={v: t.get("reward", "") for v, t in tags.items()})
    splits = decide_over_splits(by_split.scores, champion, champion_ext, policy)
    decision, ext = splits.champion, splits.champion_external
    set_aliases(uri, decision.promote, splits.challenger, MODEL_NAME, use=CHAMPION, clear_challenger=True)
    set_aliases(uri, ext.promote, splits.challenger_external, MODEL_NAME, use=CHAMPION_EXTERNAL, clear_challenger=True)
    after, ext_after = splits.champion_after, splits.champion_external_after
    context.log.info(f"promotion: {decision.outcome}: {decision.reason}")
    context.log.info(f"promotion ({CHAMPION_EXTERNAL}): {ext.outcome}: {ext.reason}")
    in_dist = by_split.scores.get("in_distribution", {})
    scored = ScoredVersions([s for v, s in sorted(in_dist.items()) if v != champion], in_dist.get(champion),
                            by_split.pairs.get("in_distribution", []))

    rows = ([{**dataclasses.asdict(scored.champion), "role": "champion", "failed_gates": []}] if scored.champion else [])
    rows += [{**dataclasses.asdict(s), "role": "challenger", "failed_gates": decision.failures.get(s.version, [])}
             for s in scored.challengers]
    ext_scores = by_split.scores.get(splits.external_split, {})
    ext_rows = [{**dataclasses.asdict(s), "model_version": v, "role": "champion" if v == champion_ext else "challenger",
                 "failed_gates": ext.failures.get(v, [])} for v, s in sorted(ext_scores.items())]
    with warehouse.connect() as con:
        decision_id = record_promotion_decision(
            con, MODEL_NAME, version, decision.outcome, decision.reason, len(scored.pairs),
            dataclasses.asdict(policy), [{**r, "model_version": r["version"]} for r in rows],
            champion_before=champion, champion_after=after, candidate=decision.candidate,
            dagster_run_id=context.run.run_id, challenger_after=splits.challenger)
        ext_decision_id = record_promotion_decision(
            con, MODEL_NAME, version, ext.outcome, ext.reason, len(by_split.pairs.get(splits.external_split, [])),
            dataclasses.asdict(policy), ext_rows, champion_before=champion_ext, champion_after=ext_after,
            candidate=ext.candidate, dagster_run_id=context.run.run_id, alias=CHAMPION_EXTERNAL,
            split=splits.external_split, challenger_after=splits.challenger_external)
    for s in scored.challengers:
        failed = decision.failures.get(s.version, [])
        status = ("promoted" if s.version == decision.promote else
                  f"held back: {', '.join(failed)}" if failed else "eligible, not promoted")
        for key, value in {"promotion_status": status, "promotion_decision_id": decision_id,
                           "promotion_dataset_version": version or ""}.items():
            set_version_tag(uri, s.version, key, value, MODEL_NAME)
    if scored.challengers or champion is not None or ext_after is not None:
        set_model_tags(uri, MODEL_NAME, {"last_promotion_outcome": decision.outcome,
                                         "last_promotion_reason": decision.reason[:500],
                                         "last_promotion_decision_id": decision_id,
                                         "last_champion_external_outcome": ext.outcome,
                                         "last_champion_external_reason": ext.reason[:500],
                                         "last_champion_external_decision_id": ext_decision_id})

    parse_ok = [s.version for s in scored.challengers if GATE_PARSE_RATE not in decision.failures.get(s.version, [])]
    eligible = [s.version for s in scored.challengers if not decision.failures.get(s.version)]
    none = not scored.challengers  # nothing to hold back
    table = dg.MetadataValue.md(_table(scored, decision.failures) if rows else "(no registered version has eval forecasts)")
    return dg.MaterializeResult(
        metadata={"outcome": decision.outcome, "reason": decision.reason, "decision_id": decision_id,
                  "table": "promotion_decisions", "dataset_version": version or "none",
                  "registered_model": MODEL_NAME, "common_eval_pairs": len(scored.pairs),
                  "promoted": decision.promote if decision.promote is not None else "none",
                  "champion_before": champion if champion is not None else "none",
                  "champion": after if after is not None else "none", "versions": table,
                  "champion_external": ext_after if ext_after is not None else "none",
                  "champion_external_outcome": ext.outcome, "champion_external_reason": ext.reason,
                  "champion_external_split": splits.external_split,
                  "champion_external_decision_id": ext_decision_id,
                  "challenger": splits.challenger if splits.challenger is not None else "none",
                  "challenger_external": (splits.challenger_external if splits.challenger_external is not None
                                          else "none"),
                  "splits": dg.MetadataValue.md(_split_table(by_split, splits.splits))},
        check_results=[
            dg.AssetCheckResult(check_name=CHALLENGER_PARSE_RATE_ABOVE_FLOOR, passed=bool(parse_ok) or none,
                                severity=dg.AssetCheckSeverity.WARN,
                                metadata={"threshold": policy.parse_rate_floor,
                                          "value": max((s.parse_rate for s in scored.challengers), default=None),
                                          "passing": ", ".join(map(str, parse_ok)) or "none"}),
            dg.AssetCheckResult(check_name=CHALLENGER_BRIER_NOT_WORSE_THAN_UNIFORM, passed=bool(eligible) or none,
                                severity=dg.AssetCheckSeverity.WARN,
                                metadata={"threshold": "uniform Brier on the same pairs",
                                          "value": min((s.brier for s in scored.challengers if s.n_pairs), default=None),
                                          "passing": ", ".join(map(str, eligible)) or "none",
                                          "offending": ", ".join(str(s.version) for s in scored.challengers
                                                                 if GATE_BRIER in decision.failures.get(s.version, []))
                                                       or "none"}),
        ],
    )


defs = dg.Definitions(assets=[model_promotion], asset_checks=[registered_forecasts_are_distributions])
