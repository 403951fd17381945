"""What a search needs from a forecaster, reference forecasters, and a resolver by name.

Any forecaster plugs into the search through one method (`CandidateForecaster`):

    predict_kernels(anchor, candidates, hardware_id) -> np.ndarray   # (n, 8)

row i: the probabilities that candidate i's speedup over `anchor` on `hardware_id` falls in
each of the eight bins of models/bins.py. Each kernel mapping has at least kernel_id, task,
source, language, generator, algorithm, knobs_json (JSON, sorted keys), parent_kernel_id and
mutation, and, when known, the compile features n_regs, n_spills, shared_bytes, n_kernels,
n_launches. A candidate's score is its expected log2 speedup sum_b p_b r_b (method.md section
1's representative values r).

Reference forecasters (here, for tests and as floors and ceilings; their probabilities are
models.baselines', read off the measured table instead of a pairs frame, in plain Python so
that a bare GPU host's live search runs them without polars):
    uniform    1/8 everywhere: every candidate ties, so filtering is a random choice
    bin-prior  the task's bin frequencies of its measured kernels against the reference
               (Laplace-smoothed): constant per task, so it ranks like uniform
    oracle     one-hot on the true bin from the measured table (a failed kernel: bin 1; a
               kernel the table does not hold: uniform); the ceiling a bin forecaster can reach

`resolve_forecaster(name, context)` builds one by name: the three above, "file:PATH" (a pickled
object with `predict_kernels`, as the GPU host gets it) and any prefix registered with
`register_forecaster`: pipelines.search.registered registers "models:/", "kind:" and
"champion" (the version for kernels from files), each an adapter of the one forecasting
interface (pipelines.forecasting), whose `predict_kernels` is this protocol. Kernel records of
files or LLM mutations lack generator, algorithm and knobs_json: no forecaster may need them.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from models import baselines
from models.bins import BIN_LOG2_VALUES, NUM_BINS, speedup_to_bin
from pipelines.search.table import MeasuredTable

_R = np.asarray(BIN_LOG2_VALUES, dtype=np.float64)


@runtime_checkable
class CandidateForecaster(Protocol):
    """Forecasts the speedup bin of candidates over an anchor kernel."""

    def predict_kernels(
        self, anchor: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]], hardware_id: str
    ) -> np.ndarray:
        """(n, 8) probabilities, row i for candidates[i]."""
        ...


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


def expected_log2(probs: np.ndarray) -> np.ndarray:
    """Score of each row: sum_b p_b r_b, r the bins' representative log2 speedups."""
    return np.asarray(probs, dtype=np.float64) @ _R


def confidence(probs: np.ndarray) -> np.ndarray:
    """Max probability of each row (method.md section 3's default confidence score)."""
    return np.asarray(probs, dtype=np.float64).max(axis=1)


class UniformForecaster:
    """1/8 on every bin."""

    name = "uniform"

    def predict_kernels(self, anchor, candidates, hardware_id):
        return baselines.uniform_probs(len(candidates))


class BinPriorForecaster:
    """The same distribution for every candidate of a task (pooled prior for unknown tasks)."""

    name = "bin-prior"

    def __init__(self, prior: Mapping[str | None, np.ndarray]):
        self.prior = {k: checked_probs([v], 1)[0] for k, v in prior.items()}

    @classmethod
    def from_table(cls, table: MeasuredTable, alpha: float = 1.0) -> BinPriorForecaster:
        """Laplace-smoothed bin frequencies of each task's correct kernels vs its reference."""
        correct = [(kid, o) for kid, o in table.outcomes.items() if o.ok]
        return cls(baselines.bin_prior_of([speedup_to_bin(o.speedup) for _, o in correct],
                                          [table.task_of.get(kid) for kid, _ in correct], alpha))

    def predict_kernels(self, anchor, candidates, hardware_id):
        return baselines.prior_probs(self.prior, [c.get("task") for c in candidates])


class OracleForecaster:
    """One-hot on the true bin of S = speedup(candidate) / speedup(anchor), from the table.

    The anchor's speedup is 1 for a task reference (generator 'reference'), else the table's.
    A failed candidate gets bin 1 (nothing is slower than a kernel that does not work); a
    candidate or anchor the table does not know gets the uniform distribution.
    """

    name = "oracle"

    def __init__(self, table: MeasuredTable):
        self.table = table

    def _anchor_speedup(self, anchor: Mapping[str, Any]) -> float | None:
        if anchor.get("generator") == "reference":
            return 1.0
        outcome = self.table.get(anchor["kernel_id"])
        return outcome.speedup if outcome is not None and outcome.ok else None

    def predict_kernels(self, anchor, candidates, hardware_id):
        out = baselines.uniform_probs(len(candidates))
        base = self._anchor_speedup(anchor)
        if base is None:
            return out
        known: dict[int, int] = {}  # candidate position -> its true bin
        for i, cand in enumerate(candidates):
            outcome = self.table.get(cand["kernel_id"])
            if outcome is not None and outcome.status != "unmeasured":
                known[i] = speedup_to_bin(outcome.speedup / base) if outcome.ok else 1
        if known:
            out[list(known)] = baselines.one_hot(list(known.values()))
        return out


