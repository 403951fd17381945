"""model_promotion: the promotion gates (blocking checks) and the challenger -> champion alias move.

The rule is `models.promotion` (read its docstring). The gates run as blocking checks on
`calibration_report`, so a run where no challenger passes never materialises
`model_promotion`; `model_promotion` re-reads the same scores and applies the same rule, so
materialising it alone cannot promote a version that fails a gate either.
"""

import dagster as dg

from orchestration.resources import MlflowResource, SettingsResource, WarehouseResource

GROUP = "promotion"
CHALLENGER_PARSE_RATE_ABOVE_FLOOR = "challenger_parse_rate_above_floor"
CHALLENGER_BRIER_NOT_WORSE_THAN_UNIFORM = "challenger_brier_not_worse_than_uniform"
# Failing these holds the challenger back; it is a decision, not a broken pipeline (the
# runner reports it as such and the run still succeeds).
PROMOTION_GATES = (CHALLENGER_PARSE_RATE_ABOVE_FLOOR, CHALLENGER_BRIER_NOT_WORSE_THAN_UNIFORM)
UNIFORM = "baseline:uniform"


def _scores(mlflow: MlflowResource, warehouse: WarehouseResource):
    """(challenger scores, champion version, dataset version), each challenger scored on its
    evaluated eval pairs against the uniform forecaster and the champion on the same pairs."""
    import polars as pl

    from assets.evaluation import _current_version
    from models.promotion import ChallengerScores
    from models.registry import alias_version, version_info
    from models.surrogate import challengers, model_ref
    from pipelines.evaluation.evaluate import prepare
    from pipelines.evaluation.scores import score_means
    from warehouse.forecasts import read_forecasts

    mlflow.client()
    versions = challengers(mlflow.tracking_uri)
    champion = alias_version(mlflow.tracking_uri, "champion")
    with warehouse.connect(read_only=True) as con:
        version = _current_version(con)
        frame = read_forecasts(con, dataset_version=version, with_pairs=True) if version else pl.DataFrame()
    if frame.is_empty():
        return [ChallengerScores(v, 0, 0.0, float("nan"), float("nan")) for v in versions], champion, version
    frame = frame.filter(pl.col("split") == "eval")

    def score(ref: str, pair_ids: set[str]) -> tuple[int, float, float]:
        part = frame.filter((pl.col("model_ref") == ref) & pl.col("pair_id").is_in(sorted(pair_ids)))
        if part.is_empty():
            return 0, 0.0, float("nan")
        a = prepare(part.drop("model_ref"))
        means = score_means(a.p, a.y, a.predicted_bin, a.parse_ok)
        return len(a), means["parse_rate"], means["full"]["brier"]

    def pairs_of(ref: str) -> set[str]:
        return set(frame.filter(pl.col("model_ref") == ref)["pair_id"].to_list())

    out = []
    for v in versions:
        mine = pairs_of(model_ref(v))
        n, rate, brier = score(model_ref(v), mine)
        _, _, uniform = score(UNIFORM, mine)
        common_brier = champion_brier = None
        if champion is not None and champion != v:
            common = mine & pairs_of(model_ref(champion))
            if common:
                common_brier, champion_brier = score(model_ref(v), common)[2], score(model_ref(champion), common)[2]
        reward = ((version_info(mlflow.tracking_uri, v) or {}).get("tags") or {}).get("reward", "")
        out.append(ChallengerScores(v, n, rate, brier, uniform, common_brier, champion_brier, reward))
    return out, champion, version


def _table(scores, failures) -> str:
    lines = ["| version | reward | pairs | parse rate | Brier | uniform Brier | Brier vs champion (same pairs) | failed gates |",
             "|---|---|---|---|---|---|---|---|"]
    for s in scores:
        vs = f"{s.common_brier:.4f} vs {s.champion_brier:.4f}" if s.champion_brier is not None else "-"
        lines.append(f"| {s.version} | {s.reward} | {s.n_pairs} | {s.parse_rate:.3f} | {s.brier:.4f} | {s.uniform_brier:.4f} | "
                     f"{vs} | {', '.join(failures.get(s.version, [])) or 'none'} |")
    return "\n".join(lines)


