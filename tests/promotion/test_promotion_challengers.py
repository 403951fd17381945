"""@challenger beside @champion and @challenger-external beside @champion-external: chosen by
the rule, moved in the registry as a pair, and both decisions recorded in DuckDB (migration 006)."""

from __future__ import annotations

import pytest

from pipelines.promotion.rule import ChallengerScores, decide_over_splits
from warehouse.db import connect
from warehouse.promotions import read_promotion_decisions, record_promotion_decision

ID, SO, EXT = "in_distribution", "source_only", "external"


def s(v: int, brier: float, parse_rate: float = 1.0) -> ChallengerScores:
    return ChallengerScores(v, 24, parse_rate, brier, 0.4375)


def test_the_challenger_is_the_best_eligible_version_that_is_not_the_new_champion():
    # 3 beats champion 1 everywhere: it becomes champion, and the old champion (next best) the challenger;
    # 4 is better than 1 but fails the parse floor, 5 is worse than uniform.
    scores = {ID: {1: s(1, 0.30), 2: s(2, 0.35), 3: s(3, 0.20), 4: s(4, 0.10, parse_rate=0.5), 5: s(5, 0.50)},
              SO: {1: s(1, 0.40), 3: s(3, 0.30)}}
    d = decide_over_splits(scores, champion=1, champion_external=None)
    assert d.champion.promote == 3 and d.champion_after == 3 and d.challenger == 1
    # @champion-external decided on source_only (external empty): 3 first, 1 beside it
    assert d.external_split == SO and d.champion_external_after == 3 and d.challenger_external == 1


def test_external_pair_follows_the_external_split_and_no_eligible_other_version_clears_it():
    scores = {ID: {1: s(1, 0.30)}, SO: {1: s(1, 0.30)}, EXT: {1: s(1, 0.25), 2: s(2, 0.20)}}
    d = decide_over_splits(scores, champion=1, champion_external=1)
    assert d.champion.outcome == "no_candidates" and d.champion_after == 1 and d.challenger is None
    assert d.external_split == EXT and d.champion_external.promote == 2 and d.challenger_external == 1
    # nothing passes the gates: the champion stays, no challenger (never the champion itself)
    d = decide_over_splits({ID: {1: s(1, 0.30), 2: s(2, 0.60)}}, champion=1, champion_external=None)
    assert d.champion.outcome == "held_back" and d.challenger is None


def test_both_decisions_are_recorded_and_read_per_alias(tmp_path):
    con = connect(tmp_path / "w.duckdb")
    row = {"model_version": 2, "kind": "cost_model", "role": "challenger", "n_pairs": 24, "parse_rate": 1.0,
           "brier": 0.25, "uniform_brier": 0.4375, "failed_gates": []}
    a = record_promotion_decision(con, "m", "ds-1", "promoted", "r", 24, {}, [row], champion_after=2,
                                  dagster_run_id="run-1", challenger_after=1)
    b = record_promotion_decision(con, "m", "ds-1", "kept", "external: r", 9, {}, [row], champion_before=2,
                                  champion_after=2, dagster_run_id="run-1", alias="champion-external",
                                  split="external", challenger_after=None)
    assert a != b
    [champ] = read_promotion_decisions(con, "m").to_dicts()  # the @champion decisions, as before
    assert (champ["decision_id"], champ["alias"], champ["decided_on_split"], champ["challenger_after"]) == \
        (a, "champion", "in_distribution", "1")
    [ext] = read_promotion_decisions(con, "m", alias="champion-external").to_dicts()
    assert (ext["decision_id"], ext["decided_on_split"], ext["n_pairs"], ext["challenger_after"]) == \
        (b, "external", 9, None)
    assert read_promotion_decisions(con, alias=None).height == 2
    with pytest.raises(ValueError, match="alias must be one of"):
        record_promotion_decision(con, "m", None, "kept", "x", 0, {}, [], alias="challenger")
    con.close()


def test_set_aliases_moves_the_external_pair_and_clears_a_challenger_on_request(tmp_path):
    from mlflow import MlflowClient

    from models.registry.versions import aliases, set_aliases

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    client.create_registered_model("pair-check")
    for _ in range(3):
        client.create_model_version("pair-check", source=(tmp_path / "m").as_uri())
    pair = set_aliases(uri, 2, 3, "pair-check", use="champion-external")
    assert pair == {"champion-external": 2, "challenger-external": 3}
    assert set_aliases(uri, None, None, "pair-check", use="champion-external") == pair  # left as it is
    assert set_aliases(uri, None, None, "pair-check", use="champion-external", clear_challenger=True) == \
        {"champion-external": 2, "challenger-external": None}
    assert aliases(uri, "pair-check") == {"champion": None, "challenger": None, "champion-external": 2,
                                          "challenger-external": None}
    with pytest.raises(ValueError, match="use must be one of"):
        set_aliases(uri, 1, None, "pair-check", use="challenger")
