"""Profiling benchmarks from result files: throughput, repeatability, protocol comparison.

    # (a) throughput: correct measured kernels per GPU-hour, end to end
    python3 -m benchmarks.profiling throughput RUN.parquet [--summary RUN.summary.json]
    # ... over several runs (GPUs, calls): each results-X.parquet with its summary-X.json beside it
    python3 -m benchmarks.profiling throughput-many results-X.parquet results-Y.parquet ...
    # (b) repeatability: build a re-measure batch from a run, measure it again, compare
    python3 -m benchmarks.profiling subset RUN.parquet BATCH.parquet --n 200 --out REPEAT_BATCH.parquet
    python3 -m benchmarks.profiling compare RUN.parquet REPEAT.parquet
    # (c) our protocol vs the paper's on the same kernels (and each protocol against itself)
    python3 -m benchmarks.profiling compare KERNELCAST.parquet PAPER.parquet
    # the rest of a batch after earlier runs (a later run on the same batch; infrastructure failures are retried)
    python3 -m benchmarks.profiling remaining BATCH.parquet RUN1.parquet [RUN2.parquet ...] --out REST.parquet

`compare` joins two result files on kernel_id (both ok) and reports, over the common
kernels, the median and 95th percentile of |log2(speedup_a / speedup_b)|, the share within
5% and 10%, Spearman's rank correlation, the share landing in the same speedup bin, and each
file's median relative stderr per case (the spread). Runs on the GPU host too (numpy + pyarrow
only; the bin edges come from warehouse/bin_edges.py). Add --json for machine-readable output.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.profiling.results import RETRIED_KINDS
from warehouse.bin_edges import checked_speedups, table_bins


def _ok_rows(path: str) -> dict[str, dict]:
    rows = pq.read_table(path).to_pylist()
    return {r["kernel_id"]: r for r in rows if r["status"] == "ok" and r["speedup"] and r["speedup"] > 0}


def _rank(a: np.ndarray) -> np.ndarray:
    order = a.argsort(kind="stable")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(len(a))
    for v in np.unique(a):  # average ranks of ties
        idx = a == v
        ranks[idx] = ranks[idx].mean()
    return ranks


def spread(rows: dict[str, dict]) -> dict:
    """Median and p95 over cases of stderr/median of the kernel's per-call times."""
    rel = [se / med for r in rows.values() for se, med in zip(r["kernel_stderr_ms"], r["kernel_median_ms"]) if med and math.isfinite(se)]
    if not rel:
        return {"cases": 0}
    a = np.asarray(rel)
    return {"cases": int(a.size), "median_rel_stderr": float(np.median(a)), "p95_rel_stderr": float(np.percentile(a, 95))}


def compare(path_a: str, path_b: str) -> dict:
    a, b = _ok_rows(path_a), _ok_rows(path_b)
    common = sorted(set(a) & set(b))
    out: dict = {"a": path_a, "b": path_b, "ok_a": len(a), "ok_b": len(b), "common": len(common),
                 "protocol_a": next((r["protocol"] for r in a.values()), None),
                 "protocol_b": next((r["protocol"] for r in b.values()), None),
                 "spread_a": spread(a), "spread_b": spread(b)}
    if not common:
        return out
    sa = np.array([a[k]["speedup"] for k in common])
    sb = np.array([b[k]["speedup"] for k in common])
    d = np.abs(np.log2(sa / sb))
    out.update(
        median_abs_log2=float(np.median(d)), p95_abs_log2=float(np.percentile(d, 95)), max_abs_log2=float(d.max()),
        share_within_5pct=float(np.mean(d <= math.log2(1.05))), share_within_10pct=float(np.mean(d <= math.log2(1.10))),
        spearman=float(np.corrcoef(_rank(sa), _rank(sb))[0, 1]) if len(common) > 2 else None,
        median_speedup_a=float(np.median(sa)), median_speedup_b=float(np.median(sb)),
        worst=[{"kernel_id": k, "a": float(x), "b": float(y)} for k, x, y, _ in sorted(zip(common, sa, sb, d), key=lambda t: -t[3])[:5]],
    )
    # pairs against the shared anchor (the reference): same bin under both measurements?
    out["same_bin_share"] = float(np.mean(table_bins(checked_speedups(sa)) == table_bins(checked_speedups(sb))))
    return out


