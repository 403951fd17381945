"""Which pairs of a dataset version each forecaster learns from, is calibrated on and is scored on.

Two settings, as the paper reports them:
- in distribution: fit on the training pool minus a calibration split carved from its
  lineages (pipelines.curation.splits.calibration_split), calibrate on that split, score on the
  eval set;
- held-out task: the same with one task (default gdn_chunk_fwd_o, the paper's) removed from
  training and calibration, scored on every reference pair of that task.
The eval set and its lineages never enter fit or calibration (the training pool already excludes
them), and the two settings never share a fitted model.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from pipelines.curation.splits import calibration_split, held_out_task_split

DEFAULT_HELD_OUT_TASK = "gdn_chunk_fwd_o"
SPLITS = ("in_distribution", "held_out_task")


@dataclass(frozen=True)
class Roles:
    """Pairs by role, for one dataset version.

    Attributes:
        fit, calibration, eval: the in-distribution setting.
        held_out_fit, held_out_calibration, held_out_eval: the held-out-task setting.
        held_out_task: the task left out (None: no held-out setting).
    """

    fit: pl.DataFrame
    calibration: pl.DataFrame
    eval: pl.DataFrame
    held_out_fit: pl.DataFrame
    held_out_calibration: pl.DataFrame
    held_out_eval: pl.DataFrame
    held_out_task: str | None

    def for_split(self, split: str) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        """(fit, calibration, eval) of 'in_distribution' or 'held_out_task'."""
        if split == "in_distribution":
            return self.fit, self.calibration, self.eval
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
        eval_set: its eval set (split 'eval').
        lineage: kernel_id, parent_kernel_id of its kernels.
        held_out_task: the task of the held-out setting; None (or a task without eval pairs)
            leaves that setting empty.
        calibration_per_bin: calibration candidates per (task, hardware, bin).
        seed: the calibration choice's seed.
    Returns:
        `Roles`.
    """
    cal = calibration_split(train, lineage, per_bin=calibration_per_bin, seed=seed)
    empty = train.head(0)
    tasks = set(train["task"].to_list()) | set(eval_set["task"].to_list())
    if held_out_task and held_out_task in tasks:
        hot_train, hot_eval = held_out_task_split(train, eval_set, held_out_task)
        hot_cal = calibration_split(hot_train, lineage, per_bin=calibration_per_bin, seed=seed)
        return Roles(cal.fit, cal.calibration, eval_set, hot_cal.fit, hot_cal.calibration, hot_eval, held_out_task)
    return Roles(cal.fit, cal.calibration, eval_set, empty, empty, eval_set.head(0), None)
