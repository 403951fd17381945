"""A worker batch of kernels nobody here wrote: published submissions and library kernels.

The folder holds third-party code fetched at run time, never part of the repository:

    DIR/<task>/<name>.py      one kernel module per file (custom_kernel(data)), the task from the
                              folder name; `DIR/<task>/` of an unknown task is refused

    python3 -m benchmarks.third_party_batch DIR --out batch.parquet [--names names.json]

Every file becomes one batch row in KERNEL_BATCH_SCHEMA: kernel id = sha256 of the normalised
source (the warehouse's content address, so a measurement of it ingests like any other), generator
"external:<name>", no algorithm, knobs or parent. `--names` writes {kernel_id: "task/name"}, the
mapping a results page keeps so the measurements stay traceable after the sources are gone.
Only the standard library and pyarrow: it runs on a bare GPU host beside the worker.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.tasks import TASK_MODULES
from warehouse.formats import KERNEL_BATCH_SCHEMA
from warehouse.ids import kernel_id

EXTERNAL_PREFIX = "external:"


def external_rows(folder: str | Path) -> list[dict]:
    """One kernel-batch row per `folder/<task>/*.py`, sorted by task and file name.

    Raises:
        ValueError: a sub-folder names no task of the suite, or the folder holds no kernel.
    """
    root = Path(folder)
    rows: list[dict] = []
    for task_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        files = sorted(task_dir.glob("*.py"))
        if not files:
            continue
        if task_dir.name not in TASK_MODULES:
            raise ValueError(f"{task_dir}: {task_dir.name!r} is not a task of the suite ({', '.join(TASK_MODULES)})")
        for path in files:
            source = path.read_text(encoding="utf-8")
            rows.append({
                "kernel_id": kernel_id(source), "task": task_dir.name, "source": source,
                "language": "triton" if "@triton.jit" in source or "triton.jit" in source else "pytorch",
                "generator": EXTERNAL_PREFIX + path.stem, "generator_version": None, "algorithm": None,
                "knobs_json": None, "parent_kernel_id": None, "mutation": None,
            })
    if not rows:
        raise ValueError(f"{root}: no <task>/*.py kernel files")
    return rows


def write_batch(rows: list[dict], path: str | Path) -> Path:
    """The rows as a zstd Parquet batch in KERNEL_BATCH_SCHEMA (one row per distinct kernel id)."""
    seen: dict[str, dict] = {}
    for r in rows:
        seen.setdefault(r["kernel_id"], r)
    table = pa.Table.from_pylist([{k: r.get(k) for k in KERNEL_BATCH_SCHEMA.names} for r in seen.values()],
                                 schema=KERNEL_BATCH_SCHEMA)
    pq.write_table(table, path, compression="zstd")
    return Path(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="DIR with <task>/<name>.py kernel files")
    ap.add_argument("--out", required=True, help="batch Parquet file to write")
    ap.add_argument("--names", help="JSON file to write {kernel_id: 'task/name'}")
    args = ap.parse_args(argv)
    if not Path(args.folder).is_dir():
        print(f"error: {args.folder}: not a folder", file=sys.stderr)
        return 2
    try:
        rows = external_rows(args.folder)
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_batch(rows, args.out)
    if args.names:
        names = {r["kernel_id"]: f"{r['task']}/{r['generator'].removeprefix(EXTERNAL_PREFIX)}" for r in rows}
        Path(args.names).write_text(json.dumps(names, indent=1, sort_keys=True) + "\n")
    by_task: dict[str, int] = {}
    for r in rows:
        by_task[r["task"]] = by_task.get(r["task"], 0) + 1
    print(f"{len(rows)} external kernels: " + ", ".join(f"{t} {n}" for t, n in sorted(by_task.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
