"""Promotion over every split: the pure decision (@champion needs the in-distribution rule and
no worse source_only/external; @champion-external decided on external, or source_only while
external is empty), and the per-split scoring it reads."""

from __future__ import annotations

import polars as pl
import pytest

from pipelines.promotion.rule import ChallengerScores, PromotionPolicy, decide_over_splits


def s(version: int, brier: float, n: int = 24, parse_rate: float = 1.0) -> ChallengerScores:
    return ChallengerScores(version, n, parse_rate, brier, 0.4375)


ID, SO, EX = "in_distribution", "source_only", "external"


@pytest.mark.parametrize(
    "scores, champion, champion_external, promote, outcome, external_promote, external_split, reason",
    [
        # no champion: the in-distribution rule alone
        ({ID: {1: s(1, 0.30)}, SO: {1: s(1, 0.40)}}, None, None, 1, "promoted", 1, SO, "no champion yet"),
        # better everywhere: promoted on both aliases
        ({ID: {1: s(1, 0.30), 2: s(2, 0.25)}, SO: {1: s(1, 0.40), 2: s(2, 0.35)}, EX: {1: s(1, 0.42), 2: s(2, 0.38)}},
         1, 1, 2, "promoted", 2, EX, "beats champion 1"),
        # better in distribution, worse source_only: kept; @champion-external (source_only, external empty) kept
        ({ID: {1: s(1, 0.30), 2: s(2, 0.25)}, SO: {1: s(1, 0.35), 2: s(2, 0.40)}}, 1, 1, None, "kept", None, SO,
         "not on source_only"),
        # better in distribution and source_only, worse on a non-empty external: kept
        ({ID: {1: s(1, 0.30), 2: s(2, 0.25)}, SO: {1: s(1, 0.40), 2: s(2, 0.35)}, EX: {1: s(1, 0.30), 2: s(2, 0.33)}},
         1, 1, None, "kept", None, EX, "not on external"),
        # a tie on source_only is "at least as good"
        ({ID: {1: s(1, 0.30), 2: s(2, 0.25)}, SO: {1: s(1, 0.40), 2: s(2, 0.40)}}, 1, 1, 2, "promoted", None, SO,
         "beats champion 1"),
        # the candidate has no source_only forecasts while the champion has: not weighed, kept
        ({ID: {1: s(1, 0.30), 2: s(2, 0.25)}, SO: {1: s(1, 0.40)}}, 1, 1, None, "kept", None, SO, "has no forecasts here"),
        # the champion has no source_only forecasts: nothing to compare, no veto
        ({ID: {1: s(1, 0.30), 2: s(2, 0.25)}, SO: {2: s(2, 0.40)}}, 1, None, 2, "promoted", 2, SO, "beats champion 1"),
        # an empty external split (no pairs) does not veto
        ({ID: {1: s(1, 0.30), 2: s(2, 0.25)}, SO: {1: s(1, 0.40), 2: s(2, 0.39)}, EX: {1: s(1, 0.5, n=0), 2: s(2, 0.5, n=0)}},
         1, 1, 2, "promoted", 2, SO, "beats champion 1"),
        # not better in distribution: kept, whatever the other splits say; the external alias moves on its own
        ({ID: {1: s(1, 0.25), 2: s(2, 0.30)}, SO: {1: s(1, 0.40), 2: s(2, 0.30)}, EX: {1: s(1, 0.40), 2: s(2, 0.30)}},
         1, 1, None, "kept", 2, EX, "does not beat champion 1"),
        # the gates still apply: worse than uniform in distribution is held back
        ({ID: {1: s(1, 0.30), 2: s(2, 0.50)}}, 1, 1, None, "held_back", None, SO, "no challenger passes the gates"),
        # @champion-external: a version worse than uniform on external never becomes it
        ({ID: {1: s(1, 0.30)}, EX: {1: s(1, 0.45)}}, None, None, 1, "promoted", None, EX, "no champion yet"),
    ],
)
def test_the_decision_table(scores, champion, champion_external, promote, outcome, external_promote, external_split,
                            reason):
    d = decide_over_splits(scores, champion, champion_external)
    assert (d.champion.promote, d.champion.outcome) == (promote, outcome)
    assert reason in d.champion.reason
    assert (d.champion_external.promote, d.external_split) == (external_promote, external_split)
    assert d.champion_external.reason.startswith(f"{external_split}: ")


