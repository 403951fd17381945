"""Build the kernel batches of a GPU measuring round (run here, on the CPU).

For every task: a lineage walk from the seed kernel (parent -> child moments for discovery pairs
and search) plus a stratified uniform sample over algorithm families (every algorithm, so every
bin the space can reach). Kernels are interleaved across tasks so that a run cut short by its
time budget still covers every task. Writes:

    <out>/kernels.parquet      every kernel (+ the task references), KERNEL_BATCH_SCHEMA: goes to data/
    <out>/part-<i>.parquet     the worker's input, split into parts (one per worker run)

Usage:
    python scripts/build_gpu_batches.py --out .gpu-batches --parts 2 \
        --plan softmax=1000,rms_norm=1000,layer_norm=1000,fp8_quant=900,cross_entropy=900,\
matmul_bias_gelu=600,causal_attention=500,gdn_chunk_fwd_o=400,trimul=250

A batch biased to chosen algorithms (no lineage; `sampler.sample_algorithms`): --algorithms
names them per task (alg1+alg2), or "bin-fill" takes sampler.BIN_FILL_ALGORITHMS for every task
of the plan that has an entry there; tasks without one keep the lineage + uniform mix:
    python scripts/build_gpu_batches.py --out .gpu-batches-binfill --parts 1 --seed 7 \
        --plan softmax=40,rms_norm=40,layer_norm=40,fp8_quant=40,cross_entropy=40,\
matmul_bias_gelu=40,trimul=20 --algorithms bin-fill
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import polars as pl

from pipelines.generation import sampler
from pipelines.generation.candidates import FEATURE_COLUMNS, RECORD_COLUMNS, write_batch
from pipelines.generation.reference import reference_record


def parse_plan(text: str) -> dict[str, int]:
    plan = {}
    for item in text.split(","):
        name, _, n = item.strip().partition("=")
        plan[name] = int(n)
    return plan


def parse_algorithms(text: str | None, tasks: list[str]) -> dict[str, tuple[str, ...]]:
    """'bin-fill' -> sampler.BIN_FILL_ALGORITHMS (plan tasks only); 'task=a+b,task2=c' -> as written."""
    if not text:
        return {}
    if text == "bin-fill":
        return {t: sampler.BIN_FILL_ALGORITHMS[t] for t in tasks if t in sampler.BIN_FILL_ALGORITHMS}
    out = {}
    for item in text.split(","):
        name, _, algs = item.strip().partition("=")
        out[name] = tuple(a for a in algs.split("+") if a)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--plan", required=True, help="task=count,... (kernels per task, lineage + uniform halves)")
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lineage-share", type=float, default=0.5)
    ap.add_argument("--chunk", type=int, default=48, help="kernels of one task in a row")
    ap.add_argument("--algorithms", default=None, help="'bin-fill' or task=alg1+alg2,... (restricted uniform sample)")
    ap.add_argument("--first-part-share", type=float, default=None, help="share of kernels in part 1 (default: equal parts)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    per_task: dict[str, list[dict]] = {}
    refs = []
    plan = parse_plan(args.plan)
    restricted = parse_algorithms(args.algorithms, list(plan))
    for task, n in plan.items():
        t0 = time.perf_counter()
        if task in restricted:
            per_task[task] = sampler.sample_algorithms(task, n, args.seed, restricted[task])
            refs.append(reference_record(task))
            print(f"{task}: {len(per_task[task])} kernels of {', '.join(restricted[task])}, {time.perf_counter() - t0:.1f} s", flush=True)
            continue
        n_lineage = max(1, int(n * args.lineage_share))
        recs = sampler.generate_lineage(task, n_lineage, args.seed)
        ids = {r["kernel_id"] for r in recs}
        extra = [r for r in sampler.sample_uniform(task, n - n_lineage + 200, args.seed + 1) if r["kernel_id"] not in ids]
        recs += extra[: n - len(recs)]
        per_task[task] = recs
        refs.append(reference_record(task))
        print(f"{task}: {len(recs)} kernels ({n_lineage} lineage), {len({r['algorithm'] for r in recs})} algorithms, {time.perf_counter() - t0:.1f} s", flush=True)
    # Round-robin across tasks in chunks: every prefix of the order (a run cut short by its time
    # budget) covers every task, and consecutive kernels of one task reuse the worker's cached
    # inputs of that task.
    chunks = [[recs[i:i + args.chunk] for i in range(0, len(recs), args.chunk)] for recs in per_task.values()]
    order = [r for group in itertools.zip_longest(*chunks) for chunk in group if chunk for r in chunk]
    cols = list(RECORD_COLUMNS)

    def frame(rows: list[dict]) -> pl.DataFrame:
        df = pl.DataFrame([{c: r.get(c) for c in cols} for r in rows], schema=RECORD_COLUMNS, orient="row")
        return df.with_columns([pl.lit(None, dtype=t).alias(c) for c, t in FEATURE_COLUMNS.items()])

    write_batch(frame(refs + order), args.out / "kernels.parquet")
    size = -(-len(order) // args.parts)
    bounds = [(i * size, (i + 1) * size) for i in range(args.parts)]
    if args.first_part_share and args.parts == 2:
        cut = int(len(order) * args.first_part_share)
        bounds = [(0, cut), (cut, len(order))]
    for i, (lo, hi) in enumerate(bounds):
        part = order[lo:hi]
        write_batch(frame(part), args.out / f"part-{i + 1}.parquet")
        print(f"part-{i + 1}: {len(part)} kernels -> {(args.out / f'part-{i + 1}.parquet').stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
