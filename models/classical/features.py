"""What a classical forecaster sees of a kernel pair: kernel records in, a feature table out.

A *kernel record* is a mapping with the warehouse's kernel columns (kernel_id, task, source,
language, generator, algorithm, knobs_json) and, when known, the sm_90 compile features
(n_regs, n_spills, shared_bytes, n_kernels, n_launches). A *pair frame* has one row per
(anchor, candidate) with the columns `task` and every kernel column twice, prefixed `a_`
(anchor) and `c_` (candidate): `pair_frame` builds it, and it is the input signature of every
classical model in the registry, so a model logged to MLflow can be called on any pair.

Nothing here runs a kernel or reads a measured runtime: knobs and algorithm come from the
generator's record, compile features from compiling for the target, source counts from the
text. LLM-written kernels have no knobs; their knob columns are missing (NaN), and the text
model (models.classical.text_model) reads them as well as any other.

Only pandas and numpy: the same code runs on a GPU host without polars (the live search).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

KERNEL_FIELDS = ("kernel_id", "source", "language", "generator", "algorithm", "knobs_json")
COMPILE_FIELDS = ("n_regs", "n_spills", "shared_bytes", "n_kernels", "n_launches")
SIDES = ("a", "c")  # anchor, candidate

# Source constructs whose counts tell algorithms apart (regex over comment-free code).
SOURCE_COUNTS: dict[str, str] = {
    "jit_functions": r"@triton\.jit",
    "autotune": r"@triton\.autotune",
    "tl_dot": r"\btl\.dot\b",
    "tl_load": r"\btl\.load\b",
    "tl_store": r"\btl\.store\b",
    "tl_atomic": r"\btl\.atomic_\w+",
    "tl_reduce": r"\btl\.(?:sum|max|min|reduce|cumsum)\b",
    "loops": r"\bfor\b.+\bin\b",
    "launches": r"\w+\[\s*(?:grid|\()",
    "torch_calls": r"\btorch\.(?!float|bfloat|int|uint|bool|Tensor|empty|zeros|ones|device|cuda)\w+\(",
    "exp2": r"\bexp2\b",
    "fp8": r"float8",
    "lines": r"\n",
}
_COMMENT = re.compile(r"#[^\n]*")
_DOCSTRING = re.compile(r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'')


def code_text(source: str) -> str:
    """Source without comments and docstrings (what the counts and the text model read).

    >>> code_text('x = 1  # one\\n')
    'x = 1  \\n'
    """
    return _COMMENT.sub("", _DOCSTRING.sub("", source or ""))


def knobs_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record's knob values ({} for the reference, LLM kernels or unreadable JSON)."""
    raw = record.get("knobs_json")
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        knobs = json.loads(raw) if raw else {}
    except (TypeError, ValueError):
        return {}
    return knobs if isinstance(knobs, dict) else {}


def _number(value: Any) -> float:
    """A float for numeric values and NaN for missing or non-finite ones."""
    if value is None or isinstance(value, bool):
        return float(value) if isinstance(value, bool) else math.nan
    try:
        v = float(value)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def kernel_features(record: Mapping[str, Any]) -> dict[str, Any]:
    """Flat features of one kernel record: family, knobs, compile features, source counts.

    Keys: `family` (task/algorithm, or task/<generator> without an algorithm), `generator`,
    `knob:<NAME>` per knob (numbers stay numbers, other values become strings), the five
    compile features (NaN when unknown) and `src:<construct>` counts.

    >>> f = kernel_features({"task": "softmax", "algorithm": "two_pass", "generator": "kernelcast-space",
    ...                      "knobs_json": '{"BLOCK_N": 256, "exp_impl": "exp2"}', "source": "tl.load(x)\\n"})
    >>> f["family"], f["knob:BLOCK_N"], f["knob:exp_impl"], f["src:tl_load"]
    ('softmax/two_pass', 256.0, 'exp2', 1)
    """
    task = str(record.get("task") or "")
    generator = str(record.get("generator") or "unknown")
    algorithm = record.get("algorithm")
    kind = "reference" if generator == "reference" else generator.split(":")[0]
    out: dict[str, Any] = {
        "family": f"{task}/{algorithm if algorithm else kind}",
        "generator": kind,
    }
    for name, value in knobs_of(record).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"knob:{name}"] = _number(value)
        else:
            out[f"knob:{name}"] = str(value)
    for name in COMPILE_FIELDS:
        out[name] = _number(record.get(name))
    code = code_text(str(record.get("source") or ""))
    for name, pattern in SOURCE_COUNTS.items():
        out[f"src:{name}"] = len(re.findall(pattern, code))
    return out


