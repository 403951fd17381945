"""A fitted cost model as a forecaster that needs numpy and pandas only.

Where it is used: a GPU host's live search and Triton autotune hook (pipelines.search.live,
pipelines.search.autotune) run with torch, triton, numpy and pandas, without scikit-learn or
scipy, so the cost model cannot be unpickled there. `PortableCostModel.from_cost_model` keeps
what prediction needs: the feature space, the column encoding scikit-learn applies before its
trees, every tree as flat arrays, the per-task Laplace spreads, the calibrator, and the compile
features of the kernels the warehouse knows (the search's kernel records carry none). Its
forecasts equal the fitted model's (tests/forecasting/test_portable_cost_model.py compares them).

Tree walk: HistGradientBoostingRegressor's own rule (models.classical.tree_walk).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from models.calibration import Calibrator
from models.classical.features import (
    COMPILE_FIELDS,
    FeatureSpace,
    pair_frame,
    scale_keys,
    with_compile_features,
    work_ratio,
)
from models.classical.spread import laplace_bins
from models.classical.tree_walk import TREE_FIELDS, flatten_trees, walk_trees
from models.classical.work_prior import WorkPrior, launch_kinds

PORTABLE_FORMAT = "kernelcast-portable-cost-model/1"  # what `save` writes; `load` reads only this


# (kernel records, worker processes) -> one compile-feature row per record (status + COMPILE_FIELDS)
Compiler = Callable[[list[Mapping[str, Any]], int], list[Mapping[str, Any]]]


class PortableCostModel:
    """The prediction half of a fitted models.classical.cost_model.CostModel.

    Build one with `from_cost_model`; pickle it (a forecaster file for the search) or `save` it
    (arrays and JSON, read back by `load` without running code: the registry snapshot of
    pipelines.forecasting.snapshot); call `predict_kernels` (the search's hook) or
    `predict_proba` on a pair frame.
    """

    kind = "cost_model"

    def __init__(self, space: FeatureSpace, order: list[int], categories: dict[int, list[Any]],
                 trees: dict[str, np.ndarray], roots: np.ndarray, bitsets: np.ndarray, baseline: float,
                 scale: float, task_scales: Mapping[str, float], calibrator: Calibrator,
                 features: Mapping[str, Mapping[str, Any]] | None = None, name: str = "cost_model",
                 compile_workers: int = 0, compiler: Compiler | None = None, prior: WorkPrior | None = None):
        self.space, self.order, self.categories = space, order, categories
        self.prior = prior  # the cost model's work prior (None: a model fitted without one)
        self.trees, self.roots, self.bitsets, self.baseline = trees, roots, bitsets, baseline
        self.scale, self.task_scales, self.calibrator = scale, dict(task_scales), calibrator
        self.features = {k: dict(v) for k, v in (features or {}).items()}
        self.name = name
        self.compile_workers = compile_workers
        self.compiler = compiler

    @classmethod
    def from_cost_model(cls, model: Any, features: Mapping[str, Mapping[str, Any]] | None = None,
                        name: str = "cost_model", compile_workers: int = 0,
                        compiler: Compiler | None = None) -> PortableCostModel:
        """The portable twin of a fitted, calibrated CostModel.

        Args:
            model: a fitted CostModel (its `regressor_` a HistGradientBoostingRegressor).
            features: kernel id -> compile features (models.classical.features.COMPILE_FIELDS),
                filled into kernel records that lack them.
            name: what the search prints for it.
            compile_workers: > 0 compiles and traces the Triton candidates `features` lacks for
                sm_90 (with `compiler`, that many child processes) before forecasting them:
                without their compile features the H200 eval Brier rises from 0.261 to 0.346.
            compiler: (records, n_workers) -> one compile-feature row per record, e.g.
                pipelines.forecasting.source_features.source_features_many; given by the
                caller, since compiling kernels is the pipelines' work, not the model's.
        Raises:
            ValueError: the model is unfitted, its regressor is not one this walk reproduces, or
                compile_workers > 0 comes without a compiler.
        """
        if compile_workers > 0 and compiler is None:
            raise ValueError("compile_workers > 0 needs a compiler (e.g. source_features_many)")
        reg = getattr(model, "regressor_", None)
        if reg is None or not hasattr(reg, "_predictors"):
            raise ValueError("need a fitted cost model (a HistGradientBoostingRegressor inside)")
        if getattr(reg, "loss", "squared_error") != "squared_error":
            raise ValueError(f"the portable walk reproduces the squared-error loss only, not {reg.loss!r}")
        order, categories = _column_encoding(reg)
        trees, roots, bitsets = flatten_trees([p for it in reg._predictors for p in it])
        return cls(model.space_, order, categories, trees, roots, bitsets, float(np.ravel(reg._baseline_prediction)[0]),
                   float(model.scale_), model.task_scales_, model.calibrator_, features, name, compile_workers,
                   compiler if compile_workers > 0 else None, getattr(model, "prior_", None))

    # ---- a file without pickle --------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the prediction half to `path` (NumPy .npz: the trees as arrays, the rest as one
        JSON text), which `load` reads back without running code (no pickle). The kernels'
        known features and the compiler are not kept."""
        head = {"format": PORTABLE_FORMAT, "name": self.name, "baseline": self.baseline, "scale": self.scale,
                "task_scales": self.task_scales, "calibrator": self.calibrator.to_dict(),
                "space": {"numeric": self.space.numeric, "categorical": self.space.categorical,
                          "columns": self.space.columns},
                "order": self.order, "categories": {str(k): v for k, v in self.categories.items()},
                "prior": self.prior.to_dict() if self.prior is not None else None}
        path = Path(path)
        with path.open("wb") as f:
            np.savez(f, head=np.array(json.dumps(head)), roots=self.roots, bitsets=self.bitsets,
                     **{f"tree_{k}": v for k, v in self.trees.items()})
        return path

    @classmethod
    def load(cls, path: str | Path) -> PortableCostModel:
        """The model `save` wrote.

        Raises:
            ValueError: the file is not one `save` wrote (one line).
        """
        try:
            with np.load(path, allow_pickle=False) as z:
                head = json.loads(str(z["head"]))
                if head.get("format") != PORTABLE_FORMAT:
                    raise ValueError(f"format {head.get('format')!r}, not {PORTABLE_FORMAT}")
                trees = {k: z[f"tree_{k}"] for k in TREE_FIELDS}
                roots, bitsets = z["roots"], z["bitsets"]
        except (OSError, KeyError, ValueError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: not a saved portable cost model: {exc}".splitlines()[0]) from None
        space = FeatureSpace()
        space.numeric = list(head["space"]["numeric"])
        space.categorical = {k: list(v) for k, v in head["space"]["categorical"].items()}
        space.columns = list(head["space"]["columns"])
        return cls(space, [int(i) for i in head["order"]], {int(k): v for k, v in head["categories"].items()},
                   trees, roots, bitsets, float(head["baseline"]), float(head["scale"]),
                   {k: float(v) for k, v in head["task_scales"].items()}, Calibrator.from_dict(head["calibrator"]),
                   name=str(head["name"]), prior=WorkPrior.from_dict(head["prior"]) if head.get("prior") else None)

    # ---- prediction ------------------------------------------------------------------------
    def encode(self, table: pd.DataFrame) -> np.ndarray:
        """The float matrix the trees read: columns in scikit-learn's order, categories as codes."""
        out = np.full((len(table), len(self.order)), np.nan)
        for j, col in enumerate(self.order):
            values = table.iloc[:, col]
            if col in self.categories:
                codes = {v: i for i, v in enumerate(self.categories[col])}
                out[:, j] = [codes.get(v, np.nan) if isinstance(v, str) else np.nan for v in values.astype(object)]
            else:
                out[:, j] = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64)
        return out

    def predict_log2(self, frame: pd.DataFrame) -> np.ndarray:
        """The point forecast of log2 S per pair of a pair frame."""
        x = self.encode(self.space.transform(frame))
        mu = walk_trees(x, self.trees, self.roots, self.bitsets, self.baseline)
        if self.prior is None:
            return mu
        return self.prior.apply(mu, np.zeros(len(mu)), work_ratio(frame), launch_kinds(frame))[0]

    def predict_proba(self, frame: pd.DataFrame) -> np.ndarray:
        """Calibrated (n, 8) probabilities of bins 1..8, as CostModel.predict_proba."""
        if len(frame) == 0:
            return np.zeros((0, 8))
        scales = np.array([self.task_scales.get(k, self.task_scales.get(k.split("|")[0], self.scale))
                           for k in scale_keys(frame)], dtype=np.float64)
        if self.prior is not None:
            scales = self.prior.apply(np.zeros(len(scales)), scales, work_ratio(frame), launch_kinds(frame))[1]
        return self.calibrator.apply(laplace_bins(self.predict_log2(frame), scales))

    def compile_missing(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Compile and trace the Triton kernels among `records` whose features are unknown
        (with the compiler given at construction) and remember them (`compile_missing`)."""
        return compile_missing(records, self.features, self.compiler, self.compile_workers)

    def predict_kernels(self, anchor: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]],
                        hardware_id: str) -> np.ndarray:
        """(n, 8) forecasts of each candidate against one anchor (the search's hook)."""
        self.compile_missing([anchor, *candidates])
        a = with_compile_features(anchor, self.features)
        return self.predict_proba(pair_frame([a] * len(candidates),
                                             [with_compile_features(c, self.features) for c in candidates]))


def compile_missing(records: Sequence[Mapping[str, Any]], features: dict[str, dict[str, Any]],
                    compiler: Compiler | None, workers: int) -> int:
    """Compile and trace the Triton kernels among `records` whose compile features neither
    `features` (kernel id -> features, updated here; a failed compile is remembered as {}) nor
    the record holds, with `compiler` in `workers` processes; how many were done (0 without a
    compiler or workers)."""
    todo = {str(r.get("kernel_id")): r for r in records
            if r.get("source") and (r.get("language") or "triton") == "triton"
            and str(r.get("kernel_id")) not in features and all(r.get(f) is None for f in COMPILE_FIELDS)}
    if not todo or workers <= 0 or compiler is None:
        return 0
    rows = compiler(list(todo.values()), workers)
    for kid, row in zip(todo, rows, strict=True):
        ok = row["status"] in ("ok", "partial")
        features[kid] = {f: row[f] for f in COMPILE_FIELDS if row.get(f) is not None} if ok else {}
    return len(todo)


def _column_encoding(reg: Any) -> tuple[list[int], dict[int, list[Any]]]:
    """scikit-learn's column order after its ColumnTransformer (encoded categoricals first, then
    the numeric columns) and, per categorical input column, its categories in code order."""
    pre = getattr(reg, "_preprocessor", None)
    if pre is None:  # no categorical feature: the table goes to the trees as it is
        return list(range(reg.n_features_in_)), {}
    order: list[int] = []
    categories: dict[int, list[Any]] = {}
    for part, trans, cols in pre.transformers_:
        if isinstance(trans, str) and trans == "drop":
            continue
        # scikit-learn 1.9 passes numeric columns through a FunctionTransformer named "numerical"
        # (check_array to float64): the identity here
        if not hasattr(trans, "categories_") and trans != "passthrough" and part != "numerical":
            raise ValueError(f"cannot reproduce the column transform {part!r} ({type(trans).__name__})")
        idx = np.flatnonzero(cols) if np.asarray(cols).dtype == bool else np.asarray(cols, dtype=np.int64)
        if hasattr(trans, "categories_"):  # the OrdinalEncoder
            for col, cats in zip(idx, trans.categories_, strict=True):
                categories[int(col)] = [c for c in cats if isinstance(c, str)]
        order += [int(i) for i in idx]
    return order, categories


__all__ = ["COMPILE_FIELDS", "PortableCostModel", "compile_missing"]
