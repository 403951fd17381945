"""The promotion as the `model_promotion` asset applies it: every registered version's forecasts
of the current dataset version scored per split, `rule.decide_over_splits` decided, both alias
pairs moved in the registry, both decisions recorded in DuckDB and on the registered model."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from models.registry import HELD_OUT_MODEL, SURROGATE_MODEL
from pipelines.promotion.rule import GATE_PARSE_RATE, PromotionPolicy, SplitDecision
from pipelines.promotion.scores import ScoredSplits, ScoredVersions
from pipelines.surrogates.roles import LIBRARY_SPLIT

LEGACY_KIND = "llm"  # versions registered before the `kind` tag existed are LLM adapters


class ForecastListingError(ValueError):
    """The forecasts asset's listing of the current dataset version is missing or unusable."""


def split_forecasts(warehouse_path: str | Path) -> tuple[str | None, dict[str, pl.DataFrame]]:
    """(dataset version, {split: forecasts of it joined with their pairs}) of the current version.

    Raises:
        ForecastListingError: the forecasts asset's listing of the version is missing or unreadable.
    """
    from pipelines.forecasting.registered import split_frames
    from warehouse.datasets import current_dataset_version
    from warehouse.db import connect
    from warehouse.errors import ValidationError
    from warehouse.forecasts import read_forecast_listing, read_forecasts

    with connect(warehouse_path, read_only=True) as con:
        version = current_dataset_version(con)
        frame = read_forecasts(con, dataset_version=version, with_pairs=True) if version else None
        if frame is None or frame.is_empty():
            return version, {}
        try:
            listing = read_forecast_listing(con, version)
        except ValidationError as exc:
            raise ForecastListingError(str(exc)) from None
    try:
        return version, split_frames(frame, listing)
    except (ValueError, KeyError) as exc:
        raise ForecastListingError(
            f"forecaster listing of dataset version {version} unusable: {str(exc).splitlines()[0]}") from None


def forecast_errors(warehouse_path: str | Path) -> dict[int, str]:
    """version -> why its forecasts of the current version are not distributions (none: {})."""
    from pipelines.promotion.scores import score_splits

    return score_splits(split_forecasts(warehouse_path)[1], SURROGATE_MODEL).errors


@dataclass(frozen=True)
class Promotion:
    """One applied promotion: what was weighed, decided and recorded.

    Attributes:
        dataset_version: the version whose forecasts were scored (None: no dataset yet).
        policy: the thresholds the rule applied.
        champion_before: @champion before the decision.
        by_split: every version's scores on each split's common pairs.
        splits: the decisions (`rule.SplitDecision`).
        scored: the in-distribution scores, the champion apart from its challengers.
        decision_id, external_decision_id: the recorded @champion and @champion-external decisions.
    """

    dataset_version: str | None
    policy: PromotionPolicy
    champion_before: int | None
    by_split: ScoredSplits
    splits: SplitDecision
    scored: ScoredVersions
    decision_id: str
    external_decision_id: str

    @property
    def parse_ok(self) -> list[int]:
        """Challengers whose parse rate reaches the floor."""
        failures = self.splits.champion.failures
        return [s.version for s in self.scored.challengers if GATE_PARSE_RATE not in failures.get(s.version, [])]

    @property
    def eligible(self) -> list[int]:
        """Challengers that pass every gate."""
        return [s.version for s in self.scored.challengers if not self.splits.champion.failures.get(s.version)]


