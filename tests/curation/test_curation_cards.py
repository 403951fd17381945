"""A second card in the data: each card split on its own, the reference card's splits unchanged
pair for pair, and the cross-hardware settings (pipelines.surrogates.cross_hardware) on tiny data."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from pipelines.curation import build_pairs, find_leakage, labels, make_splits
from pipelines.curation.dataset import curate
from pipelines.curation.hardware import reference_hardware
from pipelines.curation.splits import SplitConfig
from pipelines.evaluation import card_study
from pipelines.surrogates import cross_hardware as ch

A, B = "nvidia-h200-sm90", "nvidia-h100-80gb-hbm3-sm90"
SPEEDUP_OF_BIN = {1: 0.2, 2: 0.4, 3: 0.6, 4: 0.9, 5: 1.2, 6: 1.7, 7: 3.0, 8: 5.0}


def meas(mid, kernel, speedup, hw, gen="kernelcast-space", parent=None, task="t"):
    return {"measurement_id": mid, "kernel_id": kernel, "task": task, "hardware_id": hw, "status": "ok",
            "failure_kind": None, "speedup": speedup, "generator": gen, "algorithm": "alg", "parent_kernel_id": parent,
            "mutation": None, "batch_id": "b", "measured_at": None, "protocol": "kernelcast"}


def two_cards(n_template: int = 48, rewrites_per: int = 2) -> pl.DataFrame:
    """Card A: a reference and template kernels of every bin, chains of parents. Card B: the same
    reference, rewrites of A's template kernels (an external generator) and a few of A's own
    kernels measured again (one bin up on B for every fourth)."""
    rows = [meas("ra", "ref", 1.0, A, gen="reference"), meas("rb", "ref", 1.0, B, gen="reference")]
    for i in range(n_template):
        b = i % 8 + 1
        parent = f"k{i - 8}" if i >= 8 else None
        rows.append(meas(f"a{i}", f"k{i}", SPEEDUP_OF_BIN[b], A, parent=parent))
        for j in range(rewrites_per):
            rb = (i + j) % 8 + 1
            rows.append(meas(f"b{i}-{j}", f"r{i}-{j}", SPEEDUP_OF_BIN[rb], B, gen="rewrite:unroll", parent=f"k{i}"))
        if i % 3 == 0:  # measured on both cards
            rows.append(meas(f"bb{i}", f"k{i}", SPEEDUP_OF_BIN[min(8, b + 1)] if i % 4 == 0 else SPEEDUP_OF_BIN[b], B,
                             parent=parent))
    return pl.DataFrame(rows)


def _splits(frame: pl.DataFrame):
    lab = labels(frame)
    pairs = build_pairs(lab, cross_per_task=30)
    lineage = frame.select("hardware_id", "kernel_id", "parent_kernel_id", "generator").unique(["hardware_id", "kernel_id"])
    return make_splits(pairs, lineage, SplitConfig(per_bin=2, seed=0)), lineage


def _keyed(frame: pl.DataFrame) -> list[tuple]:
    return sorted(frame.select("split", "pair_type", "anchor_kernel_id", "candidate_kernel_id", "true_bin").rows())


def test_a_second_card_leaves_the_first_cards_splits_pair_for_pair():
    both = two_cards()
    alone, _ = _splits(both.filter(pl.col("hardware_id") == A))
    together, lineage = _splits(both)
    on_a = together.all_pairs().filter(pl.col("hardware_id") == A)
    assert _keyed(on_a) == _keyed(alone.all_pairs())
    # B's rewrites are external on B and their lineage is blocked there, not in A's training pool:
    # had blocking spanned the cards, every A kernel with a rewrite would have left A's pool.
    assert alone.rl_training_pool.height > 0
    on_b = together.all_pairs().filter(pl.col("hardware_id") == B)
    assert on_b.filter(pl.col("split") == "train")["candidate_kernel_id"].str.starts_with("r").sum() == 0
    evals = pl.concat([together.eval_set, together.external_set], how="diagonal_relaxed")
    assert find_leakage(evals, together.rl_training_pool, lineage, lineage_k=1) == []


def test_leakage_is_found_within_a_card():
    both = two_cards()
    together, lineage = _splits(both)
    evals = pl.concat([together.eval_set, together.external_set], how="diagonal_relaxed")
    a_eval = together.eval_set.filter(pl.col("hardware_id") == A).row(0, named=True)
    leak = together.rl_training_pool.head(1).with_columns(
        pl.lit(A).alias("hardware_id"), pl.lit(a_eval["candidate_kernel_id"]).alias("candidate_kernel_id"),
        pl.lit("leaky").alias("pair_id"))
    assert find_leakage(evals, pl.concat([together.rl_training_pool, leak]), lineage, lineage_k=1) == ["leaky"]


def test_the_version_records_its_reference_card():
    both = two_cards()
    ds = curate(both, {"t": "ref"}, per_bin=2, lineage_k=1, holdout_tasks=(), cross_per_task=10, seed=0,
                preferred_hardware=A)
    assert ds.version.counts["reference_hardware"] == A
    other = curate(both, {"t": "ref"}, per_bin=2, lineage_k=1, holdout_tasks=(), cross_per_task=10, seed=0,
                   preferred_hardware="nvidia-a100-sm80")
    # not in the data: the card with the most eval pairs (B's rewrites are external, not eval)
    assert other.version.counts["reference_hardware"] == reference_hardware(other.splits.eval_set, None) == A
    assert ds.version.version == other.version.version  # the choice is not in the digest


# ---------------------------------------------------------------------------- cross-hardware settings

def _card(learned: set[str] = frozenset()):
    both = two_cards(n_template=96, rewrites_per=3)
    lab = labels(both)
    pairs = build_pairs(lab, cross_per_task=0)
    lineage = both.filter(pl.col("hardware_id") == B).select("kernel_id", "parent_kernel_id").unique("kernel_id")
    return ch.card_roles(pairs.filter(pl.col("hardware_id") == B), lineage, A, set(learned), per_bin=3, seed=0), lab


def test_card_roles_keep_learned_kernels_and_eval_lineages_out():
    learned = {"k0", "k3", "k6"}
    card, _ = _card(learned)
    ev, pool = card.eval, card.pool
    assert ev.height and pool.height
    assert not set(ev["candidate_kernel_id"]) & learned and card.learned_left_out == len(learned)
    assert not set(ev["pair_id"]) & set(pool["pair_id"])
    assert ev.group_by("true_bin").len()["len"].max() <= 3  # bin-balanced, per_bin 3
    # no pool candidate shares a parent with an eval candidate (k = 1: siblings)
    parent = dict(card.lineage.rows())
    eval_parents = {parent[c] for c in ev["candidate_kernel_id"] if c in parent}
    assert not {parent.get(c) for c in pool["candidate_kernel_id"]} & (eval_parents - {None})


def test_the_pool_order_is_bin_balanced_and_the_fitted_cut_keeps_lineages_apart():
    card, _ = _card()
    first = card.first(8)
    assert sorted(first["true_bin"].to_list()) == list(range(1, 9))  # one of every bin first
    fit, calibration = card.fit_and_calibration(40)
    assert calibration.height == 8 and fit.height <= 32
    assert not set(fit["pair_id"]) & set(calibration["pair_id"])
    parent = dict(card.lineage.rows())
    assert not {parent[c] for c in fit["candidate_kernel_id"]} & {parent[c] for c in calibration["candidate_kernel_id"]}
    assert card.sizes((10, 40, 10**6)) == [10, 40, None]


class _Constant:
    """An adapter answering the same distribution for every pair."""

    def __init__(self, p):
        self.p = np.asarray(p, dtype=float)

    def forecast_pairs(self, pairs, records):
        return np.tile(self.p, (pairs.height, 1))


def test_the_study_scores_every_setting_and_the_curve(tmp_path):
    card, lab = _card()
    sharp = _Constant([0.01] * 3 + [0.93] + [0.01] * 4)  # always bin 4, overconfident
    study = card_study.study_card(card, {"cost_model": card_study.Carried(sharp, "models:/m/1")}, {}, {}, card.pool,
                          sizes=(16,), kinds=(), n_boot=50)
    zero = study.settings["zero_shot"]
    y = card.eval["true_bin"].to_numpy()
    expected = float(np.mean(0.5 * ((sharp.p[None, :] - np.eye(8)[y - 1]) ** 2).sum(axis=1)))
    assert zero["cost_model"]["brier"] == pytest.approx(expected)
    assert zero["baseline:uniform"]["brier"] == pytest.approx(0.4375)
    lo, hi = zero["cost_model"]["brier_ci"]
    assert lo <= expected <= hi
    # recalibrated on the card's balanced pairs, the overconfident forecaster gets better
    assert study.settings["calibrated@16"]["cost_model"]["brier"] < expected
    assert set(study.settings) == {"zero_shot", "calibrated@16", "calibrated@all", "fitted@16", "fitted@all"}
    curve = {(r["setting"], r["n"]) for r in study.curve}
    assert {("zero_shot", 0), ("calibrated", 16), ("calibrated", None)} <= curve
    study.agreement = card_study.bin_agreement(lab, A, B)
    assert study.best("zero_shot") == ("cost_model", pytest.approx(expected))


def test_bin_agreement_counts_kernels_correct_on_both_cards():
    _, lab = _card()
    got = card_study.bin_agreement(lab, A, B)
    both_ids = {f"k{i}" for i in range(96) if i % 3 == 0}
    assert got["n"] == len(both_ids)
    overall = got["rows"][-1]
    moved = {f"k{i}" for i in range(96) if i % 3 == 0 and i % 4 == 0 and i % 8 + 1 < 8}  # a bin up on B
    assert overall["task"] == "all" and overall["same"] == pytest.approx(1 - len(moved) / len(both_ids))
    assert overall["within_one"] == 1.0 and overall["mean_shift"] == pytest.approx(len(moved) / len(both_ids))


def test_a_fit_does_not_depend_on_the_dataset_versions_pair_ids():
    """The same pairs under other pair ids (another dataset version: a second card's pairs came)
    give the same text model: fits take their pairs in (hardware, anchor, candidate) order."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "forecasting"))
    from test_forecasting_models import toy_pairs

    from models.classical.features import side_records
    from pipelines.surrogates.classical import fit_classical
    from pipelines.surrogates.roles import Roles

    frame, y, _ = toy_pairs(160, 0)
    anchors, cands = side_records(frame, "a"), side_records(frame, "c")
    records = {r["kernel_id"]: r for r in anchors + cands}
    base = pl.DataFrame({"hardware_id": [A] * len(y), "anchor_kernel_id": [a["kernel_id"] for a in anchors],
                         "candidate_kernel_id": [c["kernel_id"] for c in cands], "task": ["softmax"] * len(y),
                         "true_bin": y.tolist(), "speedup": [1.0] * len(y), "pair_type": ["reference"] * len(y)})
    predictions = []
    for version in ("ds-one", "ds-two"):
        ids = [f"{hash((version, i)) & 0xFFFFFFFF:08x}" for i in range(len(y))]  # another order by id
        pairs = base.with_columns(pl.Series("pair_id", ids))
        fit, cal = pairs.head(120).sort("pair_id"), pairs.tail(40).sort("pair_id")  # the same pairs, as a version reads them
        roles = Roles(fit, cal, cal, fit.head(0), fit.head(0), fit.head(0), None)
        model = fit_classical("text_model", roles, "in_distribution", records).model
        predictions.append(model.predict_proba(frame.head(20)))
    assert np.array_equal(predictions[0], predictions[1])
