"""Content-addressed dataset versions: the same pairs and measurements give the same version.

The digest is sha256 over a canonical text: one line per pair (sorted by pair_id, then
split and pair_type), fields in a fixed order, floats in Python's shortest round-trip repr,
then the sorted distinct measurement ids. Row order, column order and extra columns do not
change it; any changed speedup, bin, split or measurement does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import polars as pl

CANONICAL_COLUMNS = (
    "pair_id", "task", "hardware_id", "anchor_kernel_id", "candidate_kernel_id",
    "pair_type", "speedup", "true_bin",
)
OPTIONAL_COLUMNS = ("split",)


@dataclass(frozen=True)
class DatasetVersion:
    """A dataset version: 'ds-' + the first 12 hex of the digest, the digest, counts."""

    version: str
    digest: str
    counts: dict = field(default_factory=dict)


def canonical_lines(pairs: pl.DataFrame) -> list[str]:
    """One JSON line per pair in canonical order (see the module docstring)."""
    missing = [c for c in CANONICAL_COLUMNS if c not in pairs.columns]
    if missing:
        raise ValueError(f"pairs are missing column(s): {', '.join(missing)}")
    cols = list(CANONICAL_COLUMNS) + [c for c in OPTIONAL_COLUMNS if c in pairs.columns]
    rows = []
    for r in pairs.select(cols).iter_rows(named=True):
        r["speedup"] = repr(float(r["speedup"]))  # exact and stable text for a float64
        r["true_bin"] = int(r["true_bin"])
        rows.append((str(r["pair_id"]), json.dumps(r, sort_keys=True, separators=(",", ":"))))
    return [line for _, line in sorted(rows)]


def dataset_version(pairs: pl.DataFrame, measurement_ids: Iterable[str]) -> DatasetVersion:
    """Version, digest and counts of a set of pairs and the measurements behind them.

    Args:
        pairs: pairs (CANONICAL_COLUMNS, optionally split).
        measurement_ids: ids of the measurements behind them.
    Returns:
        `DatasetVersion` with counts n_pairs, n_measurements, n_tasks, by_pair_type, by_split.

    >>> df = pl.DataFrame({"pair_id": ["x"], "task": ["t"], "hardware_id": ["h"], "anchor_kernel_id": ["a"],
    ...     "candidate_kernel_id": ["c"], "pair_type": ["reference"], "speedup": [1.5], "true_bin": [6]})
    >>> v = dataset_version(df, ["m2", "m1"]); v.version == "ds-" + v.digest[:12], v.counts["n_pairs"]
    (True, 1)
    """
    mids = sorted({str(m) for m in measurement_ids})
    h = hashlib.sha256()
    h.update(b"kernelcast-dataset-v1\npairs\n")
    for line in canonical_lines(pairs):
        h.update(line.encode() + b"\n")
    h.update(b"measurements\n")
    for m in mids:
        h.update(m.encode() + b"\n")
    digest = h.hexdigest()

    def by(col: str) -> dict[str, int]:
        if col not in pairs.columns:
            return {}
        return {str(k): int(v) for k, v in pairs.group_by(col).len().sort(col).rows()}

    counts = {
        "n_pairs": pairs.height,
        "n_measurements": len(mids),
        "n_tasks": pairs["task"].n_unique() if pairs.height else 0,
        "by_pair_type": by("pair_type"),
        "by_split": by("split"),
    }
    return DatasetVersion(version=f"ds-{digest[:12]}", digest=digest, counts=counts)
