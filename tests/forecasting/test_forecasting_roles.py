"""Roles of a dataset version's pairs: calibration never sees eval pairs or eval lineages, the
held-out task never enters fit or calibration, and ties in the utility metric are expectations."""

from __future__ import annotations

import numpy as np
import polars as pl

from pipelines.curation.splits import lineage_map, lineage_neighbourhood, make_splits
from pipelines.evaluation.utility import random_recovered_curve, tied_recovered_curve
from pipelines.surrogates.roles import forecasting_roles


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


# ---- the external split: kernels the template generator did not write ------------------------
def _with_external(seed: int = 0):
    """The toy dataset plus non-template kernels: rewrites of template kernels (children of a
    template chain, with their own children), hand-written ones without a parent, an LLM-written
    chain; every kernel carries its generator."""
    from models.bins import speedup_to_bin

    pairs, lineage = _toy_dataset(seed)
    rng = np.random.default_rng(seed + 1)
    lineage = lineage.with_columns(pl.lit("kernelcast-space").alias("generator"))
    rows, extra = [], []
    for task in ("softmax", "gdn_chunk_fwd_o"):
        made = [(f"rw-{task}-{c}", f"{task}-{c}-1", "rewrite:unroll") for c in range(3)]
        made += [(f"rw-{task}-{c}-child", f"rw-{task}-{c}", "kernelcast-space") for c in range(3)]  # derived from a rewrite
        made += [(f"hand-{task}-{i}", None, "handwritten:dev") for i in range(2)]
        made += [(f"llm-{task}-0", f"{task}-5-2", "llm:SmolLM2-135M"), (f"llm-{task}-1", f"llm-{task}-0", "llm:SmolLM2-135M")]
        for kid, parent, gen in made:
            extra.append({"kernel_id": kid, "parent_kernel_id": parent, "generator": gen})
            s = float(2.0 ** rng.uniform(-3, 3))
            rows.append({"pair_id": f"p-{kid}", "task": task, "hardware_id": "h", "anchor_kernel_id": f"ref-{task}",
                         "candidate_kernel_id": kid, "speedup": s, "true_bin": speedup_to_bin(s), "pair_type": "reference"})
        extra.append({"kernel_id": f"ref-{task}", "parent_kernel_id": None, "generator": "reference"})
    return pl.concat([pairs, pl.DataFrame(rows)]), pl.concat([lineage, pl.DataFrame(extra, schema=lineage.schema)])


def _external_family(lineage: pl.DataFrame) -> set[str]:
    """External kernels, their ancestors up to the reference and every descendant, computed
    independently of pipelines.curation.splits from the lineage rows."""
    parent = {k: p for k, p in lineage.select("kernel_id", "parent_kernel_id").rows() if p and not p.startswith("ref-")}
    gen = dict(lineage.select("kernel_id", "generator").rows())
    family = {k for k, g in gen.items() if g not in ("kernelcast-space", "reference")}
    for k in list(family):
        while k in parent:
            k = parent[k]
            family.add(k)
    grew = True
    while grew:
        kids = {c for c, p in parent.items() if p in family and c not in family and gen.get(p) != "kernelcast-space"}
        kids |= {c for c, p in parent.items() if p in {k for k, g in gen.items() if g not in ("kernelcast-space", "reference")}}
        grew = bool(kids - family)
        family |= kids
    return family


