"""Which pairs of a dataset version each forecaster learns from, is calibrated on and is scored on.

Two settings, as the paper reports them:
- in distribution: fit on the training pool minus a calibration split carved from its
  lineages (pipelines.curation.splits.calibration_split), calibrate on that split, score on the
  eval set;
- held-out task: the same with one task (default gdn_chunk_fwd_o, the paper's) removed from
  training and calibration, scored on every reference pair of that task.
- source only: the in-distribution models and eval pairs, every kernel record stripped of the
  generator's metadata (`strip_metadata`) before any forecaster sees it;
- held-out style (one setting per style generator with kernels in the version, split
  `held_out_style:<generator>`): the in-distribution setting with every pair touching a kernel of
  that style removed from training and calibration, scored on every reference pair of the style:
  how a forecaster does on a way of writing kernels it never saw;
- external: the in-distribution models on the reference pairs of kernels no learned generator
  wrote (pipelines.curation.splits.is_external_generator: rewrites, hand-written, LLM-written),
  stored in the eval split of the dataset version and told apart here by the candidate's generator.
The eval set and its lineages never enter fit or calibration (the training pool already excludes
them), nor does any kernel sharing a lineage with an external kernel (the curation keeps them out
of the training pool; `forecasting_roles` filters again, so a dataset version curated before the
external split existed cannot leak them either); the in-distribution and held-out settings never
share a fitted model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from pipelines.curation.splits import (
    DEFAULT_LINEAGE_K,
    calibration_split,
    external_kernel_ids,
    external_lineage,
    held_out_task_split,
    lineage_map,
    style_kernel_ids,
)

DEFAULT_HELD_OUT_TASK = "gdn_chunk_fwd_o"
SPLITS = ("in_distribution", "source_only", "held_out_task", "external")
STYLE_SPLIT_PREFIX = "held_out_style:"


def style_split(generator: str) -> str:
    """The split of a style held out.

    >>> style_split("pytorch-programs")
    'held_out_style:pytorch-programs'
    """
    return STYLE_SPLIT_PREFIX + generator


def is_style_split(split: str) -> bool:
    return split.startswith(STYLE_SPLIT_PREFIX)


def held_out_split(split: str) -> bool:
    """Whether a split's versions are fitted apart (the held-out task, a held-out style)."""
    return split == "held_out_task" or is_style_split(split)


# The report's splits: fixed ones in page order, the held-out styles after the held-out task,
# `library` (published kernels fetched at evaluation time, never learned from) last.
LIBRARY_SPLIT = "library"
SPLIT_TITLES = {"in_distribution": "in distribution (eval set)",
                "source_only": "source only (eval set, generator metadata withheld)",
                "held_out_task": "held-out task",
                "external": "external (rewrites and hand-written kernels, never learned from)",
                LIBRARY_SPLIT: "library (published kernels, never learned from)"}


def split_title(split: str) -> str:
    """A split's title in the report.

    >>> split_title("held_out_style:pytorch-programs")
    'held-out style pytorch-programs'
    """
    if is_style_split(split):
        return "held-out style " + split.removeprefix(STYLE_SPLIT_PREFIX)
    return SPLIT_TITLES.get(split, split)


def ordered_splits(splits: Iterable[str]) -> list[str]:
    """Splits in report order.

    >>> ordered_splits(["library", "external", "held_out_style:b", "in_distribution", "held_out_style:a"])
    ['in_distribution', 'held_out_style:a', 'held_out_style:b', 'external', 'library']
    """
    order = ("in_distribution", "source_only", "held_out_task")
    given = set(splits)
    styles = sorted(s for s in given if is_style_split(s))
    rest = sorted(given - set(order) - set(styles) - {"external", LIBRARY_SPLIT})
    return [*(s for s in order if s in given), *styles, *rest, *(s for s in ("external", LIBRARY_SPLIT) if s in given)]
# What only the platform's own kernels carry; withheld from every record in the source-only split.
METADATA_FIELDS = ("algorithm", "knobs_json", "generator")


