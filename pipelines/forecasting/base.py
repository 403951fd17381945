"""What every forecaster adapter shares: pairs and kernel records in, (n, 8) out.

An adapter answers `forecast_pairs(pairs, kernels)`: `pairs` is a polars frame (pair_id,
anchor_kernel_id, candidate_kernel_id, task, hardware_id; the oracle also reads true_bin or
speedup), `kernels` maps kernel_id -> kernel record (source, task, language; generator,
algorithm, knobs_json and compile features when known). Row i of the answer is pair i's
distribution over the eight bins of models/bins.py.

`forecast_rows` gives the same forecasts as rows of the warehouse `forecasts` table, and
`predict_kernels(anchor, candidates, hardware_id)` is the budgeted search's hook (candidates'
kernel records against one anchor), so one adapter serves the evaluation, the command line,
the search and the autotuner. `RecordsForecaster` makes any other object answering
`predict_kernels` one of them (a forecaster file's cost model, which lives in models/, below
this package), and remembers its answers when asked to (a simulation's repeated pairs).

polars loads with the frame functions only: a bare GPU host's live search imports this module
and the references (pipelines.forecasting.references) without it, and their `predict_kernels`
needs none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from models.bins import BIN_LOG2_VALUES, NUM_BINS
from warehouse.bin_edges import P_COLS

if TYPE_CHECKING:  # see the module docstring
    import polars as pl

PAIR_COLUMNS = ("pair_id", "anchor_kernel_id", "candidate_kernel_id", "task", "hardware_id")
_R = np.asarray(BIN_LOG2_VALUES, dtype=np.float64)


def checked_probs(p: Any, n: int) -> np.ndarray:
    """A forecaster's answer as a valid (n, 8) array, rows renormalised.

    Raises:
        ValueError: wrong shape, non-finite or negative values, or an all-zero row.

    >>> checked_probs([[2, 0, 0, 0, 0, 0, 0, 2]], 1)[0].tolist()
    [0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5]
    """
    arr = np.asarray(p, dtype=np.float64)
    if arr.shape != (n, NUM_BINS):
        raise ValueError(f"forecaster returned shape {arr.shape}, expected ({n}, {NUM_BINS})")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError("forecaster returned negative or non-finite probabilities")
    sums = arr.sum(axis=1)
    if np.any(sums <= 0):
        raise ValueError("forecaster returned an all-zero row")
    return arr / sums[:, None]


def expected_log2(p: np.ndarray) -> np.ndarray:
    """Expected log2-speedup of each row of (n, 8) probabilities: sum_b p_b r_b, r the bins'
    representative log2 values (method.md section 4); the search's score of a candidate.

    >>> float(expected_log2(np.eye(8)[[7]])[0]), float(expected_log2(np.full((1, 8), 1 / 8))[0])
    (2.5, 0.0)
    """
    return np.asarray(p, dtype=np.float64) @ _R


def check_pairs(pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]], needs_kernels: bool = True) -> None:
    """Raise ValueError (one line) when a pair column or a kernel record is missing."""
    missing = [c for c in PAIR_COLUMNS if c not in pairs.columns]
    if missing:
        raise ValueError(f"pairs frame is missing column(s): {', '.join(missing)}")
    if needs_kernels and pairs.height:
        ids = set(pairs["anchor_kernel_id"].to_list()) | set(pairs["candidate_kernel_id"].to_list())
        absent = sorted(str(i) for i in ids if i not in kernels)
        if absent:
            raise ValueError(f"no kernel record for {len(absent)} kernel(s) of the pairs (first: {absent[0]})")


def rows_of(pairs: pl.DataFrame, p: np.ndarray, model_ref: str, parse_ok: Sequence[bool] | None = None,
            parse_error: Sequence[str | None] | None = None, raw_sum: Sequence[float | None] | None = None,
            repeat: Sequence[int] | None = None) -> pl.DataFrame:
    """Rows for the warehouse `forecasts` table of forecasts `p` (n, 8) of `pairs`."""
    import polars as pl

    n = pairs.height
    bins = (np.argmax(p, axis=1) + 1).astype(np.int64) if n else np.zeros(0, dtype=np.int64)
    base = pl.DataFrame({
        "pair_id": pairs["pair_id"], "model_ref": [model_ref] * n,
        "repeat": list(repeat) if repeat is not None else [0] * n,
        "predicted_bin": bins, "argmax_bin": bins,
        "raw_sum": list(raw_sum) if raw_sum is not None else p.sum(axis=1).tolist(),
        "parse_ok": list(parse_ok) if parse_ok is not None else [True] * n,
        "parse_error": list(parse_error) if parse_error is not None else [None] * n,
    }, schema_overrides={"raw_sum": pl.Float64, "parse_error": pl.Utf8, "repeat": pl.Int64})
    probs = pl.DataFrame({c: p[:, i] for i, c in enumerate(P_COLS)}, schema={c: pl.Float64 for c in P_COLS})
    return pl.concat([base, probs], how="horizontal")


def single_anchor_pairs(anchor: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]],
                        hardware_id: str) -> tuple[pl.DataFrame, dict[str, Mapping[str, Any]]]:
    """The pairs frame and kernel records of candidates against one anchor (the search's call).

    Kernel ids are made unique per position, so two records under one id stay two kernels."""
    import polars as pl

    kernels: dict[str, Mapping[str, Any]] = {"anchor": anchor}
    rows = []
    for i, c in enumerate(candidates):
        kernels[f"candidate-{i}"] = c
        rows.append({"pair_id": f"pair-{i}", "anchor_kernel_id": "anchor", "candidate_kernel_id": f"candidate-{i}",
                     "task": str(c.get("task") or anchor.get("task") or ""), "hardware_id": hardware_id})
    schema = {c: pl.Utf8 for c in PAIR_COLUMNS}
    return pl.DataFrame(rows, schema=schema), kernels


class PairForecaster:
    """Base of every adapter. Subclasses set `kind` and `model_ref` and implement `_probs`.

    Attributes:
        kind: cost_model | text_model | llm | committed | baseline.
        model_ref: what its rows are stored under (models:/name/N, h200:<variant>, baseline:...).
        needs_metadata: False for every adapter: generator metadata (algorithm, knobs_json,
            generator) is used when a record carries it, never required.
        needs_kernels: False when the forecast never reads a kernel record (references,
            committed forecasts keyed by kernel ids).
        source: how it came to be, in words (for the evaluation's listing and the command line).
    """

    kind: str = ""
    model_ref: str = ""
    source: str = ""
    needs_metadata: bool = False
    needs_kernels: bool = True
    known_features: Mapping[str, Mapping[str, Any]] = {}  # kernel_id -> compile features to fill in

    def with_known_features(self, features: Mapping[str, Mapping[str, Any]]) -> PairForecaster:
        """Fill the compile features `features` knows (e.g. the warehouse's) into kernel records
        that lack them (the search's records carry only what the generator knows); returns self."""
        self.known_features = dict(features)
        return self

    @property
    def name(self) -> str:  # what the search prints
        return f"{self.model_ref} ({self.kind})"

    def forecast_pairs(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
        """(n, 8) probabilities, row i for pairs[i].

        Raises:
            ValueError: a pair column or kernel record is missing, or the adapter cannot answer
                a pair (one line).
        """
        check_pairs(pairs, kernels, self.needs_kernels)
        if pairs.is_empty():
            return np.zeros((0, NUM_BINS))
        if self.known_features:
            from models.classical.features import with_compile_features

            kernels = {k: with_compile_features(r, self.known_features) for k, r in kernels.items()}
        return np.asarray(self._probs(pairs, kernels), dtype=np.float64)

    def answer_pairs(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]],
                     strict: bool = False) -> list[tuple[list[float] | None, str | None]]:
        """Per pair, (its 8 probabilities, None) or (None, why it has no forecast): what a caller
        that shows each candidate its own answer (`kernelcast forecast`) reads. Here every pair
        is answered; a language model's adapter may leave a pair without one.

        Args:
            strict: a pair the forecaster cannot take raises instead of being a row (one
                candidate: its refusal is the command's error).
        Raises:
            ValueError: as `forecast_pairs` (one line).
        """
        return [(list(map(float, row)), None) for row in self.forecast_pairs(pairs, kernels)]

    def forecast_rows(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]]) -> pl.DataFrame:
        """Rows for the warehouse `forecasts` table, one per pair (repeat 0, parsed)."""
        if pairs.is_empty():
            import polars as pl

            return pl.DataFrame()
        return rows_of(pairs, self.forecast_pairs(pairs, kernels), self.model_ref)

    def predict_kernels(self, anchor: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]],
                        hardware_id: str) -> np.ndarray:
        """The search's hook: (n, 8) forecasts of each candidate against one anchor."""
        pairs, kernels = single_anchor_pairs(anchor, candidates, hardware_id)
        return self.forecast_pairs(pairs, kernels)

    def _probs(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model_ref!r}, kind={self.kind!r})"


