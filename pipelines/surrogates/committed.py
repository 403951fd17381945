"""LLM surrogate forecasts made on a GPU host and committed under data/, used where no GPU is.

A committed run (pipelines/surrogates/remote_results.py: `kernelcast train ingest`) holds the
raw logprob-readout forecasts of every variant on its calibration and eval pairs, keyed by
(hardware, anchor, candidate). Here they are:
- re-keyed to the pairs of the current dataset version (pair ids carry the version; a pair the
  version no longer holds in the same role is left out, so the row's n says what was scored);
- calibrated: a temperature and per-bin biases fitted on the variant's own calibration
  forecasts (its calibration split was carved from its training lineages), then applied to its
  eval forecasts, as `models.calibration` does for every version.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from models.bins import NUM_BINS
from models.calibration import Calibrator, fit_calibrator
from warehouse.bin_edges import P_COLS

FORECASTS_FILE = "forecasts.parquet"
TRAINING_FILE = "training.json"
KEYS = ("hardware_id", "anchor_kernel_id", "candidate_kernel_id")


@dataclass(frozen=True)
class CommittedVariant:
    """One committed variant: its split, settings, calibrator and calibrated eval forecasts."""

    name: str
    split: str  # in_distribution | held_out_task
    settings: dict[str, Any]
    calibrator: Calibrator
    forecasts: pl.DataFrame  # pair_id (current version), p1..p8, predicted_bin, parse_ok, repeat


def read_committed(run_dir: str | Path) -> tuple[pl.DataFrame, dict[str, Any]]:
    """(forecasts frame, training.json) of a committed run folder; FileNotFoundError if absent."""
    root = Path(run_dir)
    if not (root / FORECASTS_FILE).is_file():
        raise FileNotFoundError(f"{root}: no committed forecasts ({FORECASTS_FILE})")
    return pl.read_parquet(root / FORECASTS_FILE), json.loads((root / TRAINING_FILE).read_text())


def calibrated_variants(run_dir: str | Path, eval_pairs: pl.DataFrame, held_out_pairs: pl.DataFrame,
                        readout: str = "logprob") -> list[CommittedVariant]:
    """Every committed variant's calibrated eval forecasts on the current version's pairs.

    Args:
        run_dir: the committed run folder (data/training/<hardware>/<date>).
        eval_pairs: the current version's eval set (in-distribution variants are scored there).
        held_out_pairs: its held-out-task eval pairs (held-out variants are scored there).
        readout: which readout's rows to use.
    """
    frame, training = read_committed(run_dir)
    # A head on the hidden states (models.training.head, embed_head) is a variant's distributional readout too.
    frame = frame.filter(pl.col("readout").is_in([readout, "head", "embed_head"] if readout == "logprob" else [readout]))
    out = []
    for name, info in sorted(training.get("variants", {}).items()):
        settings = info.get("settings", {})
        held = bool(settings.get("held_out"))
        split = "held_out_task" if held else "in_distribution"
        own = frame.filter(pl.col("variant") == name)
        cal = own.filter(pl.col("role") == ("held_out_calibration" if held else "calibration"))
        ev = own.filter(pl.col("role") == ("held_out_eval" if held else "eval"))
        if ev.is_empty():
            continue
        calibrator = fit_calibrator(cal.select(P_COLS).to_numpy(), cal["true_bin"].to_numpy()) if cal.height else Calibrator()
        target = held_out_pairs if held else eval_pairs
        joined = ev.drop("pair_id").join(target.select("pair_id", *KEYS), on=list(KEYS), how="inner")
        p = calibrator.apply(joined.select(P_COLS).to_numpy()) if joined.height else np.zeros((0, NUM_BINS))
        bins = (np.argmax(p, axis=1) + 1).astype(np.int64)
        rows = pl.DataFrame({"pair_id": joined["pair_id"], "repeat": joined["repeat"], "parse_ok": joined["parse_ok"],
                             "predicted_bin": bins, "argmax_bin": bins, "raw_sum": p.sum(axis=1) if len(p) else []})
        rows = pl.concat([rows, pl.DataFrame({c: p[:, i] for i, c in enumerate(P_COLS)}, schema={c: pl.Float64 for c in P_COLS})],
                         how="horizontal")
        out.append(CommittedVariant(name, split, settings, calibrator, rows))
    return out