def test_external_kernels_and_their_lineage_never_enter_fit_or_calibration():
    from pipelines.curation.splits import find_leakage

    pairs, lineage = _with_external()
    splits = make_splits(pairs, lineage)
    external = {k for k, g in lineage.select("kernel_id", "generator").rows() if g not in ("kernelcast-space", "reference")}
    # none of them is an in-distribution eval candidate; every one is in the external set
    assert not external & set(splits.eval_set["candidate_kernel_id"].to_list())
    assert set(splits.external_set["candidate_kernel_id"].to_list()) == external
    family = _external_family(lineage)
    assert {"softmax-0-1", "softmax-0-0", "softmax-5-2", "softmax-5-1", "rw-softmax-0-child"} <= family
    train = set(splits.rl_training_pool["candidate_kernel_id"].to_list()) | set(splits.rl_training_pool["anchor_kernel_id"].to_list())
    assert not family & train
    evals = pl.concat([splits.eval_set, splits.external_set])
    assert find_leakage(evals, splits.rl_training_pool, lineage) == []
    roles = forecasting_roles(splits.rl_training_pool, evals, lineage, held_out_task="gdn_chunk_fwd_o", calibration_per_bin=2)
    assert set(roles.external["candidate_kernel_id"].to_list()) == external
    assert not external & set(roles.eval["candidate_kernel_id"].to_list())
    assert not external & set(roles.held_out_eval["candidate_kernel_id"].to_list())
    for name in ("fit", "calibration", "held_out_fit", "held_out_calibration"):
        frame = getattr(roles, name)
        assert frame.height > 0, name
        kernels = set(frame["candidate_kernel_id"].to_list()) | set(frame["anchor_kernel_id"].to_list())
        assert not family & kernels, name


def test_a_leaked_external_lineage_is_caught_and_filtered_again():
    """A training pool that holds an external kernel's parent (a dataset curated before the split
    existed): find_leakage names the pair and the roles leave it out of fit and calibration."""
    from pipelines.curation.splits import find_leakage

    pairs, lineage = _with_external()
    plain = make_splits(pairs, lineage.drop("generator"))  # blind to generators: rewrites train
    evals = plain.eval_set
    leaked = find_leakage(evals, plain.rl_training_pool, lineage)
    family = _external_family(lineage)
    in_family = plain.rl_training_pool.filter(pl.col("candidate_kernel_id").is_in(list(family)))["pair_id"].to_list()
    assert in_family and set(in_family) <= set(leaked)
    roles = forecasting_roles(plain.rl_training_pool, evals, lineage, held_out_task=None, calibration_per_bin=2)
    fit_kernels = set(roles.fit["candidate_kernel_id"].to_list()) | set(roles.calibration["candidate_kernel_id"].to_list())
    assert not _external_family(lineage) & fit_kernels


def test_without_non_template_kernels_the_external_split_is_empty():
    pairs, lineage = _toy_dataset()
    splits = make_splits(pairs, lineage)
    assert splits.external_set is not None and splits.external_set.is_empty()
    roles = forecasting_roles(splits.rl_training_pool, splits.eval_set, lineage)
    assert roles.external_pairs().is_empty() and roles.eval.height == splits.eval_set.height


# ---- held-out styles: kernels in the styles people write, learned from, each scored held out ----
def _with_styles(seed: int = 0):
    """The toy dataset plus kernels of two style generators (no parent), one hand-written kernel,
    and cross pairs between a template kernel and a style kernel."""
    from models.bins import speedup_to_bin

    pairs, lineage = _toy_dataset(seed)
    rng = np.random.default_rng(seed + 1)
    lineage = lineage.with_columns(pl.lit("kernelcast-space").alias("generator"))
    rows, extra = [], []
    for gen in ("pytorch-programs", "library-triton", "handwritten:x"):
        for task in ("softmax", "gdn_chunk_fwd_o"):
            for i in range(12 if gen != "handwritten:x" else 1):
                kid = f"{gen}-{task}-{i}"
                extra.append({"kernel_id": kid, "parent_kernel_id": None, "generator": gen})
                s = float(2.0 ** rng.uniform(-3, 3))
                rows.append({"pair_id": f"p-{kid}", "task": task, "hardware_id": "h", "anchor_kernel_id": f"ref-{task}",
                             "candidate_kernel_id": kid, "speedup": s, "true_bin": speedup_to_bin(s),
                             "pair_type": "reference"})
    rows.append({"pair_id": "x-1", "task": "softmax", "hardware_id": "h", "anchor_kernel_id": "softmax-0-1",
                 "candidate_kernel_id": "pytorch-programs-softmax-3", "speedup": 1.5, "true_bin": 6,
                 "pair_type": "cross"})
    return (pl.concat([pairs, pl.DataFrame(rows)], how="diagonal_relaxed"),
            pl.concat([lineage, pl.DataFrame(extra, schema=lineage.schema)]))


