"""Curation: labels, pairs, splits (bin balance, leakage), dataset versions, summary."""


import polars as pl
import pytest

from models.bins import speedup_to_bin
from pipelines.curation import (
    SplitConfig,
    build_pairs,
    dataset_summary,
    dataset_version,
    find_leakage,
    labels,
    make_splits,
    pair_id,
    select_eval_candidates,
    summary_markdown,
)


def meas(mid, kernel, status="ok", speedup=None, task="t", hw="h", gen="kernelcast-space", parent=None,
         protocol="kernelcast", kind=None):
    return {
        "measurement_id": mid, "kernel_id": kernel, "task": task, "hardware_id": hw, "status": status,
        "failure_kind": kind, "speedup": speedup, "generator": gen, "algorithm": "alg",
        "parent_kernel_id": parent, "mutation": None, "batch_id": "b", "measured_at": None,
        "protocol": protocol,
    }


@pytest.fixture
def small():
    return pl.DataFrame([
        meas("m0", "ref", speedup=1.03, gen="reference"),
        meas("m1", "a", speedup=2.0), meas("m2", "a", speedup=8.0),  # geomean 4
        meas("m3", "b", speedup=1.5, parent="a"),
        meas("m4", "c", status="failed", kind="incorrect", parent="a"), meas("m5", "c", speedup=3.0, parent="a"),
        meas("m6", "d", speedup=0.3, parent="b"),
        meas("m7", "e", speedup=9.0, protocol="paper"),
    ])


def test_labels_correct_only_if_all_ok_and_geomean(small):
    lab = {r["kernel_id"]: r for r in labels(small).iter_rows(named=True)}
    assert set(lab) == {"ref", "a", "b", "c", "d"}  # 'paper' protocol left out
    assert lab["a"]["speedup"] == pytest.approx(4.0) and lab["a"]["measurement_ids"] == ["m1", "m2"]
    assert lab["c"]["correct"] is False and lab["c"]["speedup"] is None
    assert lab["c"]["failure_kinds"] == ["incorrect"]
    assert lab["ref"]["speedup"] == 1.0  # by definition, not the measured 1.03


def test_pairs_types_and_speedups(small):
    pairs = build_pairs(labels(small), cross_per_task=100)
    ref = {r["candidate_kernel_id"]: r for r in pairs.filter(pl.col("pair_type") == "reference").iter_rows(named=True)}
    assert set(ref) == {"a", "b", "d"}
    assert ref["a"]["anchor_kernel_id"] == "ref" and ref["a"]["speedup"] == pytest.approx(4.0)
    assert ref["a"]["true_bin"] == 7 and ref["a"]["pair_id"] == pair_id("h", "ref", "a")
    assert ref["a"]["measurement_ids"] == ["m0", "m1", "m2"]
    par = {(r["anchor_kernel_id"], r["candidate_kernel_id"]): r["speedup"]
           for r in pairs.filter(pl.col("pair_type") == "parent").iter_rows(named=True)}
    assert par == {("a", "b"): pytest.approx(1.5 / 4), ("b", "d"): pytest.approx(0.2)}  # c failed
    cross = pairs.filter(pl.col("pair_type") == "cross")
    assert cross.height == 6 - 2  # all ordered pairs of {a, b, d} except the parent pairs
    assert pairs["pair_id"].n_unique() == pairs.height


def test_synthetic_reference_and_deterministic_cross():
    ms = pl.DataFrame([meas(f"m{i}", f"k{i:02d}", speedup=0.5 + i / 10) for i in range(30)])
    p1 = build_pairs(labels(ms), cross_per_task=25, seed=1)
    p2 = build_pairs(labels(ms.reverse()), cross_per_task=25, seed=1)
    assert p1.equals(p2)
    assert set(p1.filter(pl.col("pair_type") == "reference")["anchor_kernel_id"]) == {"reference:t"}
    assert p1.filter(pl.col("pair_type") == "cross").height == 25


def _bin_pool(per_bin_counts, task="t"):
    """Reference pairs with the given number of candidates per bin."""
    values = {1: 0.2, 2: 0.4, 3: 0.6, 4: 0.9, 5: 1.2, 6: 1.7, 7: 3.0, 8: 5.0}
    rows = []
    for b, n in per_bin_counts.items():
        for i in range(n):
            k = f"{task}-b{b}-{i}"
            rows.append(meas(f"m-{k}", k, speedup=values[b], task=task))
    return pl.DataFrame(rows)


def test_bin_balanced_eval_selection_and_shortfall():
    ms = _bin_pool({1: 5, 2: 1, 5: 9, 8: 3})
    ref = build_pairs(labels(ms), cross_per_task=0)
    chosen, short = select_eval_candidates(ref, per_bin=3, seed=0)
    counts = dict(chosen.group_by("true_bin").len().rows())
    assert counts == {1: 3, 2: 1, 5: 3, 8: 3}
    sf = {r["bin"]: r["shortfall"] for r in short.iter_rows(named=True)}
    assert sf == {1: 0, 2: 2, 3: 3, 4: 3, 5: 0, 6: 3, 7: 3, 8: 0}
    again, _ = select_eval_candidates(ref.reverse(), per_bin=3, seed=0)
    assert set(again["pair_id"]) == set(chosen["pair_id"])  # row order does not matter