def apply_promotion(warehouse_path: str | Path, tracking_uri: str, policy: PromotionPolicy,
                    dagster_run_id: str | None, reports_dir: str | Path | None = None) -> Promotion:
    """Decide and apply this run's promotion of `SURROGATE_MODEL`'s versions (module docstring).

    Args:
        warehouse_path: the DuckDB file (read: forecasts and their listing; written:
            `promotion_decisions`, `promotion_scores`).
        tracking_uri: the MLflow registry (aliases and tags moved there).
        policy: the rule's thresholds.
        dagster_run_id: the run recorded with both decisions.
        reports_dir: where the forecasts asset left the `library` split's forecasts of each
            version (<reports_dir>/<version>/library-dir.parquet, when KERNELCAST_LIBRARY_DIR is
            set); they are scored for @champion-external, which is decided there first.
    Raises:
        ForecastListingError: the forecasts asset's listing is missing or unusable.
    """
    from models.registry.versions import alias_version, committed_only, find_versions, set_aliases
    from pipelines.promotion.rule import (
        CHAMPION,
        CHAMPION_EXTERNAL,
        HELD_OUT_STYLES,
        decide_over_splits,
    )
    from pipelines.promotion.scores import score_splits

    champion = alias_version(tracking_uri, CHAMPION, SURROGATE_MODEL)
    champion_ext = alias_version(tracking_uri, CHAMPION_EXTERNAL, SURROGATE_MODEL)
    tags = {v["version"]: v["tags"] for v in find_versions(tracking_uri, SURROGATE_MODEL)}
    version, parts = split_forecasts(warehouse_path)
    kinds = {v: t.get("kind", LEGACY_KIND) for v, t in tags.items()}
    rewards = {v: t.get("reward", "") for v, t in tags.items()}
    by_split = score_splits(parts, SURROGATE_MODEL, kinds=kinds, rewards=rewards)
    by_split.scores[HELD_OUT_STYLES] = _held_out_style_scores(tracking_uri, parts, tags)
    library = _library_forecasts(reports_dir, version)
    if library is not None:
        scored_library = score_splits({LIBRARY_SPLIT: library}, SURROGATE_MODEL, kinds=kinds, rewards=rewards)
        by_split.scores[LIBRARY_SPLIT] = scored_library.scores.get(LIBRARY_SPLIT, {})
        by_split.pairs[LIBRARY_SPLIT] = scored_library.pairs.get(LIBRARY_SPLIT, [])
    _mark_committed_only(by_split.scores, {v for v, t in tags.items() if committed_only(t)})
    splits = decide_over_splits(by_split.scores, champion, champion_ext, policy)
    set_aliases(tracking_uri, splits.champion.promote, splits.challenger, SURROGATE_MODEL, use=CHAMPION,
                clear_challenger=True)
    set_aliases(tracking_uri, splits.champion_external.promote, splits.challenger_external, SURROGATE_MODEL,
                use=CHAMPION_EXTERNAL, clear_challenger=True)
    in_dist = by_split.scores.get("in_distribution", {})
    scored = ScoredVersions([s for v, s in sorted(in_dist.items()) if v != champion], in_dist.get(champion),
                            by_split.pairs.get("in_distribution", []))
    decision_id, ext_decision_id = _record(warehouse_path, version, policy, champion, champion_ext, by_split,
                                           splits, scored, dagster_run_id)
    _tag_registry(tracking_uri, version, champion, splits, scored, decision_id, ext_decision_id)
    return Promotion(version, policy, champion, by_split, splits, scored, decision_id, ext_decision_id)


def _library_forecasts(reports_dir: str | Path | None, version: str | None) -> pl.DataFrame | None:
    """The `library` split's forecasts the forecasts asset wrote beside the version's report, or
    None (no folder given to the run, or no rows)."""
    from pipelines.forecasting.plan import LIBRARY_DIR_ROWS

    if reports_dir is None or version is None:
        return None
    path = Path(reports_dir) / version / LIBRARY_DIR_ROWS
    if not path.is_file():
        return None
    try:
        frame = pl.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one line
        raise ForecastListingError(f"library split forecasts {path} unreadable: {str(exc).splitlines()[0]}") from None
    return frame if frame.height else None


def _mark_committed_only(scores: dict[str, dict[int, Any]], versions: set[int]) -> None:
    """Mark the versions holding only committed forecasts in every split's scores, in place: the
    rule's gate `forecasts_new_pairs` keeps them from either champion and challenger alias."""
    for split, by_version in scores.items():
        scores[split] = {v: dataclasses.replace(s, committed_only=True) if v in versions else s
                         for v, s in by_version.items()}


