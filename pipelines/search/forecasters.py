"""How the search names its forecasters: the references by name, forecaster files, and
factories registered for model references; and the scores it reads off a forecast.

Every forecaster of the search is the one forecasting type, pipelines.forecasting.base.
PairForecaster, asked through its search hook:

    predict_kernels(anchor, candidates, hardware_id) -> np.ndarray   # (n, 8)

row i: the probabilities that candidate i's speedup over `anchor` on `hardware_id` falls in
each of the eight bins of models/bins.py. Each kernel mapping has at least kernel_id, task,
source, language, generator, algorithm, knobs_json (JSON, sorted keys), parent_kernel_id and
mutation, and, when known, the compile features n_regs, n_spills, shared_bytes, n_kernels,
n_launches. A candidate's score is its expected log2 speedup sum_b p_b r_b (method.md section
1's representative values r; pipelines.forecasting.base.expected_log2).

The references (pipelines.forecasting.references; their probabilities are models.baselines'),
read off the measured table here, with no polars, so a bare GPU host's live search runs them:
    uniform    1/8 everywhere: every candidate ties, so filtering is a random choice
    bin-prior  the task's bin frequencies of its measured kernels against the reference
               (Laplace-smoothed): constant per task, so it ranks like uniform
    oracle     one-hot on the true bin from the measured table (a failed kernel: bin 1; a
               kernel the table does not hold: uniform); the ceiling a bin forecaster can reach

`resolve_forecaster(name, context)` builds one by name: the three above, "file:PATH" (a pickled
object with `predict_kernels`, as the GPU host gets it, as a RecordsForecaster unless it is a
PairForecaster already) and any prefix registered with `register_forecaster`:
pipelines.search.registered registers "models:/", "kind:" and "champion" (the version for
kernels from files), each loaded by pipelines.forecasting.load_forecaster. Kernel records of
files or LLM mutations lack generator, algorithm and knobs_json: no forecaster may need them.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models import baselines
from models.bins import speedup_to_bin
from pipelines.forecasting.base import PairForecaster, RecordsForecaster, checked_probs
from pipelines.forecasting.references import BinPriorForecaster, OracleForecaster, UniformForecaster
from pipelines.search.table import MeasuredTable


def confidence(probs: np.ndarray) -> np.ndarray:
    """Max probability of each row (method.md section 3's default confidence score)."""
    return np.asarray(probs, dtype=np.float64).max(axis=1)


def table_bin_prior(table: MeasuredTable, alpha: float = 1.0) -> BinPriorForecaster:
    """The bin prior of `table`: Laplace-smoothed bin frequencies of each task's correct
    kernels against its reference (rows renormalised)."""
    correct = [(kid, o) for kid, o in table.outcomes.items() if o.ok]
    prior = baselines.bin_prior_of([speedup_to_bin(o.speedup) for _, o in correct],
                                   [table.task_of.get(kid) for kid, _ in correct], alpha)
    return BinPriorForecaster({k: checked_probs([v], 1)[0] for k, v in prior.items()})


@dataclass
class ForecasterContext:
    """What a factory may need to build a forecaster."""

    table: MeasuredTable | None = None
    tracking_uri: str | None = None  # MLflow, for registered model references
    home: Path | None = None  # $KERNELCAST_HOME


Factory = Callable[[str, ForecasterContext], PairForecaster]
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


def load_forecaster_file(path: str | Path) -> Any:
    """The pickled forecaster object of a file (anything with `predict_kernels`), as it is
    (a cost model's `predict_proba` and `features` stay at hand); `file_forecaster` gives it as
    the search asks it.

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


def file_forecaster(path: str | Path) -> PairForecaster:
    """The forecaster of a file as a PairForecaster (a RecordsForecaster around its object,
    unless it is one already).

    Raises:
        ValueError: as `load_forecaster_file` (one line).
    """
    obj = load_forecaster_file(path)
    return obj if isinstance(obj, PairForecaster) else RecordsForecaster(obj)


BUILTIN = ("uniform", "bin-prior", "oracle", "file:PATH")


def resolve_forecaster(name: str, context: ForecasterContext | None = None) -> PairForecaster:
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
        return table_bin_prior(ctx.table) if name == "bin-prior" else OracleForecaster(ctx.table)
    if name.startswith("file:"):
        return file_forecaster(name.removeprefix("file:"))
    matches = sorted((p for p in _FACTORIES if name.startswith(p)), key=len, reverse=True)
    if matches:
        return _FACTORIES[matches[0]](name, ctx)
    if name.startswith(MODEL_REF_PREFIX):
        raise ValueError(f"no loader registered for model references like {name!r} "
                         f"(pipelines.search.forecasters.register_forecaster({MODEL_REF_PREFIX!r}, factory))")
    known = ", ".join([*BUILTIN, *(f"{p}..." for p in sorted(_FACTORIES))])
    raise ValueError(f"unknown forecaster {name!r}; known: {known}")


def forecaster_name(forecaster: Any, fallback: str = "") -> str:
    """A printable name: the object's `name` attribute, else `fallback`, else its class (a
    forecaster file's: the class of the object in the file)."""
    inner = forecaster.inner if isinstance(forecaster, RecordsForecaster) else forecaster
    return str(getattr(forecaster, "name", "") or fallback or type(inner).__name__)