def with_compile_features(record: Mapping[str, Any], features: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`record` with the compile features `features` knows for its kernel id filled in where it
    has none (the search's kernel records carry only what the generator knows)."""
    out = dict(record)
    for k, v in features.get(str(record.get("kernel_id")), {}).items():
        if out.get(k) is None:
            out[k] = v
    return out


def pair_frame(
    anchors: Sequence[Mapping[str, Any]], candidates: Sequence[Mapping[str, Any]]
) -> pd.DataFrame:
    """The pair frame of aligned anchor and candidate records (the models' input).

    Args:
        anchors: one kernel record per pair (the anchor).
        candidates: one kernel record per pair (the candidate), same length.
    Returns:
        Columns task, a_<field>, c_<field> for KERNEL_FIELDS and COMPILE_FIELDS.
    Raises:
        ValueError: lengths differ.
    """
    if len(anchors) != len(candidates):
        raise ValueError(f"{len(anchors)} anchors but {len(candidates)} candidates")
    rows = []
    for a, c in zip(anchors, candidates, strict=True):
        row: dict[str, Any] = {"task": c.get("task") or a.get("task")}
        for side, rec in (("a", a), ("c", c)):
            for f in KERNEL_FIELDS:
                row[f"{side}_{f}"] = rec.get(f)
            for f in COMPILE_FIELDS:
                row[f"{side}_{f}"] = _number(rec.get(f))
        rows.append(row)
    columns = ["task"] + [f"{s}_{f}" for s in SIDES for f in (*KERNEL_FIELDS, *COMPILE_FIELDS)]
    return pd.DataFrame(rows, columns=columns)


def side_records(frame: pd.DataFrame, side: str) -> list[dict[str, Any]]:
    """The kernel records of one side ('a' or 'c') of a pair frame, with the task."""
    prefix = f"{side}_"
    cols = [c for c in frame.columns if c.startswith(prefix)]
    part = frame[cols].rename(columns={c: c[len(prefix):] for c in cols})
    part = part.assign(task=frame["task"].to_numpy())
    return part.to_dict("records")


class FeatureSpace:
    """The columns a cost model was fitted on, so predictions see the same table.

    Numeric kernel features become float columns; string ones become pandas categoricals with
    the categories seen at fit time (an unseen value is missing, which the trees route like any
    missing value). Each pair gives the candidate's features (`c:`), the anchor's (`a:`), and
    the candidate-minus-anchor difference of every numeric feature (`d:`), so cross pairs
    (two Triton kernels) are read relative to each other.
    """

    def __init__(self) -> None:
        self.numeric: list[str] = []
        self.categorical: dict[str, list[str]] = {}
        self.columns: list[str] = []

    def fit(self, frame: pd.DataFrame) -> FeatureSpace:
        """Learn the columns of a pair frame's features; columns that never vary there (e.g.
        compile features no fitted kernel has) are left out."""
        feats = [kernel_features(r) for r in side_records(frame, "c") + side_records(frame, "a")]
        numeric: set[str] = set()
        cats: dict[str, set[str]] = {"task": set(frame["task"].astype(str))}
        for f in feats:
            for k, v in f.items():
                if isinstance(v, str):
                    cats.setdefault(k, set()).add(v)
                else:
                    numeric.add(k)
        self.numeric = sorted(numeric - set(cats))
        self.categorical = {k: sorted(v) for k, v in sorted(cats.items())}
        table = self._table(frame)
        self.columns = [c for c in table.columns if table[c].nunique(dropna=True) >= 2]
        return self

    def _side(self, feats: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
        cols: dict[str, Any] = {}
        for k in self.numeric:
            cols[f"{prefix}{k}"] = np.array([_number(f.get(k)) for f in feats], dtype=np.float64)
        for k, cats in self.categorical.items():
            if k == "task":
                continue
            known = set(cats)
            values = [f.get(k) if f.get(k) in known else None for f in feats]  # unseen: missing
            cols[f"{prefix}{k}"] = pd.Categorical(values, categories=cats)
        return cols

    def transform(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The model's feature table of a pair frame (the fitted columns, in order)."""
        return self._table(frame)[self.columns]

    def _table(self, frame: pd.DataFrame) -> pd.DataFrame:
        c = [kernel_features(r) for r in side_records(frame, "c")]
        a = [kernel_features(r) for r in side_records(frame, "a")]
        tasks = self.categorical.get("task", [])
        cols: dict[str, Any] = {"task": pd.Categorical([t if t in tasks else None for t in frame["task"].astype(str)],
                                                       categories=tasks)}
        cols.update(self._side(c, "c:"))
        cols.update(self._side(a, "a:"))
        for k in self.numeric:
            cols[f"d:{k}"] = cols[f"c:{k}"] - cols[f"a:{k}"]
        return pd.DataFrame(cols, index=frame.index)
