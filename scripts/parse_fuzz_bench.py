"""Fuzz benchmark of the answer parser (models.parsing): crashes, outcomes and time against length.

    .venv/bin/python scripts/parse_fuzz_bench.py [--n 10000] [--seed 0] [--max-chars 8000] [--json]

Parses `--n` generated model answers (tests/parse_fuzz_cases.py: valid, fenced, two answers,
truncated, corrupted, invalid fields, hostile inputs built to slow a naive scanner, noise),
counts crashes (an exception, or a failure the parser reports as unexpected), prints the parse
outcome by kind, the time per answer and per KB in length quartiles (a parser linear in the
answer's length has the same time per KB in every quartile; the script prints the ratio of the
longest quartile's to the shortest's), and the time per character of each hostile input at 20k,
80k and 320k characters (flat rows: linear).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

from models.parsing import parse_forecast

CASES = Path(__file__).resolve().parents[1] / "tests" / "parse_fuzz_cases.py"


def _cases():
    spec = importlib.util.spec_from_file_location("parse_fuzz_cases", CASES)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-chars", type=int, default=8000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    cases = _cases()

    crashes, by_kind, lengths, seconds = [], {}, [], []
    for kind, text, expected in cases.answers(args.n, seed=args.seed, max_chars=args.max_chars):
        t0 = time.perf_counter()
        try:
            f = parse_forecast(text)
        except Exception as e:  # noqa: BLE001 - counted, it is what we measure
            crashes.append(f"{kind}: {type(e).__name__}: {e}")
            continue
        dt = time.perf_counter() - t0
        if not f.parse_ok and "unexpected parse error" in (f.parse_error or ""):
            crashes.append(f"{kind}: {f.parse_error}")
        k = by_kind.setdefault(kind, {"n": 0, "parsed": 0, "right_bin": 0})
        k["n"] += 1
        k["parsed"] += int(f.parse_ok)
        k["right_bin"] += int(expected is not None and f.parse_ok and f.predicted_bin == expected)
        lengths.append(len(text))
        seconds.append(dt)

    x, y = np.asarray(lengths, float), np.asarray(seconds, float)
    edges = np.quantile(x, [0, 0.25, 0.5, 0.75, 1.0])
    buckets = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (x >= lo) & (x <= hi)
        buckets.append({"chars": [int(lo), int(hi)], "answers": int(m.sum()), "us_per_answer": float(y[m].mean() * 1e6),
                        "us_per_kb": float((y[m].sum() / max(x[m].sum(), 1)) * 1e6 * 1024)})
    hostile = {}
    for kind in cases.HOSTILE:
        row = {}
        for n in (20_000, 80_000, 320_000):
            text = cases.hostile(kind, n)
            t0 = time.perf_counter()
            parse_forecast(text)
            row[n] = (time.perf_counter() - t0) / len(text) * 1e9  # ns per char
        hostile[kind] = row
    report = {"answers": len(lengths) + len(crashes), "crashes": len(crashes), "crash_examples": crashes[:5],
              "by_kind": by_kind, "us_per_kb_longest_over_shortest": buckets[-1]["us_per_kb"] / buckets[0]["us_per_kb"],
              "buckets": buckets, "hostile_ns_per_char": hostile}
    if args.json:
        print(json.dumps(report, indent=2))
        return 1 if crashes else 0
    print(f"{report['answers']} answers, {len(crashes)} crashes")
    print(f"{'kind':16s} {'n':>6s} {'parsed':>7s} {'right bin':>9s}")
    for kind, k in sorted(by_kind.items()):
        print(f"{kind:16s} {k['n']:6d} {k['parsed']:7d} {k['right_bin']:9d}")
    print(f"time per KB, longest quartile over shortest: {report['us_per_kb_longest_over_shortest']:.2f} (1: linear)")
    for b in buckets:
        print(f"  {b['chars'][0]:6d}-{b['chars'][1]:6d} chars: {b['answers']:5d} answers, "
              f"{b['us_per_answer']:8.1f} us/answer, {b['us_per_kb']:6.2f} us/KB")
    print("hostile inputs, ns per char at 20k / 80k / 320k chars:")
    for kind, row in hostile.items():
        print(f"  {kind:16s} " + " / ".join(f"{v:6.1f}" for v in row.values()))
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
