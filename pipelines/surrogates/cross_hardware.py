"""How far forecasters fitted on the reference card carry to another card (docs/method.md).

For each target card T of a dataset version (every hardware but the reference card R,
pipelines.curation.hardware):

- eval: T's reference pairs (a kernel against its task's reference, measured on T), chosen as
  the in-distribution eval set is (up to `per_bin` per task and bin, seeded hash of the kernel
  id), among candidates of any generator that R's forecasters never learned from: no kernel of
  R's fit or calibration pairs is a T eval candidate. Most of T's kernels are rewrites of R's
  template kernels, so T's eval is not R's eval set moved to another card: it is scored beside
  R's in-distribution and external Brier, not in place of either;
- pool: T's other reference pairs, less the `lineage_k` neighbourhood of the eval candidates, in
  a bin-balanced order (round robin over the (task, bin) cells, a cell's pairs by seeded hash):
  its first n pairs are what a user who measured n kernels on T holds, spread over the bins as
  the calibration split of the in-distribution setting is.

The settings, each on T's eval pairs:
- zero_shot (a): R's registered versions as they are. T's fingerprint reaches a forecaster that
  reads the hardware table (the language models' prompt); the classical forecasters read the
  sm_90 compile and the source, which are the same on both cards;
- calibrated@n (b): R's version with a calibrator (temperature and per-bin biases, NLL,
  models.calibration) fitted on its forecasts of the first n pool pairs;
- fitted@n (c): the classical kinds fitted on the first n pool pairs (every fifth pair held
  for their own calibration, with its lineage neighbourhood out of the fit part); at n = all,
  the versions registered for T (tag `hardware`, models.registry.hardware);
- the curve: Brier of (b) and (c) against n = 0 (zero shot), the configured sizes, and all.

Beside them, the bin agreement of the kernels correct on both cards (each against its task's
reference on that card): how often the two cards put a kernel in the same bin. A forecaster that
knew R's true bins exactly would still miss T's on every kernel where the cards disagree.

This module holds the pairs of each setting (`CardRoles`); the study that forecasts and scores
them, and the bin agreement, is pipelines.evaluation.card_study.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import polars as pl

from pipelines.curation.splits import (
    DEFAULT_LINEAGE_K,
    lineage_map,
    lineage_neighbourhood,
    select_eval_candidates,
)
from pipelines.surrogates.roles import Roles

log = logging.getLogger(__name__)

ZERO_SHOT = "zero_shot"
CALIBRATED = "calibrated"
FITTED = "fitted"
CALIBRATION_EVERY = 5  # of the first n pool pairs, every fifth calibrates a fitted@n forecaster


def setting_name(setting: str, n: int | None) -> str:
    """`calibrated@300`, `fitted@all`.

    >>> setting_name("fitted", None), setting_name("calibrated", 100)
    ('fitted@all', 'calibrated@100')
    """
    return f"{setting}@{'all' if n is None else n}"


def _hash(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}|{key}".encode()).hexdigest()


def balanced_order(pairs: pl.DataFrame, seed: int = 0) -> pl.DataFrame:
    """Pairs in rounds over their (task, bin) cells: the first round holds one pair of every
    cell, the next one more of every cell that has it; a cell's pairs and a round's cells in
    seeded-hash order, so any prefix is as bin-balanced per task as the pairs allow.

    >>> f = pl.DataFrame({"task": ["t"] * 4, "true_bin": [1, 1, 1, 2], "candidate_kernel_id": list("abcd")})
    >>> balanced_order(f)["true_bin"].to_list()[:2] in ([1, 2], [2, 1])
    True
    """
    if pairs.is_empty():
        return pairs
    keyed = pairs.with_columns(pl.Series("_h", [_hash(seed, k) for k in pairs["candidate_kernel_id"]], dtype=pl.Utf8))
    keyed = keyed.sort(["task", "true_bin", "_h"]).with_columns(
        pl.int_range(pl.len()).over(["task", "true_bin"]).alias("_round"))
    return keyed.sort(["_round", "_h"]).drop("_h", "_round")


@dataclass(frozen=True)
class CardRoles:
    """The pairs of one target card's settings.

    Attributes:
        hardware_id: the target card T.
        reference_hardware: the card R its zero-shot forecasters were fitted on.
        eval: T's eval pairs (reference pairs, bin-balanced per task).
        pool: T's other reference pairs, bin-balanced order (`balanced_order`).
        lineage: kernel_id, parent_kernel_id of T's kernels (the fitted settings' calibration cut).
        learned_left_out: T candidates not eligible for eval because R's forecasters learned
            from them.
        lineage_k: mutations around a candidate kept apart (eval vs pool, calibration vs fit).
    """

    hardware_id: str
    reference_hardware: str
    eval: pl.DataFrame
    pool: pl.DataFrame
    lineage: pl.DataFrame
    learned_left_out: int = 0
    lineage_k: int = DEFAULT_LINEAGE_K

    def first(self, n: int | None) -> pl.DataFrame:
        """The first n pool pairs (None: all of them)."""
        return self.pool if n is None else self.pool.head(n)

    def fit_and_calibration(self, n: int | None) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(fit, calibration) of a forecaster fitted on the first n pool pairs: every fifth pair
        calibrates; the fit part loses the pairs within `lineage_k` of a calibration candidate."""
        first = self.first(n)
        if first.is_empty():
            return first, first
        index = pl.int_range(pl.len())
        calibration = first.filter(index % CALIBRATION_EVERY == CALIBRATION_EVERY - 1)
        refs = set(first["anchor_kernel_id"].to_list())
        blocked = lineage_neighbourhood(calibration["candidate_kernel_id"].to_list(),
                                        lineage_map(self.lineage, refs), self.lineage_k) - refs
        fit = first.filter((index % CALIBRATION_EVERY != CALIBRATION_EVERY - 1)
                           & ~pl.col("candidate_kernel_id").is_in(list(blocked)))
        return fit, calibration

    def sizes(self, configured: Iterable[int]) -> list[int | None]:
        """The curve's fitted sizes: each configured size below the pool's, then None (all)."""
        return sorted({n for n in configured if 0 < n < self.pool.height}) + ([None] if self.pool.height else [])

    def roles(self, sizes: Sequence[int | None] = (None,)) -> Roles:
        """`Roles` whose in-distribution setting is fitted@all and whose settings `fitted@<n>` are
        the other sizes (fit, calibration, eval): what `fit_many` and `train_and_register` take."""
        fit, calibration = self.fit_and_calibration(None)
        empty = self.eval.head(0)
        settings = {setting_name(FITTED, n): (*self.fit_and_calibration(n), self.eval) for n in sizes if n is not None}
        return Roles(fit, calibration, self.eval, empty, empty, empty, None, None, settings, self.hardware_id)


