"""The champion of each card other than the reference: `@champion-<card>` (e.g. @champion-h100).

A card's candidates are the versions fitted on its pairs (tag `hardware`, registered by the
cross-hardware forecasters of the current dataset version), scored on the card's eval pairs by
the cross-hardware study (pipelines.surrogates.cross_hardware, setting fitted@all). A candidate
is eligible when its Brier there beats the uniform forecaster's; the eligible one with the lowest
Brier becomes the card's champion, unless the champion is already one of the candidates and no
worse (ties keep it). `kernelcast forecast --hardware <card>` answers with @champion-<card> and,
while a card has none, with the reference card's champion, saying so.

The reference card's @champion and @champion-external are the promotion rule's
(pipelines.promotion.rule); nothing here moves them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from models.bins import NUM_BINS

UNIFORM_BRIER = 0.5 * (1 - 1 / NUM_BINS)  # 0.4375: the uniform forecaster's Brier on any pair
FITTED_ALL = "fitted@all"


@dataclass(frozen=True)
class CardDecision:
    """One card's decision: its alias, the champion before and after, why, and the candidates' Brier."""

    hardware_id: str
    alias: str
    before: int | None
    after: int | None
    outcome: str  # promoted | kept | none
    reason: str
    candidates: dict[int, float]


def decide_card(study: Mapping[str, Any], before: int | None, name: str) -> CardDecision:
    """The decision for one card's study (`CardStudy.to_dict()`), given the version its alias
    points at now.

    >>> s = {"hardware_id": "nvidia-h100-80gb-hbm3-sm90", "models": {"card": {"cost_model": "models:/m/7",
    ...      "text_model": "models:/m/8"}}, "settings": {"fitted@all": {"cost_model": {"n": 9, "brier": 0.31},
    ...      "text_model": {"n": 9, "brier": 0.36}}}}
    >>> d = decide_card(s, None, "m"); (d.alias, d.after, d.outcome)
    ('champion-h100', 7, 'promoted')
    >>> decide_card(s, 8, "m").outcome, decide_card(s, 7, "m").outcome
    ('promoted', 'kept')
    """
    from models.registry.hardware import champion_alias
    from models.registry.versions import registered_version

    card = study["hardware_id"]
    alias = champion_alias(card)
    scored = (study.get("settings") or {}).get(FITTED_ALL) or {}
    candidates: dict[int, float] = {}
    for kind, ref in ((study.get("models") or {}).get("card") or {}).items():
        version = registered_version(ref, name)
        if version is not None and (scored.get(kind) or {}).get("n"):
            candidates[version] = float(scored[kind]["brier"])
    eligible = {v: b for v, b in candidates.items() if b < UNIFORM_BRIER}
    if not eligible:
        why = "no version fitted on the card" if not candidates else \
            f"no version beats the uniform forecaster's Brier {UNIFORM_BRIER} on the card's eval pairs"
        return CardDecision(card, alias, before, before, "none", why, candidates)
    best = min(eligible, key=lambda v: (eligible[v], v))
    if before in eligible and eligible[before] <= eligible[best]:
        return CardDecision(card, alias, before, before, "kept",
                            f"version {before} is the best on the card's eval pairs (Brier {eligible[before]:.4f})",
                            candidates)
    return CardDecision(card, alias, before, best, "promoted",
                        f"version {best}: Brier {eligible[best]:.4f} on {card}'s eval pairs, the lowest of "
                        f"{len(candidates)} fitted on the card", candidates)


def promote_card_champions(tracking_uri: str, studies: list[Mapping[str, Any]], name: str) -> list[CardDecision]:
    """Decide and apply every card's champion alias (and record the decision in the registered
    model's tags `promotion_<alias>`)."""
    from models.registry.hardware import champion_alias
    from models.registry.versions import alias_version, set_alias, set_model_tags

    out = []
    for study in studies:
        alias = champion_alias(study["hardware_id"])
        decision = decide_card(study, alias_version(tracking_uri, alias, name), name)
        if decision.outcome == "promoted":
            set_alias(tracking_uri, alias, decision.after, name)
        if decision.candidates:
            set_model_tags(tracking_uri, name, {f"promotion_{alias}": f"{decision.outcome}: {decision.reason}"[:500]})
        out.append(decision)
    return out
