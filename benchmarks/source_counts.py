"""Time the cost model's source counts (models.classical.features.kernel_features' `src:` keys)
over every committed kernel, the way kernel_features counts them against a plain `re.findall`
per pattern, and check both give the same numbers:

    python3 benchmarks/source_counts.py [--rounds 2]

Prints the seconds of each way per round and their ratio.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import polars as pl

    from models.classical import features

    root = Path(__file__).resolve().parents[1] / "data" / "measurements"
    sources = [s for f in sorted(root.rglob("kernels-*.parquet"))
               for s in pl.read_parquet(f, columns=["source"])["source"].to_list() if s]
    codes = [features.code_text(s) for s in sources]
    plain = [{n: len(re.findall(p, c)) for n, p in features.SOURCE_COUNTS.items()} for c in codes]
    gated = [{n: features.kernel_features({"source": s})[f"src:{n}"] for n in features.SOURCE_COUNTS} for s in sources]
    if plain != gated:
        print("the two ways disagree")
        return 1
    print(f"{len(codes)} committed kernels, {len(features.SOURCE_COUNTS)} counts each: the same numbers both ways")
    for r in range(args.rounds):
        t0 = time.perf_counter()
        for c in codes:
            for p in features.SOURCE_COUNTS.values():
                len(re.findall(p, c))
        t1 = time.perf_counter()
        for c in codes:
            for name, (gates, _) in features._COUNTERS.items():
                features._COUNT[name](c) if any(g in c for g in gates) else 0
        t2 = time.perf_counter()
        print(f"round {r + 1}: plain re.findall {t1 - t0:.2f} s, kernel_features' way {t2 - t1:.2f} s, "
              f"ratio {(t2 - t1) / (t1 - t0):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