class RecordsForecaster(PairForecaster):
    """Any object answering `predict_kernels(anchor, candidates, hardware_id) -> (n, 8)` as a
    PairForecaster: a forecaster file's object (models.classical.portable.PortableCostModel
    cannot descend from this class: models/ stands below pipelines/), or any forecaster whose
    answers should be remembered.

    With `remember`, answers are kept per (hardware, anchor record, candidate record): a
    simulation's runs (modes x seeds of a task) propose the same kernels again and again, and a
    row depends on its anchor and candidate only, so asking once per distinct pair gives every
    run the same rows without a model call per repeat. Records are compared whole (parent and
    mutation included), so a candidate proposed from another parent is asked again.

    Args:
        inner: the object asked.
        remember: keep its answers (`calls` counts the calls that reached it).
    """

    def __init__(self, inner: Any, remember: bool = False):
        if not callable(getattr(inner, "predict_kernels", None)):
            raise ValueError(f"a {type(inner).__name__} has no predict_kernels")
        self.inner, self.remember = inner, remember
        self.kind = str(getattr(inner, "kind", "") or "")
        self.model_ref = str(getattr(inner, "model_ref", "") or "")
        self.source = str(getattr(inner, "source", "") or "")
        self.memo: dict[tuple[str, str, str], np.ndarray] = {}
        self.calls = 0

    @property
    def name(self) -> str:  # the inner object's own name, or nothing (the caller's fallback then)
        return str(getattr(self.inner, "name", "") or "")

    @staticmethod
    def _key(record: Mapping[str, Any]) -> str:
        return json.dumps(record, sort_keys=True, default=str)

    def _ask(self, anchor: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]], hardware_id: str) -> np.ndarray:
        self.calls += 1
        rows = np.asarray(self.inner.predict_kernels(anchor, list(candidates), hardware_id), dtype=np.float64)
        if rows.shape != (len(candidates), NUM_BINS):
            raise ValueError(f"forecaster returned shape {rows.shape}, expected ({len(candidates)}, {NUM_BINS})")
        return rows

    def predict_kernels(self, anchor: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]],
                        hardware_id: str) -> np.ndarray:
        """The inner object's rows, as answered: the caller validates and normalises them
        (checked_probs), as it would the inner object's own. An error leaves nothing remembered."""
        if not self.remember:
            return self._ask(anchor, candidates, hardware_id)
        a = self._key(anchor)
        keys = [(hardware_id, a, self._key(c)) for c in candidates]
        todo: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        for k, c in zip(keys, candidates):
            if k not in self.memo:
                todo.setdefault(k, c)
        if todo:
            self.memo.update(zip(todo, self._ask(anchor, list(todo.values()), hardware_id)))
        return np.stack([self.memo[k] for k in keys]) if keys else np.zeros((0, NUM_BINS))

    def _probs(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
        """The pairs asked per (anchor, hardware), in the pairs' order."""
        out = np.zeros((pairs.height, NUM_BINS))
        groups: dict[tuple[str, str], list[int]] = {}
        for i, (a, h) in enumerate(zip(pairs["anchor_kernel_id"].to_list(), pairs["hardware_id"].to_list())):
            groups.setdefault((a, h), []).append(i)
        cands = pairs["candidate_kernel_id"].to_list()
        for (a, h), idx in groups.items():
            out[idx] = self.predict_kernels(kernels[a], [kernels[cands[i]] for i in idx], h)
        return out
