"""Boosted trees on a language model's reading of both sources: the `code-embed` LLM variant.

The base model (SmolLM2-135M-Instruct, frozen) reads each pair's prompt once on a GPU host
(models.training.gpu_host.llm_code); of its hidden states a few dozen principal coordinates per
pair come back (`embeddings.parquet`, axes fitted on the training rows alone), with the eight
zero-shot label logits. Here a gradient-boosted regression of log2 S reads them beside the pair's
source-derived feature vector (the bundle's `features`), and a Laplace spread per task turns its
point forecast into the eight bins (models.classical.spread), the spread fitted on the
calibration pairs by Brier, as the cost model does.

Why trees and not the MLP head of models.training.head: on the H200 eval set the MLP on hidden
states and features scored 0.354 against the boosted cost model's 0.294 on the features alone;
boosted trees are the stronger learner on a few thousand tabular rows, and the question a head
answers is what the language model's reading adds to the features (`ablation` below).

    head = fit_embed_head(x_fit, log2_fit, x_cal, y_cal, tasks_cal)
    p = head.predict_proba(x_eval, tasks_eval)   # (n, 8)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.ensemble import HistGradientBoostingRegressor

from models.classical.spread import fit_scales, laplace_bins


@dataclass(frozen=True)
class EmbedHeadSettings:
    """The boosted regression's settings: the cost model's (models.classical.cost_model), whose
    trees face the same rows."""

    max_iter: int = 400
    learning_rate: float = 0.05
    max_leaf_nodes: int = 31
    min_samples_leaf: int = 20
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class EmbedHead:
    """A fitted regression of log2 S and its per-task Laplace spreads."""

    regressor: HistGradientBoostingRegressor
    pooled_scale: float
    task_scales: dict[str, float]
    columns: np.ndarray  # (width,) bool: the columns the fit rows knew (a column never known is dropped)

    def predict_log2(self, x: np.ndarray) -> np.ndarray:
        return self.regressor.predict(np.asarray(x, dtype=np.float64)[:, self.columns])

    def predict_proba(self, x: np.ndarray, tasks) -> np.ndarray:
        """(n, 8) bin probabilities; a task unseen at calibration gets the pooled spread."""
        if len(x) == 0:
            return np.zeros((0, 8))
        scales = np.array([self.task_scales.get(str(t), self.pooled_scale) for t in tasks], dtype=np.float64)
        p = laplace_bins(self.predict_log2(x), scales)
        return p / p.sum(axis=1, keepdims=True)


def fit_embed_head(x_fit: np.ndarray, log2_fit: np.ndarray, x_cal: np.ndarray, y_cal: np.ndarray, tasks_cal,
                   settings: EmbedHeadSettings = EmbedHeadSettings()) -> EmbedHead:
    """Fit the regression on the fit rows (log2 S), then the spreads on the calibration rows (bins).

    Raises:
        ValueError: no fit or calibration rows, or rows of different widths (one line).
    """
    if len(x_fit) == 0 or len(x_cal) == 0:
        raise ValueError(f"an embedding head needs fit and calibration rows (got {len(x_fit)} and {len(x_cal)})")
    if x_fit.shape[1] != x_cal.shape[1]:
        raise ValueError(f"fit rows are {x_fit.shape[1]} wide, calibration rows {x_cal.shape[1]}")
    reg = HistGradientBoostingRegressor(max_iter=settings.max_iter, learning_rate=settings.learning_rate,
                                        max_leaf_nodes=settings.max_leaf_nodes,
                                        min_samples_leaf=settings.min_samples_leaf, early_stopping=False,
                                        random_state=settings.seed)
    x_fit = np.asarray(x_fit, dtype=np.float64)
    columns = np.isfinite(x_fit).any(axis=0)  # the binning refuses a column that is all missing
    reg.fit(x_fit[:, columns], np.asarray(log2_fit, dtype=np.float64))
    head = EmbedHead(reg, 0.0, {}, columns)
    head.pooled_scale, head.task_scales = fit_scales(head.predict_log2(x_cal), np.asarray(y_cal), list(tasks_cal))
    return head
