"""Time the evaluation of one forecaster (pipelines.evaluation.evaluate.evaluate_forecasts, the
bootstrap included) on synthetic forecasts, and print a digest of the result, so two checkouts
can be compared for speed and for identical numbers:

    python3 benchmarks/evaluation.py [--pairs 2600] [--n-boot 1000] [--repo CHECKOUT]

Four forecasters are scored (Dirichlet-random, uniform, one-hot oracle, a coarse one with many
tied scores) over nine tasks, with parent pairs for the discovery metrics.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2600)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1],
                    help="the checkout whose evaluation code is timed (default: this one)")
    args = ap.parse_args()
    sys.path.insert(0, str(args.repo))
    import numpy as np
    import polars as pl

    from models.bins import speedups_to_bins
    from pipelines.evaluation.evaluate import evaluate_forecasts

    rng, n = np.random.default_rng(0), args.pairs
    true = np.exp(rng.normal(0.0, 1.5, n))
    random_p = rng.dirichlet(np.ones(8), size=n)
    coarse = np.round(random_p * 4) / 4 + 1e-9
    forecasters = {"random": random_p, "uniform": np.full((n, 8), 1 / 8),
                   "oracle": np.eye(8)[np.asarray(speedups_to_bins(true)) - 1],
                   "coarse": coarse / coarse.sum(axis=1, keepdims=True)}
    base = {"pair_id": [f"p{i}" for i in range(n)], "task": [f"t{i % 9}" for i in range(n)], "true_speedup": true,
            "anchor_kernel_id": [f"a{i % 9}" if i % 5 else f"b{i % 9}" for i in range(n)],
            "candidate_kernel_id": [f"c{i}" for i in range(n)], "hardware_id": "h",
            "pair_type": ["reference" if i % 7 else "parent" for i in range(n)]}
    t0 = time.perf_counter()
    results = {name: evaluate_forecasts(pl.DataFrame({**base, **{f"p{b + 1}": p[:, b] for b in range(8)}}),
                                        n_boot=args.n_boot)
               for name, p in forecasters.items()}
    seconds = time.perf_counter() - t0
    digest = hashlib.sha256(json.dumps(results, sort_keys=True).encode()).hexdigest()[:16]
    print(f"{len(forecasters)} forecasters x {n} pairs, n_boot={args.n_boot}: {seconds:.2f} s; results {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
