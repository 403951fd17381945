"""A worker batch of kernels in the styles people write: every style generator, every task.

    python -m pipelines.generation.styles --out B.parquet [--per-task 250] [--seed 0] \\
        [--tasks softmax,rms_norm] [--styles pytorch_programs,library_triton] [--skip-measured data]

Each style's `generate(task, per_task, seed)`; kernels whose id is in a `kernels-*.parquet` under
--skip-measured (measured already) are left out, so a new seed's batch holds only new kernels.
Rows are interleaved task by task and style by style, so a run cut short by its time budget covers
every task and style alike. The file has KERNEL_BATCH_SCHEMA columns (pipelines.generation.
candidates.write_batch); a summary JSON (rows per task and style) is written beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from itertools import zip_longest
from pathlib import Path

import polars as pl

from pipelines.generation.candidates import FEATURE_COLUMNS, RECORD_COLUMNS, write_batch
from pipelines.generation.styles import STYLE_MODULES, style_module
from pipelines.tasks import TASK_MODULES


def measured_ids(root: Path) -> set[str]:
    """Kernel ids of every kernels-*.parquet under `root` (none when it does not exist)."""
    ids: set[str] = set()
    for f in sorted(root.rglob("kernels-*.parquet")) if root.is_dir() else []:
        ids |= set(pl.read_parquet(f, columns=["kernel_id"])["kernel_id"].to_list())
    return ids


def style_batch(tasks: list[str], styles: list[str], per_task: int, seed: int,
                skip: set[str] = frozenset()) -> list[dict]:
    """Records of every style and task, interleaved (task by task, then style by style)."""
    lists = []
    for task in tasks:
        for name in styles:
            lists.append([r for r in style_module(name).generate(task, per_task, seed) if r["kernel_id"] not in skip])
    seen: set[str] = set()
    out = []
    for row in (r for group in zip_longest(*lists) for r in group if r is not None):
        if row["kernel_id"] not in seen:
            seen.add(row["kernel_id"])
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.generation.styles", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="the batch (Parquet)")
    ap.add_argument("--per-task", type=int, default=250, help="kernels per task and style (at most)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tasks", default=",".join(TASK_MODULES), help="comma-separated tasks")
    ap.add_argument("--styles", default=",".join(STYLE_MODULES), help="comma-separated style modules")
    ap.add_argument("--skip-measured", type=Path, default=None, help="a folder of kernels-*.parquet to leave out")
    args = ap.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    styles = [s for s in args.styles.split(",") if s]
    unknown = [t for t in tasks if t not in TASK_MODULES] + [s for s in styles if s not in STYLE_MODULES]
    if unknown:
        print(f"error: unknown task or style: {', '.join(unknown)}", file=sys.stderr)
        return 2
    skip = measured_ids(args.skip_measured) if args.skip_measured else set()
    rows = style_batch(tasks, styles, args.per_task, args.seed, skip)
    frame = pl.DataFrame(rows, schema=RECORD_COLUMNS).with_columns(
        [pl.lit(None, dtype=d).alias(c) for c, d in FEATURE_COLUMNS.items()])
    write_batch(frame, args.out)
    counts = Counter((r["task"], r["generator"]) for r in rows)
    summary = {"rows": len(rows), "skipped_measured": len(skip), "seed": args.seed, "per_task": args.per_task,
               "by_task_and_style": {f"{t}/{g}": n for (t, g), n in sorted(counts.items())}}
    args.out.with_suffix(".summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{len(rows)} kernels -> {args.out}")
    for (t, g), n in sorted(counts.items()):
        print(f"  {t:<18} {g:<18} {n:>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
