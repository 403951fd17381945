"""Forecasts of kernel sources: an adapter loaded once, a reader kept warm.

`SourceForecaster` is one of the one forecaster type (a PairForecaster around any loaded
adapter: pairs and kernel records go to the adapter as they are) whose front door takes kernel
sources instead of records: it reads them itself (features, cache) and asks the adapter.

    f = SourceForecaster(adapter, n_workers=2, cache_dir=home / "feature-cache")
    p = f.forecast("softmax", anchor_src, [cand1, cand2])
    p.p, p.expected_log2_speedup, p.refused    # (n, 8), (n,), a reason or None per candidate
    f.predict(frame)       # the MLflow contract: task, anchor_source, candidate_source [, hardware]

(`pipelines.forecasting.open_forecaster` and `forecast_sources` build one from a model
reference; every registered version's pyfunc model is one, pipelines.forecasting.pyfunc.)

Sources are read by the one file reader (pipelines.forecasting.files.read_kernel_sources: import,
trace on the benchmark shapes, sm_90 compile, on a stand-in device of the hardware) in a
`feature_pool` whose children stay up between calls, and each answer is kept in a `FeatureCache`
by digest of the source (in memory, and under <home>/feature-cache when a home is given), so an
anchor is read once per search, not once per batch.

`predict` is what every registered version's MLflow pyfunc model answers
(pipelines.forecasting.pyfunc): one row per input row, p1..p8 summing to 1 and
`expected_log2_speedup` (the bins' representative log2 values of method.md, weighted), and
`refused`: None, or why the row could not be forecast (a source that does not parse, defines no
custom_kernel, does not import or does not compile for sm_90; an unknown task); a refused row's
numbers are NaN.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models.bins import NUM_BINS
from pipelines.forecasting.base import PairForecaster, expected_log2
from warehouse.bin_edges import P_COLS

DEFAULT_HARDWARE = "nvidia-h200-sm90"  # what `kernelcast forecast --hardware` defaults to
INPUT_COLUMNS = ("task", "anchor_source", "candidate_source")
OPTIONAL_INPUT_COLUMNS = ("hardware",)
OUTPUT_COLUMNS = (*P_COLS, "expected_log2_speedup", "refused")
FEATURE_CACHE_DIR = "feature-cache"  # under the home


@dataclass(frozen=True)
class SourceForecast:
    """Forecasts of candidates against one anchor.

    Attributes:
        p: (n, 8) bin probabilities, row i for candidate i; NaN where refused.
        refused: per candidate, None or why it has no forecast (one line).
    """

    p: np.ndarray
    refused: list[str | None]

    @property
    def expected_log2_speedup(self) -> np.ndarray:
        """(n,) sum_b p_b * r_b with the bins' representative log2 values; NaN where refused."""
        return expected_log2(self.p)


def source_name(source: str) -> str:
    """The kernel id a source is read under: a digest of its text, so equal sources are one kernel.

    >>> source_name("x = 1") == source_name("x = 1") != source_name("x = 2"), len(source_name("x"))
    (True, 23)
    """
    return "source-" + hashlib.sha256(source.encode()).hexdigest()[:16]