def _policy(settings: SettingsResource):
    from models.promotion import PromotionPolicy

    sur = settings.get().surrogate
    return PromotionPolicy(parse_rate_floor=sur.parse_rate_floor, min_brier_gain=sur.min_brier_gain)


@dg.multi_asset_check(
    specs=[
        dg.AssetCheckSpec(CHALLENGER_PARSE_RATE_ABOVE_FLOOR, asset="calibration_report", blocking=True,
                          description="Some challenger's parse rate on its evaluated eval pairs reaches the floor."),
        dg.AssetCheckSpec(CHALLENGER_BRIER_NOT_WORSE_THAN_UNIFORM, asset="calibration_report", blocking=True,
                          description="Some challenger passing the parse floor has a Brier no worse than the uniform forecaster's on the same pairs."),
    ],
)
def promotion_gates(settings: SettingsResource, warehouse: WarehouseResource, mlflow: MlflowResource):
    """The gates of the promotion rule (models.promotion), per challenger, in the metadata."""
    from models.promotion import GATE_BRIER, GATE_PARSE_RATE, gate_failures

    policy = _policy(settings)
    scores, champion, version = _scores(mlflow, warehouse)
    failures = {s.version: gate_failures(s, policy) for s in scores}
    table = dg.MetadataValue.md(_table(scores, failures) if scores else "(no challengers registered)")
    common = {"dataset_version": version or "none", "champion": champion if champion is not None else "none", "challengers": table}
    parse_ok = [s.version for s in scores if GATE_PARSE_RATE not in failures[s.version]]
    eligible = [s.version for s in scores if not failures[s.version]]
    # No challengers (no variants configured): nothing to hold back.
    yield dg.AssetCheckResult(asset_key="calibration_report", check_name=CHALLENGER_PARSE_RATE_ABOVE_FLOOR,
                              passed=bool(parse_ok) or not scores, severity=dg.AssetCheckSeverity.ERROR,
                              metadata={**common, "threshold": policy.parse_rate_floor,
                                        "value": max((s.parse_rate for s in scores), default=None),
                                        "passing": ", ".join(map(str, parse_ok)) or "none"})
    yield dg.AssetCheckResult(asset_key="calibration_report", check_name=CHALLENGER_BRIER_NOT_WORSE_THAN_UNIFORM,
                              passed=bool(eligible) or not scores, severity=dg.AssetCheckSeverity.ERROR,
                              metadata={**common, "threshold": "uniform Brier on the same pairs",
                                        "value": min((s.brier for s in scores if s.n_pairs), default=None),
                                        "passing": ", ".join(map(str, eligible)) or "none",
                                        "offending": ", ".join(str(s.version) for s in scores if GATE_BRIER in failures[s.version]) or "none"})


@dg.asset(
    group_name=GROUP,
    kinds={"mlflow"},
    deps=["calibration_report", "utility_report"],
)
def model_promotion(context: dg.AssetExecutionContext, settings: SettingsResource, warehouse: WarehouseResource,
                    mlflow: MlflowResource) -> dg.MaterializeResult:
    """The registry aliases after the promotion rule: @champion moves to the best challenger
    that passes the gates and beats the current champion on the same eval pairs."""
    from models.promotion import decide_promotion
    from models.registry import set_alias

    policy = _policy(settings)
    scores, champion, version = _scores(mlflow, warehouse)
    decision = decide_promotion(scores, champion, policy)
    if decision.promote is not None:
        set_alias(mlflow.tracking_uri, "champion", decision.promote)
    context.log.info(f"promotion: {decision.reason}")
    after = decision.promote if decision.promote is not None else champion
    return dg.MaterializeResult(
        metadata={"dataset_version": version or "none", "registered_model": "kernelcast-surrogate",
                  "promoted": decision.promote if decision.promote is not None else "none",
                  "champion_before": champion if champion is not None else "none",
                  "champion": after if after is not None else "none", "reason": decision.reason,
                  "challengers": dg.MetadataValue.md(_table(scores, decision.failures) if scores else "(none)")},
    )


defs = dg.Definitions(assets=[model_promotion], asset_checks=[promotion_gates])
