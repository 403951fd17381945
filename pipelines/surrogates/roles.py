"""Which pairs of a dataset version each forecaster learns from, is calibrated on and is scored on.

Two settings, as the paper reports them:
- in distribution: fit on the training pool minus a calibration split carved from its
  lineages (pipelines.curation.splits.calibration_split), calibrate on that split, score on the
  eval set;
- held-out task: the same with one task (default gdn_chunk_fwd_o, the paper's) removed from
  training and calibration, scored on every reference pair of that task.
- source only: the in-distribution models and eval pairs, every kernel record stripped of the
  generator's metadata (`strip_metadata`) before any forecaster sees it;
- external: the in-distribution models on the reference pairs of kernels the template generator
  did not write (pipelines.curation.splits.is_external_generator), stored in the eval split of
  the dataset version and told apart here by the candidate's generator.
The eval set and its lineages never enter fit or calibration (the training pool already excludes
them), nor does any kernel sharing a lineage with an external kernel (the curation keeps them out
of the training pool; `forecasting_roles` filters again, so a dataset version curated before the
external split existed cannot leak them either); the in-distribution and held-out settings never
share a fitted model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from pipelines.curation.splits import (
    DEFAULT_LINEAGE_K,
    calibration_split,
    external_kernel_ids,
    external_lineage,
    held_out_task_split,
    lineage_map,
)

DEFAULT_HELD_OUT_TASK = "gdn_chunk_fwd_o"
SPLITS = ("in_distribution", "source_only", "held_out_task", "external")
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
    """

    fit: pl.DataFrame
    calibration: pl.DataFrame
    eval: pl.DataFrame
    held_out_fit: pl.DataFrame
    held_out_calibration: pl.DataFrame
    held_out_eval: pl.DataFrame
    held_out_task: str | None
    external: pl.DataFrame | None = None

    def external_pairs(self) -> pl.DataFrame:
        return self.external if self.external is not None else self.eval.head(0)

    def for_split(self, split: str) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        """(fit, calibration, eval) of a split of SPLITS: source_only and external are scored by
        the in-distribution models (source_only on the same eval pairs, stripped records)."""
        if split in ("in_distribution", "source_only"):
            return self.fit, self.calibration, self.eval
        if split == "external":
            return self.fit, self.calibration, self.external_pairs()
        if split == "held_out_task":
            return self.held_out_fit, self.held_out_calibration, self.held_out_eval
        raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")

    def by_name(self) -> dict[str, pl.DataFrame]:
        return {"fit": self.fit, "calibration": self.calibration, "eval": self.eval,
                "held_out_fit": self.held_out_fit, "held_out_calibration": self.held_out_calibration,
                "held_out_eval": self.held_out_eval}


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
    empty = train.head(0)
    tasks = set(train["task"].to_list()) | set(eval_set["task"].to_list())
    if held_out_task and held_out_task in tasks:
        hot_train, hot_eval = held_out_task_split(train, eval_set, held_out_task)
        hot_cal = calibration_split(hot_train, lineage, per_bin=calibration_per_bin, seed=seed)
        return Roles(cal.fit, cal.calibration, eval_set, hot_cal.fit, hot_cal.calibration, hot_eval, held_out_task,
                     external_pairs)
    return Roles(cal.fit, cal.calibration, eval_set, empty, empty, eval_set.head(0), None, external_pairs)
