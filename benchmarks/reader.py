"""How many kernels of a batch the file reader takes: every kernel of a kernels Parquet (the
library set that `python -m pipelines.generation.library build` writes, a style batch, ...) is
written to a file and read as `kernelcast forecast` reads files (with its default settings),
one task at a time; prints each refusal and the count per task.

    python benchmarks/reader.py FOLDER/kernels-library.parquet [--workers 2] [--name-column algorithm]

The reader is whatever `pipelines.forecasting.files.read_kernel_files` is on the path, so the same
command on an older checkout (PYTHONPATH=<that checkout>) gives the figures before a change.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import polars as pl


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernels", type=Path, help="a Parquet file with kernel_id, task, source")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--name-column", default="algorithm", help="the column naming each kernel (else kernel_id)")
    args = ap.parse_args(argv)
    from pipelines.forecasting.files import read_kernel_files

    frame = pl.read_parquet(args.kernels)
    name = args.name_column if args.name_column in frame.columns else "kernel_id"
    refused, total = Counter(), Counter()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kernelcast-reader-") as tmp:
        for (task,), group in sorted(frame.group_by("task"), key=lambda g: g[0]):
            paths = []
            for row in group.iter_rows(named=True):
                path = Path(tmp) / f"{row[name] or row['kernel_id']}.py"
                path.write_text(row["source"])
                paths.append(path)
            for f in read_kernel_files(task, paths, n_workers=args.workers):
                total[task] += 1
                if f.refused:
                    refused[task] += 1
                    print(f"{task:<17} {f.path.stem:<40} refused: {f.refused[:160]}")
    print(f"\n{'task':<17} {'read':>5} {'refused':>8}")
    for task in sorted(total):
        print(f"{task:<17} {total[task] - refused[task]:>5} {refused[task]:>8}")
    print(f"{'all':<17} {sum(total.values()) - sum(refused.values()):>5} {sum(refused.values()):>8}"
          f"   ({time.perf_counter() - t0:.0f} s, {args.workers} workers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
