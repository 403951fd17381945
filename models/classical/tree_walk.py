"""Fitted HistGradientBoostingRegressor trees as flat arrays, walked with numpy alone.

Why: a GPU host forecasts with torch, numpy and pandas, without scikit-learn, so a fitted
regressor cannot be unpickled there. `flatten_trees` keeps every tree's nodes in one set of
arrays (child indices made global) and `walk_trees` follows scikit-learn's own rule over them:
a missing value follows the node's `missing_go_to_left`; a categorical split sends a category
left when its bit is set in the node's bitset (an unknown category, encoded as missing, goes the
missing way); a numeric split goes left when x <= threshold. The leaves are added tree by tree
from the baseline, as scikit-learn adds them, so the sums match its predictions to the last bit.

Used by the portable cost model (models.classical.portable) and the portable code-embed head
(`FlatTrees`, models.training.embed_head.EmbedHead.portable).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

TREE_FIELDS = ("feature_idx", "num_threshold", "missing_go_to_left", "left", "right", "is_leaf", "value",
               "is_categorical", "bitset_idx")


def flatten_trees(predictors: Sequence[Any]) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """(node arrays by TREE_FIELDS, each tree's root index, the categorical bitsets) of
    scikit-learn TreePredictors."""
    parts: dict[str, list[np.ndarray]] = {f: [] for f in TREE_FIELDS}
    roots, bitsets = [], []
    n_nodes = n_bitsets = 0
    for p in predictors:
        nodes = p.nodes
        roots.append(n_nodes)
        for f in TREE_FIELDS:
            col = np.asarray(nodes[f])
            if f in ("left", "right"):
                col = col.astype(np.int64) + n_nodes
            elif f == "bitset_idx":
                col = col.astype(np.int64) + n_bitsets
            parts[f].append(col)
        raw = np.asarray(p.raw_left_cat_bitsets, dtype=np.uint32).reshape(-1, 8)
        bitsets.append(raw)
        n_nodes += len(nodes)
        n_bitsets += len(raw)
    trees = {f: np.concatenate(v) for f, v in parts.items()}
    for f in ("missing_go_to_left", "is_leaf", "is_categorical"):
        trees[f] = trees[f].astype(bool)
    trees["feature_idx"] = trees["feature_idx"].astype(np.int64)
    trees["num_threshold"] = trees["num_threshold"].astype(np.float64)
    trees["value"] = trees["value"].astype(np.float64)
    all_bits = np.concatenate(bitsets) if n_bitsets else np.zeros((1, 8), dtype=np.uint32)
    return trees, np.asarray(roots, dtype=np.int64), all_bits


def walk_trees(x: np.ndarray, trees: dict[str, np.ndarray], roots: np.ndarray, bitsets: np.ndarray,
               baseline: float) -> np.ndarray:
    """The regression's raw prediction of each row of `x` (n, width; categories as codes, NaN
    for missing), as scikit-learn's `_raw_predict` gives it."""
    t = trees
    node = np.broadcast_to(roots, (len(x), len(roots))).copy()
    rows = np.arange(len(x))[:, None]
    while True:
        inner = ~t["is_leaf"][node]
        if not inner.any():
            break
        v = x[rows, t["feature_idx"][node]]
        missing = np.isnan(v)
        cat = t["is_categorical"][node]
        code = np.where(missing | ~cat, 0, v).astype(np.int64)
        word = bitsets[np.minimum(t["bitset_idx"][node], len(bitsets) - 1), np.clip(code // 32, 0, bitsets.shape[1] - 1)]
        in_set = ((word >> (code % 32).astype(np.uint32)) & 1).astype(bool) & (code < 32 * bitsets.shape[1])
        go_left = np.where(missing, t["missing_go_to_left"][node],
                           np.where(cat, in_set, np.nan_to_num(v) <= t["num_threshold"][node]))
        nxt = np.where(go_left, t["left"][node], t["right"][node])
        node = np.where(inner, nxt, node)
    # tree by tree from the baseline, as scikit-learn adds them (a cumulative sum is that order;
    # a plain sum pairs them and differs in the last bits)
    leaves = np.column_stack([np.full(len(x), baseline), t["value"][node]])
    return np.cumsum(leaves, axis=1)[:, -1]


class FlatTrees:
    """A fitted squared-error HistGradientBoostingRegressor on numeric columns, as `predict`
    needs it: numpy arrays only (picklable where scikit-learn is not installed)."""

    def __init__(self, trees: dict[str, np.ndarray], roots: np.ndarray, bitsets: np.ndarray, baseline: float):
        self.trees, self.roots, self.bitsets, self.baseline = trees, roots, bitsets, float(baseline)

    @classmethod
    def from_regressor(cls, reg: Any) -> FlatTrees:
        """The flat twin of a fitted regressor.

        Raises:
            ValueError: unfitted, another loss, or categorical columns (whose encoding this
                class does not keep; models.classical.portable does) (one line).
        """
        if not hasattr(reg, "_predictors"):
            raise ValueError("need a fitted HistGradientBoostingRegressor")
        if getattr(reg, "loss", "squared_error") != "squared_error":
            raise ValueError(f"the flat walk reproduces the squared-error loss only, not {reg.loss!r}")
        if getattr(reg, "_preprocessor", None) is not None or np.any(getattr(reg, "is_categorical_", None) or False):
            raise ValueError("the regressor has categorical columns; FlatTrees reads numeric ones only")
        trees, roots, bitsets = flatten_trees([p for it in reg._predictors for p in it])
        return cls(trees, roots, bitsets, float(np.ravel(reg._baseline_prediction)[0]))

    def predict(self, x: np.ndarray) -> np.ndarray:
        """(n,) predictions of the rows of `x` (n, width), NaN for missing."""
        return walk_trees(np.asarray(x, dtype=np.float64), self.trees, self.roots, self.bitsets, self.baseline)