class MemoForecaster:
    """A forecaster whose answers are remembered per (hardware, anchor record, candidate record).

    A simulation's runs (modes x seeds of a task) propose the same kernels again and again; a
    forecast row depends on its anchor and candidate only (the protocol above), so asking once
    per distinct pair gives every run the same rows, without a model call per repeat. Records
    are compared whole (parent and mutation included), so a candidate proposed from another
    parent is asked again."""

    def __init__(self, inner: CandidateForecaster):
        self.inner = inner
        self.name = forecaster_name(inner)
        self.memo: dict[tuple[str, str, str], np.ndarray] = {}
        self.calls = 0  # calls that reached the inner forecaster

    @staticmethod
    def _key(record: Mapping[str, Any]) -> str:
        return json.dumps(record, sort_keys=True, default=str)

    def predict_kernels(self, anchor, candidates, hardware_id):
        a = self._key(anchor)
        keys = [(hardware_id, a, self._key(c)) for c in candidates]
        todo: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        for k, c in zip(keys, candidates):
            if k not in self.memo:
                todo.setdefault(k, c)
        if todo:
            self.calls += 1
            rows = np.asarray(self.inner.predict_kernels(anchor, list(todo.values()), hardware_id), dtype=np.float64)
            if rows.shape != (len(todo), NUM_BINS):
                raise ValueError(f"forecaster returned shape {rows.shape}, expected ({len(todo)}, {NUM_BINS})")
            # Kept as answered: the caller validates and normalises them (checked_probs), as it
            # would the inner forecaster's own answer. An error above leaves nothing remembered.
            self.memo.update(zip(todo, rows))
        return np.stack([self.memo[k] for k in keys]) if keys else np.zeros((0, NUM_BINS))


@dataclass
class ForecasterContext:
    """What a factory may need to build a forecaster."""

    table: MeasuredTable | None = None
    tracking_uri: str | None = None  # MLflow, for registered model references
    home: Path | None = None  # $KERNELCAST_HOME


Factory = Callable[[str, ForecasterContext], CandidateForecaster]
_FACTORIES: dict[str, Factory] = {}
MODEL_REF_PREFIX = "models:/"


def register_forecaster(prefix: str, factory: Factory) -> None:
    """Resolve names starting with `prefix` through `factory(name, context)`.

    The hook for forecasters built elsewhere: registered model references ("models:/..."), the
    classical cost model, the LLM surrogate. The longest matching prefix wins.
    """
    _FACTORIES[prefix] = factory


def unregister_forecaster(prefix: str) -> None:
    _FACTORIES.pop(prefix, None)


def load_forecaster_file(path: str | Path) -> CandidateForecaster:
    """A pickled forecaster object (anything with `predict_kernels`).

    Raises:
        ValueError: missing file, unreadable pickle or no `predict_kernels` (one line).
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"forecaster file not found: {p}")
    try:
        with open(p, "rb") as fh:
            obj = pickle.load(fh)  # noqa: S301 - a file the operator hands over, like a model
    except Exception as exc:  # noqa: BLE001 - any unpickling problem is one line
        raise ValueError(f"cannot load forecaster {p}: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    if not callable(getattr(obj, "predict_kernels", None)):
        raise ValueError(f"{p} holds a {type(obj).__name__}, which has no predict_kernels")
    return obj


BUILTIN = ("uniform", "bin-prior", "oracle", "file:PATH")


def resolve_forecaster(name: str, context: ForecasterContext | None = None) -> CandidateForecaster:
    """The forecaster called `name`.

    Args:
        name: "uniform", "bin-prior", "oracle", "file:PATH", or a name under a registered prefix.
        context: the measured table (bin-prior, oracle) and what registered factories need.

    Raises:
        ValueError: unknown name, or what the forecaster needs is missing (one line).
    """
    ctx = context or ForecasterContext()
    if name == "uniform":
        return UniformForecaster()
    if name in ("bin-prior", "oracle"):
        if ctx.table is None:
            raise ValueError(f"forecaster {name!r} needs the measured table")
        return BinPriorForecaster.from_table(ctx.table) if name == "bin-prior" else OracleForecaster(ctx.table)
    if name.startswith("file:"):
        return load_forecaster_file(name.removeprefix("file:"))
    matches = sorted((p for p in _FACTORIES if name.startswith(p)), key=len, reverse=True)
    if matches:
        return _FACTORIES[matches[0]](name, ctx)
    if name.startswith(MODEL_REF_PREFIX):
        raise ValueError(f"no loader registered for model references like {name!r} "
                         f"(pipelines.search.forecasters.register_forecaster({MODEL_REF_PREFIX!r}, factory))")
    known = ", ".join([*BUILTIN, *(f"{p}..." for p in sorted(_FACTORIES))])
    raise ValueError(f"unknown forecaster {name!r}; known: {known}")


def forecaster_name(forecaster: Any, fallback: str = "") -> str:
    """A printable name: the object's `name` attribute, else `fallback`, else its class."""
    return str(getattr(forecaster, "name", "") or fallback or type(forecaster).__name__)