def test_the_external_alias_needs_the_gain_the_policy_asks_for():
    scores = {ID: {1: s(1, 0.30)}, EX: {1: s(1, 0.40), 2: s(2, 0.39)}}
    assert decide_over_splits(scores, 1, 1).champion_external.promote == 2
    assert decide_over_splits(scores, 1, 1, PromotionPolicy(min_brier_gain=0.05)).champion_external.promote is None


def test_scores_of_each_split_are_on_its_common_pairs():
    from models.bins import speedup_to_bin
    from pipelines.promotion.scores import score_splits

    def rows(ref, pids, peak, pair_type="reference"):
        out = []
        for i, pid in enumerate(pids):
            y = speedup_to_bin(2.0 ** ((i % 8) - 3.5))
            p = [(1 - peak) / 7] * 8
            p[y - 1] = peak
            out.append({"pair_id": pid, "model_ref": ref, "repeat": 0, "parse_ok": True, "predicted_bin": y, "task": "t",
                        "true_speedup": 2.0 ** ((i % 8) - 3.5), "pair_type": pair_type, **{f"p{j + 1}": v for j, v in enumerate(p)}})
        return out

    ev, ext = [f"e{i}" for i in range(10)], [f"x{i}" for i in range(6)]
    v1, v2 = "models:/kernelcast-surrogate/1", "models:/kernelcast-surrogate/2"
    parts = {ID: pl.DataFrame(rows("baseline:uniform", ev, 1 / 8) + rows(v1, ev[:4], 0.6) + rows(v2, ev, 0.3)
                              + rows(v2, ["d1"], 0.9, "parent")),
             EX: pl.DataFrame(rows("baseline:uniform", ext, 1 / 8) + rows(v2, ext, 0.5))}
    out = score_splits(parts, "kernelcast-surrogate")
    assert out.pairs == {ID: ev[:4], EX: ext}  # the discovery pair is never scored
    assert set(out.scores[ID]) == {1, 2} and set(out.scores[EX]) == {2}
    assert all(sc.n_pairs == 4 for sc in out.scores[ID].values()) and out.scores[EX][2].n_pairs == 6
    assert out.scores[ID][1].brier < out.scores[ID][2].brier


@pytest.mark.parametrize("present, split, promote", [
    # the published kernels decide where there are any
    (("library", "held_out_styles", "external"), "library", 3),
    # else the held-out styles (each version by its twins), never the rewrites' neighbourhood first
    (("held_out_styles", "external"), "held_out_styles", 2),
    (("external",), "external", 1),
    ((), "source_only", 1),
])
def test_the_file_champion_is_decided_on_the_kernels_people_write_first(present, split, promote):
    by_split = {"library": {1: s(1, 0.40), 2: s(2, 0.35), 3: s(3, 0.30)},
                "held_out_styles": {1: s(1, 0.34), 2: s(2, 0.28), 3: s(3, 0.31)},
                "external": {1: s(1, 0.20), 2: s(2, 0.25), 3: s(3, 0.26)},
                "source_only": {1: s(1, 0.30), 2: s(2, 0.31), 3: s(3, 0.32)}}
    scores = {"in_distribution": by_split["source_only"], "source_only": by_split["source_only"],
              **{k: v for k, v in by_split.items() if k in present}}
    d = decide_over_splits(scores, champion=None, champion_external=None)
    assert d.external_split == split and d.champion_external.promote == promote


def test_held_out_twins_stand_for_their_version_only_where_every_style_scored_it():
    from pipelines.promotion.scores import pooled_twin_scores

    styles = {"held_out_style:a": {10: s(10, 0.20, n=30), 11: s(11, 0.30, n=30)},
              "held_out_style:b": {12: s(12, 0.40, n=10)}}
    pooled = pooled_twin_scores(styles, {10: 1, 11: 2, 12: 1, 99: 3})
    assert sorted(pooled) == [1]  # version 2's twin was not scored on style b
    assert pooled[1].n_pairs == 40 and pooled[1].brier == pytest.approx((0.2 * 30 + 0.4 * 10) / 40)
