"""The rows a code-embed head reads, built from plain records (numpy and pandas only).

A code-embed head (models.training.embed_head) reads, per pair, the pair's source-derived
feature vector beside what the base model read of its prompt. The bundle builder
(pipelines.surrogates.code_bundle) and the fit (pipelines.surrogates.code_embed) lay these rows
out for the pairs of a dataset version; a forecaster of new pairs lays them out the same way,
here, including on a GPU host that has no polars or DuckDB (pipelines.forecasting.embed_reader).

Feature vector: the numeric columns of the cost model's feature table
(models.classical.features.FeatureSpace) of records with the generator's metadata withheld
(the language model never sees `algorithm` or `knobs_json`), signed log1p of each, so byte and
program counts stay in the range of the rest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from models.classical.features import METADATA_FIELDS


def signed_log(x: float | None) -> float:
    """sign(x) * log1p(|x|); NaN for a missing value.

    >>> [round(signed_log(v), 3) for v in (0.0, 1.0, -1.0)]
    [0.0, 0.693, -0.693]
    """
    if x is None or not math.isfinite(float(x)):
        return float("nan")
    return math.copysign(math.log1p(abs(float(x))), float(x))


def signed_rows(table: Any, names: list[str]) -> list[list[float]]:
    """`signed_log` of the columns `names` of a feature table (pandas), row by row."""
    return [[signed_log(v) for v in row] for row in table[names].to_numpy(dtype=float)]


def without_metadata(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record with the generator's metadata withheld (None where it had the field)."""
    return {**record, **{f: None for f in METADATA_FIELDS if f in record}}


def pair_feature_vectors(names: list[str], anchors: Sequence[Mapping[str, Any]],
                         candidates: Sequence[Mapping[str, Any]]) -> list[list[float]]:
    """The feature vector of each (anchor, candidate) pair of records: the columns `names`
    (a bundle's `feature_names`) in order.

    Raises:
        ValueError: a name that is not a numeric column of the cost model's table (one line).
    """
    from models.classical.features import FeatureSpace, pair_frame

    if not names or not candidates:
        return [[] for _ in candidates]
    space = FeatureSpace.of_numeric_columns(names)
    frame = pair_frame([without_metadata(a) for a in anchors], [without_metadata(c) for c in candidates])
    return signed_rows(space.transform(frame), list(names))


def design(pairs: list[dict[str, Any]], embedded: dict[str, dict[str, list[float]]], parts: tuple[str, ...],
           k: int = 48) -> np.ndarray:
    """(n, width) rows of the chosen parts (the first `k` principal coordinates), NaN where a
    value is missing (the trees route it)."""
    rows = []
    for p in pairs:
        row: list[float] = []
        for part in parts:
            if part == "features":
                row += list(p.get("features") or [])
            else:
                row += list(embedded[p["pair_id"]][part])[:k] if part == "pc" else list(embedded[p["pair_id"]][part])
        rows.append([math.nan if v is None else float(v) for v in row])
    return np.array(rows, dtype=np.float64)
