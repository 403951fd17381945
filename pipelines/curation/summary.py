"""What the measurements hold, for `kernelcast dataset --json` and Dagster metadata.

Counts come straight from the measurements frame: measurements by task, hardware, status,
failure kind and protocol, and, for the kernels that label (see `pairs.labels`), correct
kernels by speedup bin against the task reference (the reference itself not counted).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from models.bins import BIN_NAMES, NUM_BINS, speedups_to_bins
from pipelines.curation.pairs import DEFAULT_PROTOCOL, labels


def _counts(df: pl.DataFrame, col: str) -> dict[str, int]:
    if col not in df.columns or df.height == 0:
        return {}
    return {str(k): int(v) for k, v in df.group_by(col).len().sort(col, nulls_last=True).rows()}


def dataset_summary(measurements: pl.DataFrame, *, protocol: str = DEFAULT_PROTOCOL) -> dict[str, Any]:
    """Counts by task, hardware, status, failure kind and bin.

    Args:
        measurements: one row per measurement (as `pairs.labels` reads).
        protocol: the protocol whose measurements label.
    Returns:
        {"n_measurements", "n_kernels", "n_tasks", "n_hardware", "by_status",
        "by_failure_kind", "by_protocol", "by_task", "by_hardware", "by_bin", "by_task_bin"};
        by_task / by_hardware map a name to {measurements, ok, failed, kernels,
        correct_kernels}; by_bin maps "1".."8" to correct candidate kernels in that bin
        (one per task, hardware and kernel); by_task_bin the same per task.
    """
    m = measurements
    lab = labels(m, protocol=protocol) if m.height else None
    out: dict[str, Any] = {
        "n_measurements": m.height,
        "n_kernels": m["kernel_id"].n_unique() if m.height else 0,
        "n_tasks": m["task"].n_unique() if m.height else 0,
        "n_hardware": m["hardware_id"].n_unique() if m.height else 0,
        "by_status": _counts(m, "status"),
        "by_failure_kind": _counts(m.filter(pl.col("status") != "ok"), "failure_kind") if m.height else {},
        "by_protocol": _counts(m, "protocol"),
    }
    for key, col in (("by_task", "task"), ("by_hardware", "hardware_id")):
        block: dict[str, dict[str, int]] = {}
        if m.height:
            agg = m.group_by(col).agg(
                pl.len().alias("measurements"),
                (pl.col("status") == "ok").sum().alias("ok"),
                (pl.col("status") != "ok").sum().alias("failed"),
                pl.col("kernel_id").n_unique().alias("kernels"),
            )
            for r in agg.iter_rows(named=True):
                block[str(r[col])] = {k: int(r[k]) for k in ("measurements", "ok", "failed", "kernels")}
                block[str(r[col])]["correct_kernels"] = 0
        if lab is not None:
            for name, n in lab.filter(pl.col("correct")).group_by(col).len().rows():
                block.setdefault(str(name), {"measurements": 0, "ok": 0, "failed": 0, "kernels": 0})
                block[str(name)]["correct_kernels"] = int(n)
        out[key] = dict(sorted(block.items()))

    by_bin = {str(b): 0 for b in range(1, NUM_BINS + 1)}
    by_task_bin: dict[str, dict[str, int]] = {}
    if lab is not None:
        cand = lab.filter(
            pl.col("correct") & pl.col("speedup").is_not_null() & (pl.col("generator").fill_null("") != "reference")
        )
        if cand.height:
            bins = speedups_to_bins(cand["speedup"].to_numpy())
            for task, b in zip(cand["task"].to_list(), bins.tolist()):
                by_bin[str(b)] += 1
                row = by_task_bin.setdefault(str(task), {str(i): 0 for i in range(1, NUM_BINS + 1)})
                row[str(b)] += 1
    out["by_bin"] = by_bin
    out["by_task_bin"] = dict(sorted(by_task_bin.items()))
    return out


def summary_markdown(summary: dict[str, Any]) -> str:
    """Markdown tables of a `dataset_summary`: per task (with bins), then failure kinds.

    >>> md = summary_markdown({"by_task": {"t": {"measurements": 2, "ok": 1, "failed": 1,
    ...     "kernels": 2, "correct_kernels": 1}}, "by_task_bin": {"t": {"5": 1}}, "by_failure_kind": {}})
    >>> md.splitlines()[2].startswith("| t | 2 | 1 | 1 | 1 |")
    True
    """
    bins = [str(b) for b in range(1, NUM_BINS + 1)]
    head = ["task", "measurements", "ok", "failed", "correct kernels"] + [f"bin {b}" for b in bins]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    totals = [0] * (4 + NUM_BINS)
    for task, c in summary.get("by_task", {}).items():
        tb = summary.get("by_task_bin", {}).get(task, {})
        vals = [c.get("measurements", 0), c.get("ok", 0), c.get("failed", 0), c.get("correct_kernels", 0)]
        vals += [tb.get(b, 0) for b in bins]
        totals = [a + b for a, b in zip(totals, vals)]
        lines.append("| " + " | ".join([task] + [str(v) for v in vals]) + " |")
    lines.append("| **all** | " + " | ".join(str(v) for v in totals) + " |")
    lines.append("")
    lines.append("Bins: " + "; ".join(f"{i + 1} {n}" for i, n in enumerate(BIN_NAMES)) + ".")
    fk = summary.get("by_failure_kind", {})
    if fk:
        lines += ["", "| failure kind | measurements |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in fk.items()]
    return "\n".join(lines)
