"""Committed H200 forecasts of an LLM variant (pipelines.surrogates.committed) as an adapter.

The variant's weights stay on the GPU host; what is committed are its raw logprob forecasts of
the calibration and eval pairs of its run, keyed by (hardware, anchor, candidate). So it answers
only the pairs it holds: `covers(pairs)` says which, `forecast_pairs` refuses a frame with a
pair it lacks (one line), and `forecast_rows` gives rows for the pairs it holds, every repeat,
as the evaluation stores them. Its calibrator is fitted on its own calibration forecasts, as
`pipelines.surrogates.committed.calibrated_variants` does (the numbers are that function's).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipelines.forecasting.base import PairForecaster
from warehouse.bin_edges import P_COLS

KEYS = ("hardware_id", "anchor_kernel_id", "candidate_kernel_id")


def committed_variant_names(committed_dir: Path | None) -> list[str]:
    """The variants a committed run folder holds ([] when there is none)."""
    import json

    if committed_dir is None or not (Path(committed_dir) / "training.json").is_file():
        return []
    return sorted(json.loads((Path(committed_dir) / "training.json").read_text()).get("variants", {}))


class CommittedForecaster(PairForecaster):
    """An LLM variant's committed, calibrated forecasts.

    Args:
        committed_dir: the committed run folder (data/training/<hardware>/<date>).
        variant: the variant's name in its training.json.
        model_ref: what its rows are stored under (the registered version's models:/ ref when
            one carries tag committed_variant, else h200:<variant>).
    """

    kind = "llm"
    needs_kernels = False  # keyed by kernel ids, never reads a record

    def __init__(self, committed_dir: Path, variant: str, model_ref: str | None = None):
        names = committed_variant_names(committed_dir)
        if variant not in names:
            raise ValueError(f"no committed variant {variant!r} in {committed_dir} "
                             f"(it holds: {', '.join(names) or 'none'})")
        self.committed_dir, self.variant = Path(committed_dir), variant
        self.model_ref = model_ref or f"h200:{variant}"
        self.source = f"committed H200 forecasts of {variant}"
        self.refusal: str | None = None  # why a pair outside the run is refused, when there is more to say

    def _variant_rows(self, pairs: pl.DataFrame) -> pl.DataFrame:
        """Its calibrated rows on the pairs it holds (pair_id of `pairs`, every repeat)."""
        from pipelines.surrogates.committed import calibrated_variants

        target = pairs.select("pair_id", *KEYS)
        for v in calibrated_variants(self.committed_dir, target, target):
            if v.name == self.variant:
                return v.forecasts
        return pl.DataFrame(schema={"pair_id": pl.Utf8, "repeat": pl.Int64})

    def held_forecasts(self, pairs: pl.DataFrame) -> dict[str, np.ndarray]:
        """pair_id -> its calibrated forecast (the first repeat), for the pairs of `pairs` it holds."""
        if pairs.is_empty():
            return {}
        rows = self._variant_rows(pairs).sort("pair_id", "repeat").unique("pair_id", keep="first")
        return dict(zip(rows["pair_id"].to_list(), rows.select(P_COLS).to_numpy(), strict=True))

    def _probs(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
        by_pair = self.held_forecasts(pairs)
        missing = [p for p in pairs["pair_id"].to_list() if p not in by_pair]
        if missing:
            why = self.refusal or f"{self.model_ref}: committed forecasts answer only the pairs of their run"
            raise ValueError(f"{why}; it holds no forecast of {len(missing)} of the {pairs.height} pairs "
                             f"(first: {missing[0]})")
        return np.stack([by_pair[p] for p in pairs["pair_id"].to_list()])

    def forecast_rows(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]] | None = None) -> pl.DataFrame:
        """Rows of the pairs it holds (every repeat), stored under model_ref; the others left out."""
        if pairs.is_empty():
            return pl.DataFrame()
        return self._variant_rows(pairs).with_columns(pl.lit(self.model_ref).alias("model_ref"))
