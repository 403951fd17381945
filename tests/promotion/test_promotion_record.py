"""The promotion decision as data: the scores of every version on the common pairs, and the
record of a decision in DuckDB (migration 002)."""

from __future__ import annotations

import polars as pl
import pytest

from pipelines.promotion.rule import decide_promotion
from pipelines.promotion.scores import score_versions
from warehouse.db import connect
from warehouse.promotions import (
    read_promotion_decisions,
    read_promotion_scores,
    record_promotion_decision,
)

NAME = "kernelcast-surrogate"


def _rows(ref: str, pairs: list[tuple[str, int]], peak: float, wrong: bool = False) -> list[dict]:
    out = []
    for pid, y in pairs:
        target = (y % 8) + 1 if wrong else y
        p = [(1 - peak) / 7] * 8
        p[target - 1] = peak
        out.append({"pair_id": pid, "model_ref": ref, "repeat": 0, "parse_ok": True, "predicted_bin": target,
                    "task": "softmax", "speedup": 2.0 ** (y - 4.5) if y else 1.0, "split": "eval",
                    **{f"p{i + 1}": v for i, v in enumerate(p)}})
    return out


def _frame(pairs_a, pairs_b):
    """Uniform on every pair; version 1 (an LLM) on a subset, version 2 (a cost model) on all."""
    uniform = _rows("baseline:uniform", pairs_b, 1 / 8)
    return pl.DataFrame(uniform + _rows(f"models:/{NAME}/1", pairs_a, 0.6)
                        + _rows(f"models:/{NAME}/2", pairs_b, 0.3) + _rows(f"models:/{NAME}/3", pairs_b, 0.9, wrong=True)
                        + _rows(f"models:/{NAME}/4|verbalized", pairs_b, 0.9))


def _pairs(n):
    from models.bins import speedup_to_bin

    return [(f"p{i}", speedup_to_bin(2.0 ** ((i % 8) - 3.5))) for i in range(n)]


def test_every_version_is_scored_on_the_pairs_all_of_them_forecast():
    pairs = _pairs(16)
    frame = _frame(pairs[:6], pairs)
    scored = score_versions(frame, NAME, champion=1, kinds={1: "llm", 2: "cost_model", 3: "text_model"})
    assert scored.pairs == sorted(p for p, _ in pairs[:6])  # the LLM's subset bounds the comparison
    assert scored.champion.version == 1 and [c.version for c in scored.challengers] == [2, 3]  # 4|verbalized: not a version ref
    assert {c.n_pairs for c in scored.challengers} == {6} and all(c.champion_brier == scored.champion.brier
                                                                   for c in scored.challengers)
    assert [c.kind for c in scored.challengers] == ["cost_model", "text_model"]
    d = decide_promotion(scored.challengers, champion=1)
    # 3 puts 0.9 on a wrong bin: worse than uniform, held back; 2 is eligible but worse than 1.
    assert d.failures[3] == ["brier_not_worse_than_uniform"] and d.failures[2] == [] and d.outcome == "kept"


def test_invalid_distributions_are_named_not_scored():
    pairs = _pairs(8)
    frame = _frame(pairs, pairs).with_columns(
        pl.when(pl.col("model_ref") == f"models:/{NAME}/2").then(3.0).otherwise(pl.col("p1")).alias("p1"))
    scored = score_versions(frame, NAME, champion=None)
    assert list(scored.errors) == [2] and [c.version for c in scored.challengers] == [1, 3]


def test_a_decision_and_its_scores_are_recorded(tmp_path):
    con = connect(tmp_path / "w.duckdb")
    did = record_promotion_decision(
        con, NAME, "ds-1", "held_back", "no challenger passes the gates", 12, {"parse_rate_floor": 0.8},
        [{"model_version": 2, "kind": "llm", "role": "challenger", "n_pairs": 12, "parse_rate": 1.0,
          "brier": 0.51, "uniform_brier": 0.4375, "failed_gates": ["brier_not_worse_than_uniform"]},
         {"model_version": 1, "kind": "llm", "role": "champion", "n_pairs": 12, "parse_rate": 1.0,
          "brier": float("nan"), "uniform_brier": 0.4375, "failed_gates": []}],
        champion_before=1, champion_after=1, dagster_run_id="run-1")
    [row] = read_promotion_decisions(con, NAME).to_dicts()
    assert (row["decision_id"], row["outcome"], row["champion_after"], row["candidate"]) == (did, "held_back", "1", None)
    scores = read_promotion_scores(con, did)
    assert scores["model_version"].to_list() == ["1", "2"] and scores["brier"].to_list()[0] is None
    assert scores["failed_gates"].to_list()[1] == ["brier_not_worse_than_uniform"]
    with pytest.raises(ValueError, match="outcome must be one of"):
        record_promotion_decision(con, NAME, None, "maybe", "x", 0, {}, [])
    assert read_promotion_decisions(con).height == 1  # nothing half-written
    con.close()
