"""Scores for the promotion rule: every registered version on the same eval pairs.

The versions of a registered model may be of different kinds (an LLM surrogate forecasting a
capped subset, a cost model forecasting every pair); the rule of `pipelines.promotion.rule` compares
them like with like, so each one, the champion and the uniform forecaster are scored on the
pairs all of them forecast.

    scored = score_versions(eval_forecasts, "kernelcast-surrogate", champion=2, kinds={3: "llm"})
    decide_promotion(scored.challengers, champion=2)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import polars as pl

from models.registry.versions import registered_version
from pipelines.promotion.rule import ChallengerScores

UNIFORM = "baseline:uniform"


@dataclass(frozen=True)
class ScoredVersions:
    """Every version's scores on the common pairs.

    Attributes:
        challengers: scores of the versions other than the champion (ascending version).
        champion: the champion's scores on the same pairs (None: it has no forecasts here).
        pairs: the common eval pairs (sorted pair ids).
        errors: version -> why its forecasts could not be scored (bad probabilities, ...).
    """

    challengers: list[ChallengerScores]
    champion: ChallengerScores | None
    pairs: list[str]
    errors: dict[int, str] = field(default_factory=dict)


def _score(frame: pl.DataFrame, ref: str, pairs: list[str]) -> tuple[int, float, float]:
    """(pairs scored, parse rate, Brier) of one model_ref on `pairs`."""
    from pipelines.evaluation.evaluate import prepare
    from pipelines.evaluation.scores import score_means

    part = frame.filter((pl.col("model_ref") == ref) & pl.col("pair_id").is_in(pairs))
    if part.is_empty():
        return 0, 0.0, float("nan")
    a = prepare(part.drop("model_ref"))
    means = score_means(a.p, a.y, a.predicted_bin, a.parse_ok)
    return part["pair_id"].n_unique(), means["parse_rate"], means["full"]["brier"]


def score_versions(
    frame: pl.DataFrame,
    name: str,
    champion: int | None,
    kinds: Mapping[int, str] | None = None,
    rewards: Mapping[int, str] | None = None,
) -> ScoredVersions:
    """Score every version of `name` with forecasts in `frame` on the pairs all of them forecast.

    Args:
        frame: eval forecasts of one dataset version joined with their pairs
            (`warehouse.forecasts.read_forecasts(..., with_pairs=True)`, split 'eval').
        name: the registered model.
        champion: the version @champion points at (None: none).
        kinds: version -> kind tag, for the record.
        rewards: version -> reward tag, for the record.
    Returns:
        ScoredVersions; a version whose forecasts are not valid distributions is left out of
        the comparison and named in `errors`.
    """
    kinds, rewards = dict(kinds or {}), dict(rewards or {})
    if frame.is_empty():
        return ScoredVersions([], None, [])
    refs = {v: ref for ref in frame["model_ref"].unique().to_list() if (v := registered_version(ref, name)) is not None}
    pair_sets = {v: set(frame.filter(pl.col("model_ref") == ref)["pair_id"].to_list()) for v, ref in refs.items()}
    # The uniform reference of a held-out split is listed as "baseline:uniform|<split>".
    uniform_ref = pl.col("model_ref").cast(pl.Utf8)
    is_uniform = (uniform_ref == UNIFORM) | uniform_ref.str.starts_with(UNIFORM + "|")
    uniform_rows = frame.filter(is_uniform)
    uniform_name = uniform_rows["model_ref"][0] if uniform_rows.height else UNIFORM
    common = set(uniform_rows["pair_id"].to_list())
    for pairs in pair_sets.values():
        common &= pairs
    pairs = sorted(common)
    _, _, uniform = _score(frame, uniform_name, pairs) if pairs else (0, 0.0, float("nan"))
    scored: dict[int, ChallengerScores] = {}
    errors: dict[int, str] = {}
    for v in sorted(refs):
        try:
            n, rate, brier = _score(frame, refs[v], pairs) if pairs else (0, 0.0, float("nan"))
        except ValueError as exc:  # not a valid set of distributions: wrong data, not a weak model
            errors[v] = str(exc).splitlines()[0]
            continue
        scored[v] = ChallengerScores(v, n, rate, brier, uniform, brier, None, rewards.get(v, ""), kinds.get(v, ""))
    champ = scored.get(champion) if champion is not None else None
    challengers = [
        ChallengerScores(s.version, s.n_pairs, s.parse_rate, s.brier, s.uniform_brier,
                         s.brier if champ is not None else None, champ.brier if champ is not None else None,
                         s.reward, s.kind)
        for v, s in sorted(scored.items()) if v != champion
    ]
    return ScoredVersions(challengers, champ, pairs, errors)


@dataclass(frozen=True)
class ScoredSplits:
    """Every version's scores on each split's common pairs (`pipelines.promotion.rule.decide_over_splits`'s input).

    Attributes:
        scores: split -> version -> scores (no comparison filled in).
        pairs: split -> the common pairs of the split.
        errors: version -> why its forecasts could not be scored, on any split.
    """

    scores: dict[str, dict[int, ChallengerScores]]
    pairs: dict[str, list[str]]
    errors: dict[int, str] = field(default_factory=dict)


def score_splits(
    parts: Mapping[str, pl.DataFrame],
    name: str,
    kinds: Mapping[int, str] | None = None,
    rewards: Mapping[int, str] | None = None,
) -> ScoredSplits:
    """`score_versions` on each split of `parts` (pipelines.forecasting.registered.split_frames),
    every version of a split on the pairs all of them forecast there."""
    scores: dict[str, dict[int, ChallengerScores]] = {}
    pairs: dict[str, list[str]] = {}
    errors: dict[int, str] = {}
    for split, part in parts.items():
        scored = score_versions(part.filter(pl.col("pair_type").cast(pl.Utf8).fill_null("") != "parent")
                                if "pair_type" in part.columns else part, name, None, kinds, rewards)
        scores[split] = {s.version: s for s in scored.challengers}
        pairs[split] = scored.pairs
        for v, e in scored.errors.items():
            errors.setdefault(v, f"{split}: {e}")
    return ScoredSplits(scores, pairs, errors)


def pooled_twin_scores(split_scores: Mapping[str, Mapping[int, ChallengerScores]],
                       twin_of: Mapping[int, int]) -> dict[int, ChallengerScores]:
    """Scores of held-out versions on several splits, pooled per the version each stands for.

    Args:
        split_scores: split -> held-out version -> its scores on the split's common pairs.
        twin_of: held-out version -> the version it stands for (same kind, dataset version and
            code, fitted on everything); a held-out version without one is left out.
    Returns:
        version -> pairs summed, parse rate and Brier pair-weighted over the splits where a twin
        of it was scored (a version needs a twin on every such split to be pooled, so all are
        weighed on the same pairs).

    >>> s = lambda v, n, b: ChallengerScores(v, n, 1.0, b, 0.4375)
    >>> out = pooled_twin_scores({"a": {10: s(10, 30, 0.2), 11: s(11, 30, 0.3)}, "b": {12: s(12, 10, 0.4)}},
    ...                          {10: 1, 11: 2, 12: 1})
    >>> sorted(out), out[1].n_pairs, round(out[1].brier, 3)
    ([1], 40, 0.25)
    """
    per: dict[int, list[ChallengerScores]] = {}
    for scores in split_scores.values():
        for held, sc in scores.items():
            if held in twin_of and sc.n_pairs > 0:
                per.setdefault(twin_of[held], []).append(sc)
    splits = sum(1 for scores in split_scores.values() if any(s.n_pairs > 0 for s in scores.values()))
    out = {}
    for version, parts in per.items():
        if len(parts) < splits:
            continue
        n = sum(p.n_pairs for p in parts)
        out[version] = ChallengerScores(
            version, n, sum(p.parse_rate * p.n_pairs for p in parts) / n, sum(p.brier * p.n_pairs for p in parts) / n,
            sum(p.uniform_brier * p.n_pairs for p in parts) / n, reward=parts[0].reward, kind=parts[0].kind)
    return out
