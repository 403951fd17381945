"""Promotion of a registered surrogate version: challenger -> champion, one explicit rule.

Every registered version is weighed the same way, whatever its kind (version tag `kind`: an
LLM surrogate, a cost model, a text model): the challengers are the versions with forecasts
on the eval pairs of the current dataset version, other than the champion, and all of them and
the champion are scored on the same pairs, those every one of them forecast
(`pipelines.promotion.scores.score_versions`). From those scores alone the rule below decides whether
one of them becomes "champion":

1. Gates (each must hold for a challenger to be eligible):
   - `parse_rate_above_floor`: parse rate on its evaluated pairs >= `policy.parse_rate_floor`
     (and at least one evaluated pair);
   - `brier_not_worse_than_uniform`: its Brier (full set: a parse failure scores as the
     uniform distribution, method.md section 3) <= the uniform forecaster's Brier on the
     same pairs (0.4375);
   - `forecasts_new_pairs`: it is a model that forecasts a pair it has not seen, not a
     version holding only committed forecasts (version tag `weights` = "committed forecasts
     only", models.registry.versions.committed_only): a champion must answer kernels it was not
     scored on, which such a version cannot.
2. No eligible challenger: nothing changes.
3. The candidate is the eligible challenger with the lowest Brier (ties: the newest version).
4. No champion yet: the candidate becomes champion.
5. The candidate already is the champion: nothing changes.
6. Otherwise both are compared on the pairs both forecast: the candidate becomes champion
   only if its Brier there is lower than the champion's by more than `policy.min_brier_gain`;
   a champion not forecast on any common pair is never replaced blind (nothing changes).

Every split (`decide_over_splits`, the function `model_promotion` calls): the rule above decides
on `in_distribution`; a candidate it would promote over a champion must also be at least as good
as the champion (Brier on the pairs both forecast, <=) on `source_only` and, when it has pairs,
`external`; a split where the champion has forecasts and the candidate none vetoes it too (it
was not weighed there). A split where the champion has no forecasts does not veto (there is
nothing to compare). The alias `champion-external` follows the same rule of its own on the first
of EXTERNAL_ALIAS_SPLITS with forecasts: the one to trust on kernels from files, so it is decided
on the kernels people write where there are any: `library` (published kernels), else
`held_out_styles` (each version stands there for its held-out-style twins: the same kind fitted
without a style, scored on that style, pooled over the styles), else `external` (rewrites of
template kernels), else `source_only`.

Challengers (architecture.md, "Aliases"): after each decision, `@challenger` names the best
version of `in_distribution` that passes the gates and is not the champion (lowest Brier on the
split's common pairs, ties: the newest); `@challenger-external` the same on the split
`@champion-external` was decided on. No such version: the alias is removed, so it never names a
version the last promotion did not weigh, nor the champion itself.

Brier is the deciding score because it is the proper score GRPO's calibration reward
optimises and it rewards calibrated distributions, not only right argmaxes (method.md).
`model_promotion` applies this rule on every run and records the decision (held back, kept or
promoted); the checks `challenger_parse_rate_above_floor` and
`challenger_brier_not_worse_than_uniform` show the gates as warnings, since holding a
challenger back is a decision, not a fault.

>>> c = ChallengerScores(version=3, n_pairs=24, parse_rate=1.0, brier=0.40, uniform_brier=0.4375)
>>> decide_promotion([c], champion=None).promote
3
>>> from dataclasses import replace
>>> decide_promotion([replace(c, brier=0.5)], champion=None).reason
'no challenger passes the gates'
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

GATE_PARSE_RATE = "parse_rate_above_floor"
GATE_BRIER = "brier_not_worse_than_uniform"
GATE_FORECASTS = "forecasts_new_pairs"
GATES = (GATE_PARSE_RATE, GATE_BRIER, GATE_FORECASTS)

__all__ = [
    "CHAMPION",
    "CHAMPION_EXTERNAL",
    "EXTERNAL_ALIAS_SPLITS",
    "HELD_OUT_STYLES",
    "CHALLENGER",
    "CHALLENGER_EXTERNAL",
    "GATES",
    "GATE_BRIER",
    "GATE_FORECASTS",
    "GATE_PARSE_RATE",
    "PROMOTION_SPLITS",
    "ChallengerScores",
    "Decision",
    "PromotionPolicy",
    "SplitDecision",
    "best_challenger",
    "decide_over_splits",
    "decide_promotion",
    "gate_failures",
]

CHAMPION = "champion"
CHAMPION_EXTERNAL = "champion-external"  # the alias for kernels from files (kernelcast forecast, the hooks)
CHALLENGER = "challenger"  # the best eligible version of the last promotion that is not @champion
CHALLENGER_EXTERNAL = "challenger-external"  # the same beside @champion-external
PROMOTION_SPLITS = ("in_distribution", "source_only", "external")
HELD_OUT_STYLES = "held_out_styles"  # the held-out-style splits pooled, each version by its twins
EXTERNAL_ALIAS_SPLITS = ("library", HELD_OUT_STYLES, "external", "source_only")


@dataclass(frozen=True)
class PromotionPolicy:
    """Thresholds of the rule.

    Attributes:
        parse_rate_floor: least parse rate on the evaluated pairs. The logprob readout always
            yields a distribution (rate 1.0); the verbalized readout of a small model often
            does not, and a model that rarely answers is not a forecaster.
        min_brier_gain: how much lower than the champion's a challenger's Brier must be (0:
            any strict improvement; raise it to ignore noise on small eval subsets).
    """

    parse_rate_floor: float = 0.8
    min_brier_gain: float = 0.0


@dataclass(frozen=True)
class ChallengerScores:
    """One challenger's scores on its evaluated pairs, and the comparison with the champion.

    Attributes:
        version: registered model version.
        n_pairs: eval pairs it forecast.
        parse_rate: share of those forecasts that parsed.
        brier: mean Brier over them (failures scored as uniform).
        uniform_brier: the uniform forecaster's mean Brier on the same pairs.
        common_brier: its Brier on the pairs the champion also forecast (None: no champion
            or no common pair).
        champion_brier: the champion's Brier on those common pairs.
        reward: the reward variant it was trained with (for reports only).
        kind: the version's kind tag (llm, cost_model, text_model; for reports only: the
            rule treats every kind alike).
        committed_only: it holds only committed forecasts (gate `forecasts_new_pairs`).
    """

    version: int
    n_pairs: int
    parse_rate: float
    brier: float
    uniform_brier: float
    common_brier: float | None = None
    champion_brier: float | None = None
    reward: str = ""
    kind: str = ""
    committed_only: bool = False


@dataclass(frozen=True)
class Decision:
    """What the rule decided.

    Attributes:
        promote: the version that becomes champion, or None (nothing changes).
        champion_before: the champion when the rule ran (None: none).
        candidate: the best eligible challenger (None: none passed the gates).
        reason: one line saying why.
        failures: version -> gates it failed (empty list = eligible).
    """

    promote: int | None
    champion_before: int | None
    candidate: int | None
    reason: str
    failures: dict[int, list[str]] = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        """promoted | held_back (no challenger passes the gates) | kept | no_candidates.

        >>> Decision(None, 2, None, "no challenger passes the gates", {3: ["parse_rate_above_floor"]}).outcome
        'held_back'
        """
        if self.promote is not None:
            return "promoted"
        if not self.failures:
            return "no_candidates"
        return "held_back" if self.candidate is None else "kept"


def gate_failures(scores: ChallengerScores, policy: PromotionPolicy = PromotionPolicy()) -> list[str]:
    """The gates a challenger fails (empty: eligible).

    >>> gate_failures(ChallengerScores(1, 10, 0.5, 0.30, 0.4375))
    ['parse_rate_above_floor']
    >>> gate_failures(ChallengerScores(1, 0, 1.0, 0.30, 0.4375))
    ['parse_rate_above_floor', 'brier_not_worse_than_uniform']
    >>> gate_failures(ChallengerScores(1, 10, 1.0, 0.30, 0.4375, committed_only=True))
    ['forecasts_new_pairs']
    """
    failed = []
    if scores.n_pairs <= 0 or not scores.parse_rate >= policy.parse_rate_floor:
        failed.append(GATE_PARSE_RATE)
    finite = math.isfinite(scores.brier) and math.isfinite(scores.uniform_brier)
    if scores.n_pairs <= 0 or not finite or scores.brier > scores.uniform_brier:
        failed.append(GATE_BRIER)
    if scores.committed_only:
        failed.append(GATE_FORECASTS)
    return failed


def decide_promotion(
    challengers: Sequence[ChallengerScores],
    champion: int | None,
    policy: PromotionPolicy = PromotionPolicy(),
) -> Decision:
    """Apply the promotion rule of the module docstring.

    Args:
        challengers: the scores of every challenger (newly registered versions).
        champion: the version the "champion" alias points at now, or None.
        policy: thresholds.
    Returns:
        A Decision; `promote` is the version to alias "champion", or None.
    """
    failures = {c.version: gate_failures(c, policy) for c in challengers}
    eligible = [c for c in challengers if not failures[c.version]]
    if not challengers:
        return Decision(None, champion, None, "no challengers", failures)
    if not eligible:
        return Decision(None, champion, None, "no challenger passes the gates", failures)
    best = min(eligible, key=lambda c: (c.brier, -c.version))
    if champion is None:
        return Decision(best.version, None, best.version,
                        f"no champion yet; version {best.version} passes the gates (Brier {best.brier:.4f})",
                        failures)
    if best.version == champion:
        return Decision(None, champion, best.version, f"version {best.version} already is the champion", failures)
    if best.common_brier is None or best.champion_brier is None:
        return Decision(None, champion, best.version,
                        f"champion {champion} has no forecasts on the pairs version {best.version} was scored on",
                        failures)
    gain = best.champion_brier - best.common_brier
    if gain > policy.min_brier_gain:
        return Decision(best.version, champion, best.version,
                        f"version {best.version} beats champion {champion}: Brier {best.common_brier:.4f} "
                        f"vs {best.champion_brier:.4f} on the same pairs",
                        failures)
    return Decision(None, champion, best.version,
                    f"version {best.version} does not beat champion {champion}: Brier {best.common_brier:.4f} "
                    f"vs {best.champion_brier:.4f} (needs a gain > {policy.min_brier_gain})",
                    failures)


@dataclass(frozen=True)
class SplitDecision:
    """The decisions of one promotion run over every split.

    Attributes:
        champion: the @champion decision (the in-distribution rule, vetoed by the other splits).
        champion_external: the @champion-external decision.
        external_split: the split @champion-external was decided on (external, or source_only
            while external is empty).
        splits: split -> one line of how the candidate compared there (for the record).
        challenger: the version @challenger names after the decision (None: remove it).
        challenger_external: the version @challenger-external names (None: remove it).
    """

    champion: Decision
    champion_external: Decision
    external_split: str
    splits: dict[str, str] = field(default_factory=dict)
    challenger: int | None = None
    challenger_external: int | None = None

    @property
    def champion_after(self) -> int | None:
        """@champion once the decision is applied."""
        d = self.champion
        return d.promote if d.promote is not None else d.champion_before

    @property
    def champion_external_after(self) -> int | None:
        """@champion-external once the decision is applied."""
        d = self.champion_external
        return d.promote if d.promote is not None else d.champion_before


def best_challenger(scores: dict[int, ChallengerScores], champion: int | None,
                    policy: PromotionPolicy = PromotionPolicy()) -> int | None:
    """The best version of one split that passes the gates and is not `champion` (None: none).

    The scores are on the pairs every version of the split forecast, so Briers compare directly;
    ties go to the newest version, as in `decide_promotion`.

    >>> s = lambda v, b: ChallengerScores(v, 24, 1.0, b, 0.4375)
    >>> best_challenger({1: s(1, 0.30), 2: s(2, 0.25), 3: s(3, 0.28), 4: s(4, 0.50)}, champion=2)
    3
    >>> best_challenger({2: s(2, 0.25), 4: s(4, 0.50)}, champion=2) is None
    True
    """
    eligible = [s for v, s in scores.items() if v != champion and not gate_failures(s, policy)]
    return min(eligible, key=lambda s: (s.brier, -s.version)).version if eligible else None


def _against(scores: dict[int, ChallengerScores], reference: int | None) -> list[ChallengerScores]:
    """Every version but `reference`, with the comparison to it filled in (the scores are on the
    pairs every version of the split forecast, so a version's Brier is its common Brier)."""
    ref = scores.get(reference) if reference is not None else None
    return [replace(s, common_brier=s.brier if ref is not None else None,
                    champion_brier=ref.brier if ref is not None else None)
            for v, s in sorted(scores.items()) if v != reference]


def _non_empty(scores: dict[int, ChallengerScores]) -> bool:
    return any(s.n_pairs > 0 for s in scores.values())


def decide_over_splits(
    scores: dict[str, dict[int, ChallengerScores]],
    champion: int | None,
    champion_external: int | None,
    policy: PromotionPolicy = PromotionPolicy(),
) -> SplitDecision:
    """The module docstring's rule over every split: pure, from the scores alone.

    Args:
        scores: split -> version -> its scores on that split's common pairs (every version of
            the split, the champions included; a split missing or without pairs is empty).
        champion: the version @champion points at, or None.
        champion_external: the version @champion-external points at, or None.
        policy: thresholds.
    Returns:
        A SplitDecision.

    >>> s = lambda v, b: ChallengerScores(v, 24, 1.0, b, 0.4375)
    >>> d = decide_over_splits({"in_distribution": {1: s(1, 0.30), 2: s(2, 0.25)},
    ...                         "source_only": {1: s(1, 0.35), 2: s(2, 0.40)}}, champion=1, champion_external=1)
    >>> d.champion.promote, d.champion.outcome, d.champion_external.promote, d.external_split
    (None, 'kept', None, 'source_only')
    >>> d.challenger, d.challenger_external
    (2, 2)
    """
    split_scores = {k: dict(scores.get(k) or {}) for k in (*PROMOTION_SPLITS, *EXTERNAL_ALIAS_SPLITS)}
    base = decide_promotion(_against(split_scores["in_distribution"], champion), champion, policy)
    notes: dict[str, str] = {}
    decision = base
    if base.promote is not None and champion is not None:
        cand = base.promote
        for split in PROMOTION_SPLITS[1:]:
            here = split_scores[split]
            if not _non_empty(here):
                notes[split] = "empty: not weighed"
                continue
            if champion not in here:
                notes[split] = f"champion {champion} has no forecasts here: not weighed"
                continue
            if cand not in here or here[cand].n_pairs <= 0:
                notes[split] = f"version {cand} has no forecasts here"
            elif not here[cand].brier <= here[champion].brier:  # NaN never passes
                notes[split] = f"Brier {here[cand].brier:.4f} vs champion {here[champion].brier:.4f}"
            else:
                notes[split] = f"at least as good: Brier {here[cand].brier:.4f} vs {here[champion].brier:.4f}"
                continue
            decision = Decision(None, champion, cand, f"{base.reason}; but not on {split}: {notes[split]}",
                                base.failures)
            break
    ext_split = next((k for k in EXTERNAL_ALIAS_SPLITS if _non_empty(split_scores[k])), "source_only")
    ext = decide_promotion(_against(split_scores[ext_split], champion_external), champion_external, policy)
    ext = replace(ext, reason=f"{ext_split}: {ext.reason}")
    out = SplitDecision(decision, ext, ext_split, notes)
    return replace(out, challenger=best_challenger(split_scores["in_distribution"], out.champion_after, policy),
                   challenger_external=best_challenger(split_scores[ext_split], out.champion_external_after, policy))
