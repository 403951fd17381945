"""`apply_promotion` without Dagster on a warehouse written by hand (as the forecasts asset would):
a real DuckDB file, a real sqlite MLflow store and registry."""

from __future__ import annotations

import polars as pl
import pytest

from models.bins import BIN_LOG2_VALUES, speedup_to_bin
from models.registry import SURROGATE_MODEL as MODEL_NAME
from pipelines.promotion.apply import (
    ForecastListingError,
    apply_promotion,
    forecast_errors,
)
from pipelines.promotion.rule import PromotionPolicy
from warehouse.datasets import write_dataset
from warehouse.db import connect
from warehouse.forecasts import write_forecast_listing, write_forecasts
from warehouse.promotions import read_promotion_decisions


def _peaked(y: int, peak: float) -> list[float]:
    p = [(1 - peak) / 7] * 8
    p[y - 1] = peak
    return p


def _warehouse(db, versions: list[int], listed: bool = True) -> None:
    """32 eval pairs; version i forecasts them peaked at 0.5 + 0.2 i in distribution and
    0.4 - 0.2 i from source alone (the later the version, the better in, the worse out)."""
    pairs = pl.DataFrame([{"pair_id": f"p{i:02d}", "task": "softmax", "hardware_id": "h", "anchor_kernel_id": "ref",
                           "candidate_kernel_id": f"k{i}", "speedup": 2.0 ** ((i % 8) - 3.5),
                           "true_bin": speedup_to_bin(2.0 ** ((i % 8) - 3.5)), "pair_type": "reference",
                           "split": "eval"} for i in range(32)])
    refs = [("baseline:uniform", lambda y: [1 / 8] * 8)]
    for i, v in enumerate(versions):
        refs += [(f"models:/{MODEL_NAME}/{v}", lambda y, i=i: _peaked(y, 0.5 + 0.2 * i)),
                 (f"models:/{MODEL_NAME}/{v}|source_only", lambda y, i=i: _peaked(y, 0.4 - 0.2 * i))]
    rows = [{"pair_id": pid, "model_ref": ref, "parse_ok": True, "predicted_bin": y, "p": p(y), "raw_sum": 1.0}
            for pid, y in pairs.select("pair_id", "true_bin").rows() for ref, p in refs]
    ids = pairs["pair_id"].to_list()
    with connect(db) as con:
        write_dataset(con, "ds-t", "d", {}, [], pairs)
        write_forecasts(con, pl.DataFrame(rows))
        if listed:
            write_forecast_listing(con, "ds-t", {
                "held_out_task": None,
                "pairs": {"in_distribution": ids, "source_only": ids, "held_out_task": [], "external": []},
                "empty": {"held_out_task": "no held-out task", "external": "no kernel outside the templates"},
                "forecasters": [{"model_ref": "baseline:uniform", "kind": "baseline", "split": s, "source": "reference",
                                 "run_id": ""} for s in ("in_distribution", "source_only")]})


def _register(uri: str, n: int) -> list[int]:
    import mlflow

    from models.registry.tracking import prepare_store
    from models.registry.versions import register_logged_model

    (experiment,) = prepare_store(uri, ["kernelcast-training"])
    mlflow.set_tracking_uri(uri)
    return [register_logged_model(uri, f"models:/{mlflow.create_external_model(name=f'm{i}', experiment_id=experiment).model_id}",
                                  MODEL_NAME, kind="cost_model") for i in range(n)]


def test_both_aliases_move_and_both_decisions_are_recorded(tmp_path):
    from models.registry.versions import aliases, find_versions

    db, uri = tmp_path / "warehouse.duckdb", f"sqlite:///{tmp_path / 'mlflow.db'}"
    v1, v2 = _register(uri, 2)
    _warehouse(db, [v1, v2])
    assert forecast_errors(db) == {}
    p = apply_promotion(db, uri, PromotionPolicy(), "dagster-run-1")
    assert p.dataset_version == "ds-t" and p.champion_before is None and len(p.scored.pairs) == 32
    assert p.splits.champion.promote == v2 and p.splits.champion_after == v2  # better in distribution
    assert p.splits.external_split == "source_only" and p.splits.champion_external_after == v1  # better from source
    assert p.parse_ok == p.eligible == [v1, v2]
    got = aliases(uri, MODEL_NAME)
    assert got["champion"] == v2 and got["champion-external"] == v1
    with connect(db, read_only=True) as con:
        decisions = read_promotion_decisions(con, MODEL_NAME, alias=None)
    assert set(decisions["decision_id"]) == {p.decision_id, p.external_decision_id}
    assert set(decisions["dagster_run_id"]) == {"dagster-run-1"}
    tags = {v["version"]: v["tags"] for v in find_versions(uri, MODEL_NAME)}
    assert tags[v2]["promotion_status"] == "promoted" and tags[v1]["promotion_decision_id"] == p.decision_id


def test_a_missing_listing_is_refused(tmp_path):
    db, uri = tmp_path / "warehouse.duckdb", f"sqlite:///{tmp_path / 'mlflow.db'}"
    (v1,) = _register(uri, 1)
    _warehouse(db, [v1], listed=False)
    with pytest.raises(ForecastListingError, match="no forecaster listing"):
        apply_promotion(db, uri, PromotionPolicy(), None)


