"""Build the neighbourhood batch the search simulation needs measured (run here, on the CPU).

Simulates the search plan on the committed measurements (every task, mode and seed, with the
oracle and the uniform forecaster and any --forecaster, both anchors), collects every proposed child without a
measurement, iterates with imputed outcomes to reach the children later paths will propose
(pipelines/search/coverage.py), and writes, in priority order:

    <out>/kernels.parquet        every frontier kernel with its lineage (commit_measurements --kernels)
    <out>/neighbourhood.parquet  the worker's --batch (the first --limit kernels, all by default)
    <out>/frontier.json          rounds, counts by task, projected coverage after n measured

Usage (defaults: the search settings of orchestration/settings.py):
    .venv/bin/python scripts/build_search_batch.py --out .gpu-search [--seeds 8 --budget 12 --rounds 3] \
        [--forecaster kind:cost_model]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq

from orchestration.settings import load_settings
from pipelines.forecasting.references import OracleForecaster, UniformForecaster
from pipelines.search.coverage import (
    coverage_if_measured,
    frontier,
    task_costs,
    write_frontier_batch,
)
from pipelines.search.forecasters import ForecasterContext, resolve_forecaster
from pipelines.search.registered import register_search_forecasters
from pipelines.search.simulate import SimulationPlan, simulate
from pipelines.search.table import load_table_parquet
from pipelines.tasks import task_names


def main() -> None:
    s = load_settings().search
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=Path("data/measurements"))
    ap.add_argument("--hardware", default=s.hardware_id)
    ap.add_argument("--tasks", default=",".join(s.tasks), help="comma-separated (default: every measured task)")
    ap.add_argument("--seeds", type=int, default=s.seeds)
    ap.add_argument("--budget", type=int, default=s.budget)
    ap.add_argument("--anchors", default="reference,parent")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--limit", type=int, default=None, help="kernels in the worker batch (default: all)")
    ap.add_argument("--forecaster", action="append", default=[],
                    help="also follow this forecaster's runs (repeatable), e.g. kind:cost_model (the registry of $KERNELCAST_HOME)")
    args = ap.parse_args()

    table = load_table_parquet(args.data, args.hardware)
    tasks = tuple(t for t in args.tasks.split(",") if t) or tuple(t for t in task_names() if t in table.tasks())
    base = SimulationPlan(tasks=tasks, seeds=args.seeds, budget=args.budget, hardware_id=args.hardware)
    scenarios = [(replace(base, anchor="reference"), lambda t: UniformForecaster())]
    scenarios += [(replace(base, anchor=a), OracleForecaster) for a in args.anchors.split(",") if a]
    if args.forecaster:
        register_search_forecasters()
        settings = load_settings()
        ctx = ForecasterContext(tracking_uri=settings.mlflow_uri, home=settings.home)
        for name in args.forecaster:
            fc = resolve_forecaster(name, ctx)
            scenarios += [(replace(base, anchor=a), lambda t, fc=fc: fc) for a in args.anchors.split(",") if a]
    results = [r for p in sorted(args.data.rglob("results-*.parquet"))
               for r in pq.read_table(p, columns=["task", "time_s"]).to_pylist()]
    cost = task_costs(results)
    entries, stats = frontier(scenarios, table, rounds=args.rounds, cost=cost, progress=print)
    written = write_frontier_batch(entries, args.out, limit=args.limit)
    runs = [r for plan, f in scenarios for r in simulate(plan, table, f(table))]
    sizes = [n for n in (100, 200, 300, 400, 500, 600, 800, len(entries)) if n <= len(entries)]
    projected = coverage_if_measured(runs, table, entries, sizes)
    report = {"plan": {"tasks": tasks, "seeds": args.seeds, "budget": args.budget, "anchors": args.anchors},
              "rounds": stats, "frontier": len(entries), "by_task": dict(Counter(e.task for e in entries)),
              "by_round": dict(Counter(e.first_round for e in entries)), "batch": written,
              "cost_s_per_kernel": cost, "projected_coverage_after_n": projected}
    (args.out / "frontier.json").write_text(json.dumps(report, indent=1))
    print(f"{len(entries)} unmeasured children -> {args.out}/neighbourhood.parquet ({written['batch']} kernels); by task: "
          + ", ".join(f"{t} {n}" for t, n in report["by_task"].items()))
    print("projected coverage of today's proposals after the first n are measured: "
          + ", ".join(f"{n}: {c:.3f}" for n, c in projected.items()))


if __name__ == "__main__":
    main()
