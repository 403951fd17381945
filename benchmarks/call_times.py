"""Per-call times of gpumode's paired loops, read back from the measuring children's logs.

`python3 -m pipelines.profiling.worker ... --protocol gpumode --call-times --log-dir D` has each
measuring child write, per case, every timed call of the kernel's loop and the reference's in
the order they were made (runner.Measurer.paired_case_steps, gpumode_timing.Turns.record). This module
reads them and says where the two loops' means part: GPU MODE's statistic is the mean of at most
100 calls, so a stretch of slow calls that falls on one loop moves that loop's mean alone.

    python3 -m benchmarks.call_times D [--json] [--slow 1.5]

Per case and loop: calls, median, mean, mean over median, and the slow calls (above `--slow`
times the loop's median), with how many were the first of a turn and how many the loop's first
timed call of the case (taken call by call, every call but the first opens a turn); per
case the speedup of the means and of the medians, and the slow stretches: runs of slow calls in
the order made, either loop's, with how many calls of each loop they hold.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path

from pipelines.profiling.results import CALL_TIMES_TAG

SLOW = 1.5  # a call above this many times its loop's median is slow


def _well_formed(rec: object) -> bool:
    """A case record as runner.py writes it: two loop names and calls of (loop, ms, ms, ms, bool).
    The child's log is also the kernel's stderr, so a line may be the kernel's, of any shape."""
    if not isinstance(rec, dict) or not isinstance(rec.get("calls"), list) or not rec["calls"]:
        return False
    loops = rec.get("loops", ["kernel", "reference"])
    if not isinstance(loops, list) or len(loops) != 2 or not all(isinstance(n, str) for n in loops):
        return False
    for c in rec["calls"]:
        if not (isinstance(c, list) and len(c) == 5 and c[0] in (0, 1) and isinstance(c[4], bool)
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in c[1:4])):
            return False
    return True


def read_call_times(log_dir: str | Path) -> tuple[list[dict], int]:
    """The case records in the logs under `log_dir`, in file then line order, and how many lines
    carried the tag but were not a well-formed record (skipped)."""
    records, skipped = [], 0
    for path in sorted(Path(log_dir).rglob("*.log")):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.startswith(CALL_TIMES_TAG):
                    continue
                try:
                    rec = json.loads(line[len(CALL_TIMES_TAG):])
                except (json.JSONDecodeError, RecursionError):
                    rec = None
                if _well_formed(rec):
                    records.append({**rec, "log": path.name})
                else:
                    skipped += 1
    return records, skipped


def _stretches(calls: list, medians: dict[int, float], slow: float) -> list[dict]:
    """Runs of slow calls in the order made: their length and how many calls of each loop."""
    out, run = [], []
    for loop, _t, took, _wall, _resumed in [*calls, (None, 0.0, 0.0, 0.0, False)]:
        if loop is not None and took > slow * medians[loop]:
            run.append(loop)
            continue
        if run:
            out.append({"calls": len(run), "by_loop": [run.count(i) for i in sorted(medians)]})
            run = []
    return out


def summarize_case(rec: dict, slow: float = SLOW) -> dict:
    """One case's loops side by side (see the module docstring)."""
    calls = [tuple(c) for c in rec["calls"]]
    loops = rec.get("loops") or ["kernel", "reference"]
    by_loop = {i: [c for c in calls if c[0] == i] for i in range(len(loops))}
    medians = {i: statistics.median(c[2] for c in cs) for i, cs in by_loop.items() if cs}
    sides = {}
    for i, cs in by_loop.items():
        if not cs:
            continue
        times = [c[2] for c in cs]
        slow_calls = [c for c in cs if c[2] > slow * medians[i]]
        sides[loops[i]] = {
            "calls": len(cs), "median_ms": medians[i], "mean_ms": statistics.fmean(times),
            "mean_over_median": statistics.fmean(times) / medians[i] if medians[i] > 0 else float("nan"),
            "slow_calls": len(slow_calls), "slow_first_of_turn": sum(1 for c in slow_calls if c[4]),
            "slow_first_call": int(bool(slow_calls) and slow_calls[0] is cs[0]),
            "slow_extra_ms": sum(c[2] - medians[i] for c in slow_calls),
        }
    out = {"task": rec.get("task"), "case_id": rec.get("case_id"), "log": rec.get("log"), "loops": sides,
           "stretches": _stretches(calls, medians, slow)}
    if len(sides) == 2:
        k, r = (sides[name] for name in loops[:2])
        out["speedup_means"] = r["mean_ms"] / k["mean_ms"]
        out["speedup_medians"] = r["median_ms"] / k["median_ms"]
    return out


def lines(summaries: Iterable[dict]) -> list[str]:
    """A plain table, one line per case and loop."""
    rows = ["task              case                          loop       calls  median_ms  mean/med  slow (turn, first)    "
            "speedup mean | median  stretches"]
    for s in summaries:
        head = f"{str(s['task'])[:17]:17s} {str(s['case_id'])[:29]:29s}"
        for j, (name, side) in enumerate(s["loops"].items()):
            tail = ""
            if j == 0 and "speedup_means" in s:
                lengths = ",".join(f"{t['calls']}({'/'.join(map(str, t['by_loop']))})" for t in s["stretches"]) or "-"
                tail = f"  {s['speedup_means']:.3f} | {s['speedup_medians']:.3f}  {lengths}"
            rows.append(f"{head if j == 0 else ' ' * len(head)} {name:10s} {side['calls']:5d}  {side['median_ms']:9.4f}  "
                        f"{side['mean_over_median']:8.3f}  {side['slow_calls']:4d} ({side['slow_first_of_turn']}, "
                        f"{side['slow_first_call']}){'':9s}{tail}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.call_times",
                                 description="Summarise the per-call times that `worker --call-times` left in its children's logs.")
    ap.add_argument("log_dir", help="the worker's --log-dir")
    ap.add_argument("--slow", type=float, default=SLOW, help=f"a call above this many times its loop's median is slow (default {SLOW})")
    ap.add_argument("--json", action="store_true", help="one JSON object per case instead of the table")
    args = ap.parse_args(argv)
    if not Path(args.log_dir).is_dir():
        print(f"error: {args.log_dir} is not a folder", file=sys.stderr)
        return 2
    records, skipped = read_call_times(args.log_dir)
    if skipped:
        print(f"warning: {skipped} line(s) tagged {CALL_TIMES_TAG.strip()!r} in {args.log_dir} are not call-time "
              "records and were skipped", file=sys.stderr)
    if not records:
        print(f"error: no call times in {args.log_dir} (was the worker run with --protocol gpumode --call-times?)",
              file=sys.stderr)
        return 2
    summaries = [summarize_case(r, args.slow) for r in records]
    if args.json:
        for s in summaries:
            print(json.dumps(s))
    else:
        print("\n".join(lines(summaries)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
