"""Time the measuring child's integrity check (`integrity.Watch.changes`, made about five times a
kernel) with its quick "nothing changed" test and with the full comparison alone, in turn, in one
process, after loading every task as the measuring child does:

    python3 benchmarks/integrity.py [--calls 200] [--rounds 3]

Prints the milliseconds a check of each way per round and their ratio, and checks that both
find nothing on an untouched process.
"""

from __future__ import annotations

import argparse
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from pipelines.profiling import kernel_loading

    watch = kernel_loading.start_watch()
    quick = watch.held.unchanged

    def full() -> bool:
        return False  # the quick test says "maybe": the full comparison runs

    ways = {"quick test first": quick, "full comparison": full}
    for way, test in ways.items():
        watch.held.unchanged = test
        if watch.changes():
            raise SystemExit(f"{way}: changes found in an untouched process: {watch.changes()}")
    for r in range(args.rounds):
        ms = {}
        for way, test in ways.items():
            watch.held.unchanged = test
            t0 = time.perf_counter()
            for _ in range(args.calls):
                watch.changes()
            ms[way] = (time.perf_counter() - t0) / args.calls * 1e3
        print(f"round {r + 1}: " + ", ".join(f"{w} {v:.2f} ms" for w, v in ms.items())
              + f"; ratio {ms['quick test first'] / ms['full comparison']:.2f}")
    watch.held.unchanged = quick
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