def throughput(path: str, summary_path: str | None) -> dict:
    rows = pq.read_table(path).to_pylist()
    ok = [r for r in rows if r["status"] == "ok"]
    times = sorted(r["measured_at"] for r in rows)
    span_s = (times[-1] - times[0]).total_seconds() if len(times) > 1 else float("nan")
    out = {"rows": len(rows), "ok": len(ok), "failed": len(rows) - len(ok), "first_to_last_row_s": span_s}
    if summary_path:  # the worker's --summary-json: true wall time including start-up
        s = json.loads(Path(summary_path).read_text())
        out["wall_s"] = s["elapsed_s"]
        n_ok_now = len(ok) if s.get("measured_now") == len(rows) else None
        if n_ok_now is not None and s["elapsed_s"] > 0:
            out["ok_per_gpu_hour"] = n_ok_now / s["elapsed_s"] * 3600
            # How much of the wall the measuring child spent checking and timing (the rest:
            # start-up, reference timings, and compile phases while the timer waits).
            busy = sum((r["check_s"] or 0.0) + (r["time_s"] or 0.0) for r in rows)
            out["measuring_share"] = busy / s["elapsed_s"]
    if span_s and span_s > 0:
        out["ok_per_gpu_hour_steady"] = len(ok) / span_s * 3600  # excludes start-up and the first compile
    for key in ("compile_s", "check_s", "time_s"):
        vals = [r[key] for r in ok if r[key] is not None]
        if vals:
            out[f"median_{key}"] = float(np.median(vals))
    return out


def throughput_many(result_paths: list[str]) -> dict:
    """Throughput over several runs (several GPUs or calls): each results-X.parquet with the
    summary-X.json beside it; correct kernels of all runs over the sum of their GPU wall seconds."""
    out: dict = {}
    total_ok, total_s = 0, 0.0
    for path in result_paths:
        summary = Path(path).with_name(Path(path).name.replace("results-", "summary-", 1)).with_suffix(".json")
        if not summary.is_file():
            raise OSError(f"{path}: no run summary beside it ({summary.name})")
        one = throughput(path, str(summary))
        if "ok_per_gpu_hour" not in one:
            raise KeyError(f"{path}: its summary does not cover exactly this file's rows (a resumed run?)")
        out[Path(path).stem] = f"{one['ok']} correct in {one['wall_s']:.1f} s: {one['ok_per_gpu_hour']:.0f} per GPU-hour"
        total_ok, total_s = total_ok + one["ok"], total_s + one["wall_s"]
    out["correct"], out["gpu_s"] = total_ok, round(total_s, 1)
    out["ok_per_gpu_hour"] = round(total_ok / total_s * 3600) if total_s else float("nan")
    return out


def subset(result_path: str, batch_path: str, n: int, out: str, seed: int = 0) -> dict:
    ok = sorted(_ok_rows(result_path))
    rng = np.random.default_rng(seed)
    pick = set(rng.choice(ok, size=min(n, len(ok)), replace=False).tolist()) if ok else set()
    batch = pq.read_table(batch_path)
    mask = pa.array([k in pick for k in batch.column("kernel_id").to_pylist()])
    sub = batch.filter(mask)
    pq.write_table(sub, out, compression="zstd")
    return {"picked": len(pick), "written": sub.num_rows, "out": out}


def remaining(batch_path: str, result_paths: list[str], out: str) -> dict:
    """The batch's kernels that none of the result files has a row for, in batch order; a row
    of a failure the worker retries on resume (`infrastructure`: the harness's fault, not the
    kernel's) does not count either."""
    done: set[str] = set()
    for path in result_paths:
        table = pq.read_table(path, columns=["kernel_id", "failure_kind"])
        kinds = table.column("failure_kind").to_pylist()
        done.update(k for k, kind in zip(table.column("kernel_id").to_pylist(), kinds) if kind not in RETRIED_KINDS)
    batch = pq.read_table(batch_path)
    rest = batch.filter(pa.array([k not in done for k in batch.column("kernel_id").to_pylist()]))
    pq.write_table(rest, out, compression="zstd")
    return {"batch": batch.num_rows, "done": batch.num_rows - rest.num_rows, "remaining": rest.num_rows, "out": out}


def _print(report: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report, indent=2, default=str))
        return
    for k, v in report.items():
        if isinstance(v, float):
            v = f"{v:.4g}"
        print(f"{k:>24}: {v}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("result")
    t.add_argument("--summary", default=None)
    m = sub.add_parser("throughput-many", help="several runs together (each with its summary-*.json beside it)")
    m.add_argument("results", nargs="+")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    s = sub.add_parser("subset")
    s.add_argument("result")
    s.add_argument("batch")
    s.add_argument("--n", type=int, default=200)
    s.add_argument("--out", required=True)
    s.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("remaining")
    r.add_argument("batch")
    r.add_argument("results", nargs="+")
    r.add_argument("--out", required=True)
    for p in (t, m, c, s, r):
        p.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "throughput":
            report = throughput(args.result, args.summary)
        elif args.cmd == "throughput-many":
            report = throughput_many(args.results)
        elif args.cmd == "compare":
            report = compare(args.a, args.b)
        elif args.cmd == "remaining":
            report = remaining(args.batch, args.results, args.out)
        else:
            report = subset(args.result, args.batch, args.n, args.out, args.seed)
    except (OSError, pa.ArrowInvalid, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    _print(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
