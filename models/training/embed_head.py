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
    save_embed_head(path, head, axes, spec)      # what a pair no run held needs (load_embed_head)
    head.portable()                              # the same forecasts without scikit-learn

scikit-learn is imported where the trees are fitted or loaded, not here: a portable head
(`EmbedHead.portable`, its trees models.classical.tree_walk.FlatTrees) forecasts on a host
with numpy alone through the same `predict_proba`.
"""

from __future__ import annotations

import dataclasses
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

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
    """A fitted regression of log2 S and its per-task Laplace spreads.

    `regressor` is anything with `predict(x) -> (n,)`: scikit-learn's HistGradientBoostingRegressor
    as fitted, or its FlatTrees twin (`portable`)."""

    regressor: Any
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

    def portable(self) -> EmbedHead:
        """This head with its trees as numpy arrays (models.classical.tree_walk.FlatTrees): the
        same forecasts, picklable and usable where scikit-learn is not installed."""
        from models.classical.tree_walk import FlatTrees

        trees = self.regressor if isinstance(self.regressor, FlatTrees) else FlatTrees.from_regressor(self.regressor)
        return EmbedHead(trees, self.pooled_scale, dict(self.task_scales), np.asarray(self.columns, dtype=bool))


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
    from sklearn.ensemble import HistGradientBoostingRegressor

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


HEAD_FORMAT = 1
# The one type of the trees skops does not trust by default; a file asking for any other is refused.
TRUSTED_TYPES = ["sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor"]
_SPEC, _AXES, _TREES = "spec.json", "axes.npz", "trees.skops"


def save_embed_head(path: str | Path, head: EmbedHead, axes: dict[str, np.ndarray], spec: dict[str, Any]) -> int:
    """One zip file of what forecasting a new pair takes: `spec` (JSON: the base model, prompt
    style, layers, parts and k, feature names, ...), the head's spreads and columns, the principal
    `axes` (mean, scale, axes) and the trees (skops, not pickle: loading runs no code). Returns
    its size in bytes (about 1 MB, mostly the trees)."""
    path = Path(path)
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v, dtype=np.float32) for k, v in axes.items()})
    import skops.io

    full = {**spec, "format": HEAD_FORMAT, "pooled_scale": float(head.pooled_scale),
            "task_scales": {str(k): float(v) for k, v in head.task_scales.items()},
            "columns": [bool(c) for c in head.columns]}
    tmp = path.with_name(path.name + ".part")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(_SPEC, json.dumps(full, indent=1, sort_keys=True))
        z.writestr(_AXES, buf.getvalue())
        z.writestr(_TREES, skops.io.dumps(head.regressor))
    tmp.replace(path)
    return path.stat().st_size


def read_head_spec(path: str | Path) -> dict[str, Any]:
    """The spec of a `save_embed_head` file, trees and axes left unread.

    Raises:
        ValueError: the file is missing, damaged or of another format (one line).
    """
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            spec = json.loads(z.read(_SPEC))
    except FileNotFoundError:
        raise ValueError(f"{path}: no such embedding-head file") from None
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path}: not an embedding-head file ({type(e).__name__}: {e})") from None
    if spec.get("format") != HEAD_FORMAT:
        raise ValueError(f"{path}: embedding-head format {spec.get('format')!r}, this code reads {HEAD_FORMAT}")
    return spec


def load_embed_head(path: str | Path) -> tuple[EmbedHead, dict[str, np.ndarray], dict[str, Any]]:
    """(head, axes, spec) of a `save_embed_head` file.

    Raises:
        ValueError: the file is missing, damaged, of another format or asks to load other types (one line).
    """
    import skops.io

    path = Path(path)
    spec = read_head_spec(path)
    try:
        with zipfile.ZipFile(path) as z:
            with np.load(io.BytesIO(z.read(_AXES))) as npz:
                axes = {k: npz[k] for k in npz.files}
            trees = z.read(_TREES)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path}: not an embedding-head file ({type(e).__name__}: {e})") from None
    try:
        untrusted = sorted(set(skops.io.get_untrusted_types(data=trees)) - set(TRUSTED_TYPES))
        if not untrusted:
            regressor = skops.io.loads(trees, trusted=TRUSTED_TYPES)
    except Exception as e:  # noqa: BLE001 - skops raises several kinds on a damaged blob
        raise ValueError(f"{path}: its trees do not load ({type(e).__name__}: {e})") from None
    if untrusted:
        raise ValueError(f"{path}: its trees ask to load {untrusted[0]}, which is not a tree of scikit-learn's")
    head = EmbedHead(regressor, float(spec["pooled_scale"]), {k: float(v) for k, v in spec["task_scales"].items()},
                     np.asarray(spec["columns"], dtype=bool))
    return head, axes, spec