def _lineage_data():
    """Family: root r -> (x, y); x -> x1; unrelated u, v. All correct, various bins."""
    return pl.DataFrame([
        meas("m0", "ref", speedup=1.0, gen="reference"),
        meas("m1", "r", speedup=1.2), meas("m2", "x", speedup=1.3, parent="r"),
        meas("m3", "y", speedup=1.25, parent="r"), meas("m4", "x1", speedup=0.3, parent="x"),
        meas("m5", "u", speedup=3.0), meas("m6", "v", speedup=0.6),
        meas("m7", "g", speedup=5.0, parent="x1"),
    ])


def test_splits_have_no_leakage_and_block_lineage():
    lab = labels(_lineage_data())
    pairs = build_pairs(lab, cross_per_task=1000)
    # per_bin=1: one eval candidate per populated bin.
    s = make_splits(pairs, lab, SplitConfig(per_bin=1, lineage_k=1))
    eval_c = set(s.eval_set["candidate_kernel_id"])
    assert find_leakage(s.eval_set, s.rl_training_pool, lab) == []
    train_k = set(s.rl_training_pool["candidate_kernel_id"]) | set(s.rl_training_pool["anchor_kernel_id"])
    assert not (train_k & s.blocked_kernel_ids)
    assert eval_c <= s.blocked_kernel_ids and "ref" not in s.blocked_kernel_ids
    assert set(s.all_pairs()["split"]) <= {"eval", "train", "discovery"}
    assert "leak_free" in s.discovery_pairs.columns


def test_lineage_neighbourhood_k1_is_parent_children_siblings():
    lab = labels(_lineage_data())
    pairs = build_pairs(lab, cross_per_task=1000)
    # Force x as the only eval candidate: per_bin large, but keep only the bin-5 cell with x.
    ev = pairs.filter((pl.col("pair_type") == "reference") & (pl.col("candidate_kernel_id") == "x"))
    from pipelines.curation.splits import lineage_map, lineage_neighbourhood
    blocked = lineage_neighbourhood(["x"], lineage_map(lab, ["ref"]), 1)
    assert blocked == {"x", "r", "y", "x1"}  # g (grandchild) and u, v stay available
    assert lineage_neighbourhood(["x"], lineage_map(lab, ["ref"]), 2) >= {"g"}
    train = pairs.filter(pl.col("pair_type") == "cross")
    leaks = find_leakage(ev, train, lab)
    expected = train.filter(pl.col("candidate_kernel_id").is_in(list(blocked)) | pl.col("anchor_kernel_id").is_in(list(blocked)))
    assert leaks == sorted(expected["pair_id"].to_list()) and leaks


def test_leakage_check_catches_a_planted_leak():
    lab = labels(_lineage_data())
    pairs = build_pairs(lab, cross_per_task=1000)
    s = make_splits(pairs, lab, SplitConfig(per_bin=1))
    planted = s.eval_set.head(1)
    leaky = pl.concat([s.rl_training_pool, planted.with_columns(pl.lit("train").alias("split"))])
    assert find_leakage(s.eval_set, leaky, lab) == planted["pair_id"].to_list()


def test_holdout_task_never_trains():
    ms = pl.concat([_bin_pool({5: 4, 6: 4}, task="keep"), _bin_pool({5: 4, 6: 4}, task="gdn_chunk_fwd_o")])
    lab = labels(ms)
    s = make_splits(build_pairs(lab), lab, SplitConfig(per_bin=1, holdout_tasks=("gdn_chunk_fwd_o",)))
    assert "gdn_chunk_fwd_o" not in set(s.rl_training_pool["task"])
    assert "gdn_chunk_fwd_o" in set(s.eval_set["task"])
    assert find_leakage(s.eval_set, s.rl_training_pool, lab, holdout_tasks=("gdn_chunk_fwd_o",)) == []


def test_dataset_version_stable_under_row_order_and_sensitive_to_content(small):
    pairs = build_pairs(labels(small))
    mids = small["measurement_id"].to_list()
    v1 = dataset_version(pairs, mids)
    v2 = dataset_version(pairs.reverse().select(list(reversed(pairs.columns))), list(reversed(mids)))
    assert v1.digest == v2.digest and v1.version == "ds-" + v1.digest[:12]
    bumped = pairs.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(pl.col("speedup") * 1.0000001)
                                .otherwise(pl.col("speedup")).alias("speedup"))
    assert dataset_version(bumped, mids).digest != v1.digest
    assert dataset_version(pairs, mids[:-1]).digest != v1.digest
    assert v1.counts["n_pairs"] == pairs.height and v1.counts["n_measurements"] == len(mids)


def test_dataset_summary_counts_and_markdown(small):
    s = dataset_summary(small)
    assert s["n_measurements"] == 8 and s["by_status"] == {"failed": 1, "ok": 7}
    assert s["by_failure_kind"] == {"incorrect": 1}
    assert s["by_protocol"] == {"kernelcast": 7, "paper": 1}
    assert s["by_task"]["t"]["correct_kernels"] == 4  # ref, a, b, d
    # correct candidates vs reference: a=4 (bin 7), b=1.5 (bin 6), d=0.3 (bin 2)
    assert {k: v for k, v in s["by_bin"].items() if v} == {"2": 1, "6": 1, "7": 1}
    assert speedup_to_bin(4.0) == 7
    md = summary_markdown(s)
    assert md.startswith("| task |") and "| **all** |" in md and "incorrect" in md
