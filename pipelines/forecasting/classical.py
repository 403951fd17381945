"""A registered classical version (cost model or text model) as a forecaster adapter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl

from pipelines.forecasting.base import PairForecaster


class ClassicalForecaster(PairForecaster):
    """`model.predict_proba` over the pair frame of the records (models.classical.features):
    calibrated inside the model, so nothing is applied on top. Records without generator
    metadata give missing knob and family columns, which the models route like any missing value."""

    def __init__(self, model: Any, model_ref: str, kind: str):
        self.model, self.model_ref, self.kind = model, model_ref, kind

    def _probs(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
        from models.classical.features import pair_frame

        frame = pair_frame([kernels[a] for a in pairs["anchor_kernel_id"]],
                           [kernels[c] for c in pairs["candidate_kernel_id"]])
        return self.model.predict_proba(frame)
