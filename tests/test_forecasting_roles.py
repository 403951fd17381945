"""Roles of a dataset version's pairs: calibration never sees eval pairs or eval lineages, the
held-out task never enters fit or calibration, and ties in the utility metric are expectations."""

from __future__ import annotations

import numpy as np
import polars as pl

from pipelines.curation.splits import lineage_map, lineage_neighbourhood, make_splits
from pipelines.evaluation.utility import random_recovered_curve, tied_recovered_curve
from pipelines.training.roles import forecasting_roles


def _toy_dataset(seed: int = 0):
    """Reference pairs of lineage chains over two tasks, every bin populated."""
    rng = np.random.default_rng(seed)
    rows, lineage = [], []
    for task in ("softmax", "gdn_chunk_fwd_o"):
        ref = f"ref-{task}"
        for chain in range(30):
            parent = None
            for depth in range(4):
                kid = f"{task}-{chain}-{depth}"
                lineage.append({"kernel_id": kid, "parent_kernel_id": parent})
                s = float(2.0 ** rng.uniform(-3, 3))
                from models.bins import speedup_to_bin

                rows.append({"pair_id": f"p-{kid}", "task": task, "hardware_id": "h", "anchor_kernel_id": ref,
                             "candidate_kernel_id": kid, "speedup": s, "true_bin": speedup_to_bin(s),
                             "pair_type": "reference"})
                parent = kid
    return pl.DataFrame(rows), pl.DataFrame(lineage, schema={"kernel_id": pl.Utf8, "parent_kernel_id": pl.Utf8})


def test_calibration_split_never_holds_eval_pairs_or_eval_lineages():
    pairs, lineage = _toy_dataset()
    splits = make_splits(pairs, lineage)
    roles = forecasting_roles(splits.rl_training_pool, splits.eval_set, lineage, held_out_task="gdn_chunk_fwd_o",
                              calibration_per_bin=2)
    eval_ids = set(roles.eval["pair_id"].to_list())
    parent_of = lineage_map(lineage, {"ref-softmax", "ref-gdn_chunk_fwd_o"})
    near_eval = lineage_neighbourhood(roles.eval["candidate_kernel_id"].to_list(), parent_of, 1)
    for name in ("calibration", "fit", "held_out_calibration", "held_out_fit"):
        frame = getattr(roles, name)
        assert frame.height > 0, name
        assert not eval_ids & set(frame["pair_id"].to_list()), name
        assert not near_eval & set(frame["candidate_kernel_id"].to_list()), name
    # calibration and fit are disjoint, and fit keeps out the calibration lineages
    near_cal = lineage_neighbourhood(roles.calibration["candidate_kernel_id"].to_list(), parent_of, 1)
    assert not near_cal & set(roles.fit["candidate_kernel_id"].to_list())
    # the held-out task is nowhere in held-out training, and all of its reference pairs are scored
    assert set(roles.held_out_fit["task"].to_list()) == {"softmax"}
    assert set(roles.held_out_calibration["task"].to_list()) == {"softmax"}
    assert set(roles.held_out_eval["task"].to_list()) == {"gdn_chunk_fwd_o"}
    train_gdn = splits.rl_training_pool.filter(pl.col("task") == "gdn_chunk_fwd_o")["pair_id"].to_list()
    assert set(train_gdn) <= set(roles.held_out_eval["pair_id"].to_list())


def test_a_constant_forecaster_scores_exactly_the_random_expectation():
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 64, 301):
        s = rng.lognormal(0, 1, n)
        tied = tied_recovered_curve(s, np.full(n, 0.25), np.ones(n, bool))
        assert np.allclose(tied, random_recovered_curve(s), atol=1e-12)


def test_the_bin_oracle_gets_its_within_bin_expectation_not_the_id_order():
    # two in the top bin (4.5 and 9.0), one lower: with k = 1 the oracle draws one of the two
    s = np.array([9.0, 4.5, 1.0])
    score = np.array([2.5, 2.5, 0.25])
    assert tied_recovered_curve(s, score, np.ones(3, bool), np.array([1]))[0] == 0.75
    # a failure is measured last even with the best score
    ok = np.array([False, True, True])
    assert tied_recovered_curve(s, score, ok, np.array([1]))[0] == 0.5