class SourceForecaster(PairForecaster):
    """A forecaster adapter (any kind: pipelines.forecasting.load) answering kernel sources
    (`forecast`, `predict`), and, as every PairForecaster, pairs of kernel records (passed to
    the adapter, one batch at a time).

    Args:
        adapter: a loaded adapter (a PairForecaster: `forecast_pairs(pairs, kernels) -> (n, 8)`).
        n_workers: reader children kept up (compile and trace of new sources).
        cache_dir: where read sources are kept across processes (None: this process only).
        compile_timeout_s: the reader's limit per source.
    """

    def __init__(self, adapter: Any, *, n_workers: int = 2, cache_dir: str | Path | None = None,
                 compile_timeout_s: float = 120.0):
        from pipelines.forecasting.source_features import FeatureCache, feature_pool

        self.adapter = adapter
        self.kind = getattr(adapter, "kind", "")
        self.source = getattr(adapter, "source", "")
        self.needs_kernels = getattr(adapter, "needs_kernels", True)
        self.n_workers = max(1, int(n_workers))
        self.compile_timeout_s = compile_timeout_s
        self.cache = FeatureCache(cache_dir)
        self.pool = feature_pool(self.n_workers)  # its children stop when it is collected, or at exit
        self._lock = threading.Lock()  # one batch at a time: the adapter need not be thread-safe
        self.seconds = {"read": 0.0, "forecast": 0.0}  # spent so far reading sources, and in the adapter

    @property
    def model_ref(self) -> str:
        return getattr(self.adapter, "model_ref", "")

    def _probs(self, pairs: Any, kernels: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
        with self._lock:
            return self.adapter.forecast_pairs(pairs, kernels)

    def answer_pairs(self, pairs: Any, kernels: Mapping[str, Mapping[str, Any]],
                     strict: bool = False) -> list[tuple[list[float] | None, str | None]]:
        """The adapter's own answers (a language model's may leave a pair without one)."""
        with self._lock:
            return self.adapter.answer_pairs(pairs, kernels, strict)

    def forecast(self, task: str, anchor_source: str, candidate_sources: Sequence[str],
                 hardware: str | None = None) -> SourceForecast:
        """Forecasts of each candidate's speedup over the anchor on `hardware`.

        Raises:
            ValueError: an unknown task, or the adapter cannot answer (one line).
        """
        from pipelines.tasks import get_task

        get_task(task)
        rows = [{"task": task, "anchor_source": anchor_source, "candidate_source": c, "hardware": hardware}
                for c in candidate_sources]
        p, refused = self._rows(rows)
        return SourceForecast(p, refused)

    def predict(self, frame: Any) -> Any:
        """The pyfunc contract: a pandas frame with task, anchor_source, candidate_source and
        optionally hardware in; one row per input row out (OUTPUT_COLUMNS), in order.

        Raises:
            ValueError: a required column is missing (one line).
        """
        import pandas as pd

        if not isinstance(frame, pd.DataFrame):
            frame = pd.DataFrame(frame)
        missing = [c for c in INPUT_COLUMNS if c not in frame.columns]
        if missing:
            raise ValueError(f"input lacks column(s) {', '.join(missing)}; it needs {', '.join(INPUT_COLUMNS)} "
                             f"(and optionally {', '.join(OPTIONAL_INPUT_COLUMNS)})")
        rows = frame.to_dict("records")
        p, refused = self._rows(rows)
        out = pd.DataFrame(p, columns=list(P_COLS))
        out["expected_log2_speedup"] = expected_log2(p)
        out["refused"] = pd.Series(refused, dtype=object)
        return out

    def _rows(self, rows: list[Mapping[str, Any]]) -> tuple[np.ndarray, list[str | None]]:
        """(n, 8) probabilities (NaN where refused) and the refusals of input rows."""
        from pipelines.tasks import TASK_MODULES

        n = len(rows)
        p = np.full((n, NUM_BINS), np.nan)
        refused: list[str | None] = [None] * n
        groups: dict[tuple[str, str], list[int]] = {}
        for i, r in enumerate(rows):
            task, hardware = r.get("task"), r.get("hardware")
            hardware = hardware if isinstance(hardware, str) and hardware else DEFAULT_HARDWARE
            if not isinstance(task, str) or task not in TASK_MODULES:
                refused[i] = f"unknown task {task!r}; known tasks: {', '.join(TASK_MODULES)}"
            else:
                groups.setdefault((task, hardware), []).append(i)
        with self._lock:
            for (task, hardware), idx in groups.items():
                self._group(task, hardware, [rows[i] for i in idx], idx, p, refused)
        return p, refused

    def _group(self, task: str, hardware: str, rows: list[Mapping[str, Any]], idx: list[int], p: np.ndarray,
               refused: list[str | None]) -> None:
        """Forecast the rows of one task and hardware: every distinct source read once."""
        import polars as pl

        from pipelines.forecasting.files import read_kernel_sources

        texts: dict[str, Any] = {}  # name -> source, in order of first use
        sides = []
        for r in rows:
            names = []
            for col in ("anchor_source", "candidate_source"):
                src = r.get(col)
                name = source_name(src) if isinstance(src, str) else f"not-text-{len(texts)}"
                texts.setdefault(name, src)
                names.append(name)
            sides.append(names)
        t0 = time.perf_counter()
        read = read_kernel_sources(task, list(texts.values()), hardware, names=list(texts),
                                   n_workers=self.n_workers, compile_timeout_s=self.compile_timeout_s,
                                   cache=self.cache, pool=self.pool)
        self.seconds["read"] += time.perf_counter() - t0
        by_name = {f.name: f for f in read}
        ok, pairs = [], []
        for j, (a, c) in enumerate(sides):
            why = (f"anchor: {by_name[a].refused}" if by_name[a].refused
                   else f"candidate: {by_name[c].refused}" if by_name[c].refused else None)
            if why:
                refused[idx[j]] = why
                continue
            ok.append(idx[j])
            pairs.append({"pair_id": f"row-{idx[j]}", "anchor_kernel_id": a, "candidate_kernel_id": c,
                          "task": task, "hardware_id": hardware})
        if not pairs:
            return
        frame = pl.DataFrame(pairs, schema={k: pl.Utf8 for k in pairs[0]})
        kernels = {f.name: f.record for f in read if f.record is not None}
        t0 = time.perf_counter()
        p[ok] = np.asarray(self.adapter.forecast_pairs(frame, kernels), dtype=np.float64)
        self.seconds["forecast"] += time.perf_counter() - t0

    def close(self) -> None:
        """Stop the reader's children (also done when the forecaster is collected, or at exit)."""
        self.pool.close()

    def __enter__(self) -> SourceForecaster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
