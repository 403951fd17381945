"""The measured space: what the GPU said about each kernel of one hardware, by kernel id.

Built from the warehouse's labels (pipelines.curation.pairs.labels): a kernel is correct only
if every one of its measurements on that hardware is ok, and its speedup (vs the task
reference) is the geometric mean of them; any failure makes it a failed measurement. The
simulated search reads its measurements from here.

Loading needs polars (and duckdb for the warehouse); the table itself is plain Python, so the
GPU host's live search imports this module without either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.search.events import Outcome


@dataclass
class MeasuredTable:
    """Outcomes by kernel id (one hardware), the task of each kernel, optional compile features."""

    outcomes: dict[str, Outcome] = field(default_factory=dict)
    task_of: dict[str, str] = field(default_factory=dict)
    features: dict[str, dict[str, Any]] = field(default_factory=dict)
    parent_of: dict[str, str] = field(default_factory=dict)  # lineage of the measured kernels
    hardware_id: str = ""

    def get(self, kernel_id: str) -> Outcome | None:
        return self.outcomes.get(kernel_id)

    def __contains__(self, kernel_id: str) -> bool:
        return kernel_id in self.outcomes

    def __len__(self) -> int:
        return len(self.outcomes)

    def add(self, task: str, outcome: Outcome) -> None:
        self.outcomes[outcome.kernel_id] = outcome
        self.task_of[outcome.kernel_id] = task

    def tasks(self) -> list[str]:
        return sorted(set(self.task_of.values()))

    def copy(self) -> MeasuredTable:
        return MeasuredTable(dict(self.outcomes), dict(self.task_of), self.features, dict(self.parent_of),
                             self.hardware_id)


def table_from_labels(rows: Iterable[Mapping[str, Any]], hardware_id: str = "") -> MeasuredTable:
    """A table from label rows (kernel_id, task, correct, speedup, failure_kinds).

    >>> t = table_from_labels([{"kernel_id": "a", "task": "t", "correct": True, "speedup": 2.0},
    ...                        {"kernel_id": "b", "task": "t", "correct": False, "failure_kinds": ["timeout"]}])
    >>> t.get("a").speedup, t.get("b").status, t.get("b").failure_kind
    (2.0, 'failed', 'timeout')
    """
    table = MeasuredTable(hardware_id=hardware_id)
    for r in rows:
        if r.get("correct") and r.get("speedup") is not None and r["speedup"] > 0:
            outcome = Outcome(r["kernel_id"], "ok", float(r["speedup"]))
        else:
            kinds = [k for k in (r.get("failure_kinds") or []) if k]
            outcome = Outcome(r["kernel_id"], "failed", None, ",".join(kinds) or "failed")
        table.add(r["task"], outcome)
        if r.get("parent_kernel_id"):
            table.parent_of[r["kernel_id"]] = r["parent_kernel_id"]
    return table


def _features_from_kernel_files(paths: Iterable[Path]) -> dict[str, dict[str, Any]]:
    import polars as pl

    from pipelines.search.space import FEATURE_KEYS

    frames = []
    for p in paths:
        cols = pl.read_parquet_schema(p)
        have = [c for c in FEATURE_KEYS if c in cols]
        if have:
            frames.append(pl.read_parquet(p, columns=["kernel_id", *have]))
    if not frames:
        return {}
    feats = pl.concat(frames, how="diagonal_relaxed").unique("kernel_id", keep="first")
    return {r.pop("kernel_id"): r for r in feats.to_dicts()}


def load_table_parquet(folder: str | Path, hardware_id: str) -> MeasuredTable:
    """The table of the result and kernel Parquet files under `folder` (searched recursively,
    e.g. data/measurements): rows of other hardware are left out.

    Raises:
        ValueError: no result files there, or none of them measured on `hardware_id`.
    """
    import polars as pl

    from pipelines.curation.pairs import labels
    from warehouse.formats import measurement_id

    folder = Path(folder)
    results = sorted(folder.rglob("results-*.parquet"))
    kernels = sorted(folder.rglob("kernels-*.parquet"))
    if not results:
        raise ValueError(f"no results-*.parquet under {folder}")
    cols = ["batch_id", "kernel_id", "task", "status", "failure_kind", "speedup", "protocol", "hardware_id"]
    res = pl.concat([pl.read_parquet(p, columns=cols) for p in results], how="diagonal_relaxed")
    res = res.filter(pl.col("hardware_id") == hardware_id)
    if res.is_empty():
        raise ValueError(f"no measurements on {hardware_id} under {folder}")
    res = res.with_columns(
        pl.struct("batch_id", "kernel_id")
        .map_elements(lambda s: measurement_id(s["batch_id"], s["kernel_id"]), return_dtype=pl.Utf8)
        .alias("measurement_id")
    )
    attrs = ["kernel_id", "generator", "algorithm", "parent_kernel_id", "mutation"]
    kern = pl.concat([pl.read_parquet(p, columns=attrs) for p in kernels], how="diagonal_relaxed") \
        .unique("kernel_id", keep="first") if kernels else None
    frame = res.join(kern, on="kernel_id", how="left") if kern is not None else res
    table = table_from_labels(labels(frame).to_dicts(), hardware_id)
    table.features = _features_from_kernel_files(kernels)
    return table


def load_table_warehouse(con: Any, hardware_id: str, kernel_files: Iterable[Path] = ()) -> MeasuredTable:
    """The table of the warehouse's measurements on `hardware_id` (labels as curation makes them).

    Args:
        con: an open DuckDB connection (warehouse.connect).
        hardware_id: e.g. "nvidia-h200-sm90".
        kernel_files: kernel batch files whose compile-feature columns to attach (the warehouse
            keeps features only for kernels generated in place).
    """
    from pipelines.curation.pairs import labels
    from warehouse.measurements import measurements_frame

    frame = measurements_frame(con, hardware_id=hardware_id)
    if frame.is_empty():
        raise ValueError(f"the warehouse holds no measurements on {hardware_id}")
    table = table_from_labels(labels(frame).to_dicts(), hardware_id)
    table.features = _features_from_kernel_files(list(kernel_files))
    return table