def strip_metadata(records: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Kernel records with the generator's metadata withheld (None), everything else as given.

    >>> strip_metadata({"k": {"source": "x", "algorithm": "a", "knobs_json": "{}", "generator": "g"}})
    {'k': {'source': 'x', 'algorithm': None, 'knobs_json': None, 'generator': None}}
    """
    return {k: {**r, **{f: None for f in METADATA_FIELDS if f in r}} for k, r in records.items()}


@dataclass(frozen=True)
class Roles:
    """Pairs by role, for one dataset version.

    Attributes:
        fit, calibration, eval: the in-distribution setting (eval: template kernels only).
        held_out_fit, held_out_calibration, held_out_eval: the held-out-task setting.
        held_out_task: the task left out (None: no held-out setting).
        external: reference pairs of the non-template kernels (scored by in-distribution models).
        styles: `held_out_style:<generator>` -> (fit, calibration, eval) of that style held out.
        hardware_id: the card every frame's pairs were measured on (None: pairs of no single card).
    """

    fit: pl.DataFrame
    calibration: pl.DataFrame
    eval: pl.DataFrame
    held_out_fit: pl.DataFrame
    held_out_calibration: pl.DataFrame
    held_out_eval: pl.DataFrame
    held_out_task: str | None
    external: pl.DataFrame | None = None
    styles: dict[str, tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]] = field(default_factory=dict)
    hardware_id: str | None = None

    def external_pairs(self) -> pl.DataFrame:
        return self.external if self.external is not None else self.eval.head(0)

    def held_out_splits(self) -> list[str]:
        """The held-out settings with pairs to score: the task's, then each style's."""
        return (["held_out_task"] if self.held_out_task and self.held_out_eval.height else []) + sorted(self.styles)

    def for_split(self, split: str) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        """(fit, calibration, eval) of a split of SPLITS or a style's: source_only and external are
        scored by the in-distribution models (source_only on the same eval pairs, stripped records)."""
        if split in ("in_distribution", "source_only"):
            return self.fit, self.calibration, self.eval
        if split == "external":
            return self.fit, self.calibration, self.external_pairs()
        if split == "held_out_task":
            return self.held_out_fit, self.held_out_calibration, self.held_out_eval
        if split in self.styles:
            return self.styles[split]
        raise ValueError(f"unknown split {split!r}; use one of {(*SPLITS, *self.styles)}")

    def by_name(self) -> dict[str, pl.DataFrame]:
        """The roles of the in-distribution and held-out-task settings (the GPU job bundle's)."""
        return {"fit": self.fit, "calibration": self.calibration, "eval": self.eval,
                "held_out_fit": self.held_out_fit, "held_out_calibration": self.held_out_calibration,
                "held_out_eval": self.held_out_eval}

    def scored_frames(self) -> list[pl.DataFrame]:
        """The pair frames forecasts are made of: the eval set, the held-out task's and each held-out
        style's eval pairs, and the external pairs (their kernels need records to be forecast)."""
        return [self.eval, self.held_out_eval, self.external_pairs(), *(fs[2] for fs in self.styles.values())]

    def all_frames(self) -> list[pl.DataFrame]:
        """Every pair frame of every setting, the held-out styles' and the external pairs included."""
        return [*self.by_name().values(), self.external_pairs(), *(f for fs in self.styles.values() for f in fs)]


def forecasting_roles(
    train: pl.DataFrame,
    eval_set: pl.DataFrame,
    lineage: pl.DataFrame,
    held_out_task: str | None = DEFAULT_HELD_OUT_TASK,
    calibration_per_bin: int = 4,
    seed: int = 0,
) -> Roles:
    """The roles of a dataset version's pairs.

    Args:
        train: the version's training pool (split 'train').
        eval_set: its eval set (split 'eval'; the external pairs among it are told apart by
            the candidate's generator).
        lineage: kernel_id, parent_kernel_id and generator of its kernels (without generator:
            no external split).
        held_out_task: the task of the held-out setting; None (or a task without eval pairs)
            leaves that setting empty.
        calibration_per_bin: calibration candidates per (task, hardware, bin).
        seed: the calibration choice's seed.
    Returns:
        `Roles`.
    """
    refs = set(train["anchor_kernel_id"].to_list()) | set(eval_set["anchor_kernel_id"].to_list())
    external = external_kernel_ids(lineage) - refs
    blocked = external_lineage(external, lineage_map(lineage, refs), DEFAULT_LINEAGE_K) - refs
    is_ext = pl.col("candidate_kernel_id").is_in(list(external))
    external_pairs, eval_set = eval_set.filter(is_ext), eval_set.filter(~is_ext)
    train = train.filter(~pl.col("candidate_kernel_id").is_in(list(blocked)) & ~pl.col("anchor_kernel_id").is_in(list(blocked)))
    cal = calibration_split(train, lineage, per_bin=calibration_per_bin, seed=seed)
    styles = {}
    # The anchors of reference pairs, not every anchor: a style kernel anchoring a cross pair is
    # still the style's kernel, and its own reference pairs must leave training with the rest.
    reference_anchors = {a for f in (train, eval_set) for a, t in f.select("anchor_kernel_id", "pair_type").rows()
                         if t == "reference"} if "pair_type" in train.columns else refs
    for generator, kernels in sorted(style_kernel_ids(lineage).items()):
        ids = list(kernels - reference_anchors)
        touches = pl.col("candidate_kernel_id").is_in(ids) | pl.col("anchor_kernel_id").is_in(ids)
        style_eval = train.filter(pl.col("candidate_kernel_id").is_in(ids) & (pl.col("pair_type") == "reference"))
        if style_eval.is_empty():
            continue
        style_cal = calibration_split(train.filter(~touches), lineage, per_bin=calibration_per_bin, seed=seed)
        styles[style_split(generator)] = (style_cal.fit, style_cal.calibration, style_eval.sort("pair_id"))
    empty = train.head(0)
    tasks = set(train["task"].to_list()) | set(eval_set["task"].to_list())
    cards = set(eval_set["hardware_id"].to_list()) | set(external_pairs["hardware_id"].to_list()) \
        if "hardware_id" in eval_set.columns else set()
    card = next(iter(cards)) if len(cards) == 1 else None
    if held_out_task and held_out_task in tasks:
        hot_train, hot_eval = held_out_task_split(train, eval_set, held_out_task)
        hot_cal = calibration_split(hot_train, lineage, per_bin=calibration_per_bin, seed=seed)
        return Roles(cal.fit, cal.calibration, eval_set, hot_cal.fit, hot_cal.calibration, hot_eval, held_out_task,
                     external_pairs, styles, card)
    return Roles(cal.fit, cal.calibration, eval_set, empty, empty, eval_set.head(0), None, external_pairs, styles, card)