def card_roles(card_pairs: pl.DataFrame, lineage: pl.DataFrame, reference_hardware: str, learned: set[str],
               per_bin: int = 12, lineage_k: int = DEFAULT_LINEAGE_K, seed: int = 0) -> CardRoles:
    """The settings' pairs of the target card whose pairs `card_pairs` are.

    Args:
        card_pairs: the dataset version's pairs of one card (any split; its reference pairs are used).
        lineage: kernel_id, parent_kernel_id of that card's kernels.
        reference_hardware: the reference card R.
        learned: kernel ids R's forecasters learned from (their fit and calibration pairs').
        per_bin: eval candidates per (task, bin), as the in-distribution eval set.
        lineage_k: mutations around an eval candidate kept out of the pool.
        seed: the eval choice's and the pool order's seed.
    Raises:
        ValueError: `card_pairs` hold no card or several (one line).
    """
    cards = set(card_pairs["hardware_id"].to_list())
    if len(cards) != 1:
        raise ValueError(f"the pairs of one card are needed, got {len(cards)} cards")
    card = cards.pop()
    reference = card_pairs.filter(pl.col("pair_type") == "reference").unique("pair_id", keep="first").sort("pair_id")
    refs = set(reference["anchor_kernel_id"].to_list())
    eligible = reference.filter(~pl.col("candidate_kernel_id").is_in(list(learned - refs)))
    chosen, _ = select_eval_candidates(eligible, per_bin, seed)
    blocked = lineage_neighbourhood(chosen["candidate_kernel_id"].to_list(), lineage_map(lineage, refs), lineage_k) - refs
    pool = reference.filter(~pl.col("pair_id").is_in(chosen["pair_id"].to_list())
                            & ~pl.col("candidate_kernel_id").is_in(list(blocked)))
    log.info("%s: %d eval pairs, %d pool pairs, %d candidates learned on %s left out of eval", card, chosen.height,
             pool.height, reference.height - eligible.height, reference_hardware)
    return CardRoles(card, reference_hardware, chosen.sort("pair_id"), balanced_order(pool, seed),
                     lineage.select("kernel_id", "parent_kernel_id"), reference.height - eligible.height, lineage_k)


def learned_kernels(roles: Roles) -> set[str]:
    """Kernel ids a reference forecaster learned from: its fit and calibration pairs' kernels."""
    out: set[str] = set()
    for frame in (roles.fit, roles.calibration):
        if frame.height:
            out |= set(frame["anchor_kernel_id"].to_list()) | set(frame["candidate_kernel_id"].to_list())
    return out