def _held_out_style_scores(tracking_uri: str, parts: dict, tags: dict[int, dict]) -> dict:
    """The held-out-style splits' scores pooled per in-distribution version, each by its twins:
    the held-out versions of the same kind, dataset version and code (pipelines.promotion.rule)."""
    from models.registry.versions import find_versions
    from pipelines.promotion.scores import pooled_twin_scores, score_splits
    from pipelines.surrogates.roles import is_style_split

    styles = {k: v for k, v in parts.items() if is_style_split(k)}
    if not styles:
        return {}
    from models.registry.hardware import fitted_for, reference_hardware

    same = ("kind", "dataset_version", "code_version")
    reference = reference_hardware(tracking_uri, SURROGATE_MODEL)  # another card's version is no twin's
    by_key = {tuple(t.get(k) for k in same): v for v, t in sorted(tags.items())
              if all(t.get(k) for k in same) and fitted_for({"tags": t}, reference, reference)}
    twin_of = {h["version"]: by_key[key] for h in find_versions(tracking_uri, HELD_OUT_MODEL)
               if (key := tuple(h["tags"].get(k) for k in same)) in by_key}
    return pooled_twin_scores(score_splits(styles, HELD_OUT_MODEL).scores, twin_of)


def _record(warehouse_path: str | Path, version: str | None, policy: PromotionPolicy, champion: int | None,
            champion_ext: int | None, by_split: ScoredSplits, splits: SplitDecision, scored: ScoredVersions,
            dagster_run_id: str | None) -> tuple[str, str]:
    """Both decisions and the scores behind them in DuckDB; their ids."""
    from pipelines.promotion.rule import CHAMPION_EXTERNAL
    from warehouse.db import connect
    from warehouse.promotions import record_promotion_decision

    decision, ext = splits.champion, splits.champion_external
    rows: list[dict[str, Any]] = (
        [{**dataclasses.asdict(scored.champion), "role": "champion", "failed_gates": []}] if scored.champion else [])
    rows += [{**dataclasses.asdict(s), "role": "challenger", "failed_gates": decision.failures.get(s.version, [])}
             for s in scored.challengers]
    ext_scores = by_split.scores.get(splits.external_split, {})
    ext_rows = [{**dataclasses.asdict(s), "model_version": v, "role": "champion" if v == champion_ext else "challenger",
                 "failed_gates": ext.failures.get(v, [])} for v, s in sorted(ext_scores.items())]
    with connect(warehouse_path) as con:
        decision_id = record_promotion_decision(
            con, SURROGATE_MODEL, version, decision.outcome, decision.reason, len(scored.pairs),
            dataclasses.asdict(policy), [{**r, "model_version": r["version"]} for r in rows],
            champion_before=champion, champion_after=splits.champion_after, candidate=decision.candidate,
            dagster_run_id=dagster_run_id, challenger_after=splits.challenger)
        ext_decision_id = record_promotion_decision(
            con, SURROGATE_MODEL, version, ext.outcome, ext.reason, len(by_split.pairs.get(splits.external_split, [])),
            dataclasses.asdict(policy), ext_rows, champion_before=champion_ext,
            champion_after=splits.champion_external_after, candidate=ext.candidate, dagster_run_id=dagster_run_id,
            alias=CHAMPION_EXTERNAL, split=splits.external_split, challenger_after=splits.challenger_external)
    return decision_id, ext_decision_id


def _tag_registry(tracking_uri: str, version: str | None, champion: int | None, splits: SplitDecision,
                  scored: ScoredVersions, decision_id: str, ext_decision_id: str) -> None:
    """Each challenger's status on its version, the last decisions on the registered model."""
    from models.registry.versions import set_model_tags, set_version_tag

    decision, ext = splits.champion, splits.champion_external
    for s in scored.challengers:
        failed = decision.failures.get(s.version, [])
        status = ("promoted" if s.version == decision.promote else
                  f"held back: {', '.join(failed)}" if failed else "eligible, not promoted")
        for key, value in {"promotion_status": status, "promotion_decision_id": decision_id,
                           "promotion_dataset_version": version or ""}.items():
            set_version_tag(tracking_uri, s.version, key, value, SURROGATE_MODEL)
    if scored.challengers or champion is not None or splits.champion_external_after is not None:
        set_model_tags(tracking_uri, SURROGATE_MODEL, {"last_promotion_outcome": decision.outcome,
                                                  "last_promotion_reason": decision.reason[:500],
                                                  "last_promotion_decision_id": decision_id,
                                                  "last_champion_external_outcome": ext.outcome,
                                                  "last_champion_external_reason": ext.reason[:500],
                                                  "last_champion_external_decision_id": ext_decision_id})