def test_style_kernels_are_learned_from_and_each_style_is_scored_held_out():
    pairs, lineage = _with_styles()
    splits = make_splits(pairs, lineage)
    style_ids = {k for k, g in lineage.select("kernel_id", "generator").rows() if g in ("pytorch-programs", "library-triton")}
    # never an eval candidate, never external; in the training pool with their cross pair
    assert not style_ids & set(splits.eval_set["candidate_kernel_id"].to_list())
    assert not style_ids & set(splits.external_set["candidate_kernel_id"].to_list())
    assert set(splits.external_set["candidate_kernel_id"].to_list()) == {"handwritten:x-softmax-0",
                                                                        "handwritten:x-gdn_chunk_fwd_o-0"}
    roles = forecasting_roles(splits.rl_training_pool, pl.concat([splits.eval_set, splits.external_set]), lineage,
                              held_out_task="gdn_chunk_fwd_o", calibration_per_bin=2)
    learned = set(roles.fit["candidate_kernel_id"].to_list()) | set(roles.calibration["candidate_kernel_id"].to_list())
    assert style_ids & learned  # the in-distribution forecasters learn from both styles
    assert sorted(roles.styles) == ["held_out_style:library-triton", "held_out_style:pytorch-programs"]
    # every kernel a forecast is made of gets its record (the held-out styles' eval kernels too)
    scored = {k for f in roles.scored_frames() for c in ("anchor_kernel_id", "candidate_kernel_id") for k in f[c].to_list()}
    style_evals = {k for _, _, ev in roles.styles.values() for k in ev["candidate_kernel_id"].to_list()}
    assert style_evals and style_evals <= scored
    assert roles.held_out_splits() == ["held_out_task", "held_out_style:library-triton",
                                       "held_out_style:pytorch-programs"]
    for gen in ("pytorch-programs", "library-triton"):
        fit, cal, ev = roles.for_split(f"held_out_style:{gen}")
        mine = {k for k in style_ids if k.startswith(gen)}
        assert ev.height == 24 and set(ev["candidate_kernel_id"].to_list()) == mine  # every reference pair
        for frame in (fit, cal):  # no pair touches the style, as candidate or anchor
            assert frame.height and not mine & (set(frame["candidate_kernel_id"].to_list())
                                                | set(frame["anchor_kernel_id"].to_list()))
        other = style_ids - mine  # the other style is still learned from
        assert other & (set(fit["candidate_kernel_id"].to_list()) | set(cal["candidate_kernel_id"].to_list()))


def test_a_style_kernel_anchoring_a_cross_pair_leaves_training_with_its_style():
    pairs, lineage = _with_styles()
    # a style kernel as the anchor of a cross pair: an anchor, but not a reference
    cross = pl.DataFrame([{"pair_id": "x-2", "task": "softmax", "hardware_id": "h",
                           "anchor_kernel_id": "pytorch-programs-softmax-5", "candidate_kernel_id": "softmax-0-1",
                           "speedup": 2.0, "true_bin": 6, "pair_type": "cross"}])
    splits = make_splits(pairs, lineage)
    train = pl.concat([splits.rl_training_pool, cross], how="diagonal_relaxed")
    roles = forecasting_roles(train, pl.concat([splits.eval_set, splits.external_set]), lineage,
                              held_out_task="gdn_chunk_fwd_o", calibration_per_bin=2)
    fit, cal, ev = roles.for_split("held_out_style:pytorch-programs")
    assert "pytorch-programs-softmax-5" in set(ev["candidate_kernel_id"].to_list())
    for frame in (fit, cal):
        seen = set(frame["candidate_kernel_id"].to_list()) | set(frame["anchor_kernel_id"].to_list())
        assert not any(k.startswith("pytorch-programs") for k in seen)