def test_a_version_holding_only_committed_forecasts_is_never_promoted(tmp_path):
    """The better version in distribution (v2) holds only committed forecasts: it fails the gate
    `forecasts_new_pairs`, so v1 becomes champion and v2 names no alias."""
    from models.registry.versions import (
        COMMITTED_ONLY,
        WEIGHTS_TAG,
        aliases,
        find_versions,
        set_version_tag,
    )
    from pipelines.promotion.rule import GATE_FORECASTS

    db, uri = tmp_path / "warehouse.duckdb", f"sqlite:///{tmp_path / 'mlflow.db'}"
    v1, v2 = _register(uri, 2)
    set_version_tag(uri, v2, WEIGHTS_TAG, COMMITTED_ONLY, MODEL_NAME)
    _warehouse(db, [v1, v2])
    p = apply_promotion(db, uri, PromotionPolicy(), "dagster-run-2")
    assert p.splits.champion.failures[v2] == [GATE_FORECASTS] and p.splits.champion.failures[v1] == []
    assert p.splits.champion.promote == v1 and p.eligible == [v1]
    got = aliases(uri, MODEL_NAME)
    assert got["champion"] == got["champion-external"] == v1
    assert v2 not in got.values()
    tags = {v["version"]: v["tags"] for v in find_versions(uri, MODEL_NAME)}
    assert tags[v2]["promotion_status"] == f"held back: {GATE_FORECASTS}"


def test_the_file_champion_is_decided_on_the_library_rows_beside_the_report(tmp_path):
    """The library split's forecasts live beside the version's report, not in the warehouse: given
    the reports folder, @champion-external is decided there (v2 is better on the published kernels
    though v1 is better from source alone)."""
    from models.registry.versions import aliases
    from pipelines.forecasting.plan import LIBRARY_DIR_ROWS

    db, uri = tmp_path / "warehouse.duckdb", f"sqlite:///{tmp_path / 'mlflow.db'}"
    v1, v2 = _register(uri, 2)
    _warehouse(db, [v1, v2])
    rows = []
    for i in range(12):
        y = 1 + i % 8
        for ref, p in (("baseline:uniform", [1 / 8] * 8), (f"models:/{MODEL_NAME}/{v1}", _peaked(y, 0.3)),
                       (f"models:/{MODEL_NAME}/{v2}", _peaked(y, 0.9))):
            rows.append({"pair_id": f"library:{i}", "model_ref": ref, "repeat": 0, "predicted_bin": y, "argmax_bin": y,
                         "raw_sum": 1.0, "parse_ok": True, "parse_error": None,
                         **{f"p{b + 1}": p[b] for b in range(8)}, "task": "softmax", "hardware_id": "h",
                         "anchor_kernel_id": "ref", "candidate_kernel_id": f"lib{i}",
                         "speedup": 2.0 ** BIN_LOG2_VALUES[y - 1], "true_bin": y,
                         "pair_type": "reference", "split": "library"})
    (tmp_path / "reports" / "ds-t").mkdir(parents=True)
    pl.DataFrame(rows).write_parquet(tmp_path / "reports" / "ds-t" / LIBRARY_DIR_ROWS)
    p = apply_promotion(db, uri, PromotionPolicy(), "dagster-run-3", tmp_path / "reports")
    assert p.splits.external_split == "library" and p.splits.champion_external_after == v2
    assert aliases(uri, MODEL_NAME)["champion-external"] == v2
    assert len(p.by_split.pairs["library"]) == 12 and p.by_split.scores["library"][v2].kind == "cost_model"


def test_a_held_out_splits_uniform_reference_is_found_under_its_suffixed_name():
    from pipelines.promotion.scores import score_versions

    rows = []
    for i in range(8):
        for ref, p in (("baseline:uniform|held_out_style:s", [1 / 8] * 8), (f"models:/{MODEL_NAME}-held-out/4", _peaked(i + 1, 0.8))):
            rows.append({"pair_id": f"q{i}", "model_ref": ref, "parse_ok": True, "predicted_bin": i + 1, "true_bin": i + 1,
                         "task": "softmax", "speedup": 2.0 ** BIN_LOG2_VALUES[i], "raw_sum": 1.0, "repeat": 0,
                         **{f"p{b + 1}": p[b] for b in range(8)}})
    scored = score_versions(pl.DataFrame(rows), f"{MODEL_NAME}-held-out", None)
    (only,) = scored.challengers
    assert only.n_pairs == 8 and only.uniform_brier == pytest.approx(0.4375) and only.brier < 0.1


def test_an_unreadable_library_rows_file_is_one_line_not_a_crash(tmp_path):
    from pipelines.forecasting.plan import LIBRARY_DIR_ROWS

    db, uri = tmp_path / "warehouse.duckdb", f"sqlite:///{tmp_path / 'mlflow.db'}"
    (v1,) = _register(uri, 1)
    _warehouse(db, [v1])
    (tmp_path / "reports" / "ds-t").mkdir(parents=True)
    (tmp_path / "reports" / "ds-t" / LIBRARY_DIR_ROWS).write_bytes(b"not parquet")
    with pytest.raises(ForecastListingError, match="library split forecasts .* unreadable"):
        apply_promotion(db, uri, PromotionPolicy(), None, tmp_path / "reports")
