"""The `library` split in detail: each forecaster's Brier, Spearman and accuracy on the published
kernels, and the best one's Brier per task and per source.

    python3 -m benchmarks.library_split --home H [--version DS] [--library-dir DIR]

Reads the rows `kernelcast run` writes beside a version's report when KERNELCAST_LIBRARY_DIR is
set (reports/<version>/library-dir.parquet) and, for each kernel's source repository, the folder's
kernels files (its `generator` column, "library:<owner>/<repo>"). Spearman is between a forecast's
expected log2-speedup (docs/method.md section 4) and the measured log2-speedup.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import polars as pl
from scipy.stats import spearmanr

from models.bins import BIN_LOG2_VALUES
from warehouse.bin_edges import P_COLS

ROWS = "library-dir.parquet"


def _scores(frame: pl.DataFrame) -> dict[str, float]:
    p, y = frame.select(P_COLS).to_numpy(), frame["true_bin"].to_numpy()
    brier = 0.5 * ((p - np.eye(len(P_COLS))[y - 1]) ** 2).sum(axis=1)
    expected = p @ np.asarray(BIN_LOG2_VALUES)
    rho = spearmanr(expected, np.log2(frame["speedup"].to_numpy())).statistic if np.ptp(expected) > 0 else float("nan")
    return {"n": frame.height, "brier": float(brier.mean()), "spearman": float(rho),
            "accuracy": float((p.argmax(axis=1) + 1 == y).mean())}


def library_report(rows: pl.DataFrame, kernels: pl.DataFrame | None = None) -> dict:
    """Per forecaster scores; the best forecaster (lowest Brier) per task and per source."""
    by_model = {ref: _scores(g) for (ref,), g in rows.group_by("model_ref", maintain_order=True)}
    best = min((r for r in by_model if not r.startswith("baseline:oracle")), key=lambda r: by_model[r]["brier"])
    chosen = rows.filter(pl.col("model_ref") == best)
    if kernels is not None and "generator" in kernels.columns:
        chosen = chosen.join(kernels.select("kernel_id", "generator").unique("kernel_id"),
                             left_on="candidate_kernel_id", right_on="kernel_id", how="left")
    else:
        chosen = chosen.with_columns(pl.lit(None, dtype=pl.Utf8).alias("generator"))
    per = {col: {str(k[0]): _scores(g)["brier"] for k, g in chosen.group_by(col)} for col in ("task", "generator")}
    return {"forecasters": by_model, "best": best, "per_task": per["task"], "per_source": per["generator"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", required=True, help="the KERNELCAST_HOME of the run")
    ap.add_argument("--version", help="dataset version (default: the newest report holding the rows)")
    ap.add_argument("--library-dir", default=os.environ.get("KERNELCAST_LIBRARY_DIR"),
                    help="the folder of published kernels (for their sources; default $KERNELCAST_LIBRARY_DIR)")
    args = ap.parse_args(argv)
    reports = Path(args.home) / "reports"
    found = sorted(reports.glob(f"{args.version or '*'}/{ROWS}"), key=lambda p: p.stat().st_mtime)
    if not found:
        print(f"no {ROWS} under {reports}: run `kernelcast run` with KERNELCAST_LIBRARY_DIR set", file=sys.stderr)
        return 1
    kernels = None
    try:
        if args.library_dir:
            files = sorted(Path(args.library_dir).rglob("kernels*.parquet"))
            kernels = pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed") if files else None
        report = library_report(pl.read_parquet(found[-1]), kernels)
    except (OSError, ValueError, pl.exceptions.PolarsError) as exc:
        print(f"cannot read the library split: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"{found[-1]}")
    print(f"{'forecaster':<36} {'n':>4} {'brier':>6} {'spearman':>9} {'accuracy':>9}")
    for ref, s in report["forecasters"].items():
        print(f"{ref:<36} {s['n']:>4} {s['brier']:>6.3f} {s['spearman']:>9.3f} {s['accuracy']:>9.3f}")
    for what in ("per_task", "per_source"):
        print(f"{report['best']} Brier {what.replace('_', ' ')}:")
        for key, value in sorted(report[what].items()):
            print(f"  {key:<44} {value:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
