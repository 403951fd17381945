"""Which CPU reading of the base model reproduces the GPU host's: float32 or bfloat16 weights.

    PYTHONPATH=. .venv/bin/python benchmarks/embed_precision.py --home H [--per-task 2] [--json]

The code-embed head (pipelines.forecasting.embed) was fitted on what SmolLM2 read on an H200,
its weights in bfloat16 under bf16 autocast (models.training.gpu_host.llm_code). For pairs of
the committed run (settings `surrogate.committed_run`, variant code-embed, eval role) whose
kernels the warehouse of `--home` holds, this rebuilds each prompt with the forecaster's own
builder, reads it on this CPU twice (the base model in float32, then in bfloat16, the
forecaster's CPU path: embed_prompts_shared), and compares the head's raw forecasts with the
committed ones, which the host computed from its own coordinates on the same axes and trees:
max |delta p|, same argmax, and the point forecast log2 S (the committed one recovered from its
Laplace bins). The principal coordinates of the two CPU readings are compared with each other,
relative to their spread over the pairs read (the host's coordinates of these pairs are not
committed: embeddings.parquet of the committed heads is another dataset version's, without
axes).

Nothing is written to the home; the warehouse is opened read-only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANT = "code-embed"


def committed_pairs(run_dir: Path, known: set[str], per_task: int, seed: int) -> Any:
    """`per_task` eval pairs a task of the committed run whose kernels are `known`, with their
    committed forecasts (p1..p8), drawn with `seed`."""
    import polars as pl

    rows = (pl.read_parquet(run_dir / "forecasts.parquet")
            .filter((pl.col("variant") == VARIANT) & (pl.col("role") == "eval")
                    & pl.col("anchor_kernel_id").is_in(list(known)) & pl.col("candidate_kernel_id").is_in(list(known))))
    rng = random.Random(seed)
    chosen = []
    for task in sorted(set(rows["task"].to_list())):
        ids = sorted(rows.filter(pl.col("task") == task)["pair_id"].to_list())
        chosen += rng.sample(ids, min(per_task, len(ids)))
    return rows.filter(pl.col("pair_id").is_in(chosen)).sort("task", "pair_id")


def log2_of(p: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The point forecast (log2 S) whose Laplace bins are `p`, to 1e-4 (a grid, then a finer one)."""
    from models.classical.spread import laplace_bins

    out = np.zeros(len(p))
    for i, (row, s) in enumerate(zip(p, scales, strict=True)):
        lo, hi, step = -8.0, 8.0, 0.01
        for _ in range(3):
            grid = np.arange(lo, hi + step / 2, step)
            q = laplace_bins(grid, np.full(len(grid), s))
            q /= q.sum(axis=1, keepdims=True)
            best = float(grid[np.abs(q - row).sum(axis=1).argmin()])
            lo, hi, step = best - step, best + step, step / 10
        out[i] = best
    return out


def read_with(forecaster: Any, dtype: str, pairs: Any, kernels: dict) -> dict[str, Any]:
    """The forecaster's CPU reading with the base model's weights in `dtype`: coordinates,
    zero-shot logits, raw forecasts, point forecasts, seconds."""
    from models.backends.transformers_backend import load_model_and_tokenizer
    from models.base_model import resolve_base_model

    model, tokenizer = load_model_and_tokenizer(resolve_base_model(forecaster.spec["base_model"], forecaster.home),
                                                "cpu", dtype)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    forecaster._base = (model, tokenizer)
    t0 = time.perf_counter()
    pc, zero_shot = forecaster.reading(pairs.to_dicts(), kernels)
    seconds = time.perf_counter() - t0
    x = forecaster.design(pairs, kernels)
    tasks = pairs["task"].to_list()
    return {"pc": pc, "zero_shot": zero_shot, "p": forecaster.head.predict_proba(x, tasks),
            "log2": forecaster.head.predict_log2(x), "seconds": seconds, "tokens_read": forecaster.seconds["tokens_read"],
            "dtype_loaded": str(next(model.parameters()).dtype)}


def compare(p: np.ndarray, want: np.ndarray, log2: np.ndarray, want_log2: np.ndarray) -> dict[str, Any]:
    gap = np.abs(p - want).max(axis=1)
    return {"max_abs_dp": round(float(gap.max()), 4), "mean_max_abs_dp": round(float(gap.mean()), 4),
            "same_argmax": int((p.argmax(1) == want.argmax(1)).sum()),
            "max_abs_dlog2": round(float(np.abs(log2 - want_log2).max()), 4),
            "mean_abs_dlog2": round(float(np.abs(log2 - want_log2).mean()), 4),
            "pairs_within_1e-3": int((gap < 1e-3).sum())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="a kernelcast home whose warehouse holds the kernels")
    parser.add_argument("--per-task", type=int, default=2, help="eval pairs of each task")
    parser.add_argument("--seed", type=int, default=20261207)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    import duckdb
    import torch

    from models.training.embed_head import load_embed_head
    from orchestration.settings import load_settings
    from pipelines.forecasting.embed import EmbedHeadForecaster
    from pipelines.surrogates.classical import kernel_records
    from pipelines.surrogates.code_embed import embed_head_file
    from pipelines.surrogates.remote_results import HEADS_DIR

    torch.set_num_threads(args.threads)
    warehouse = args.home / "warehouse.duckdb"
    if not warehouse.is_file():
        raise SystemExit(f"error: {args.home} holds no warehouse.duckdb")
    settings = load_settings()
    run_dir = settings.data_dir / settings.surrogate.committed_run
    head, axes, spec = load_embed_head(run_dir / HEADS_DIR / embed_head_file(VARIANT))
    with duckdb.connect(str(warehouse), read_only=True) as con:
        known = {r[0] for r in con.sql("select kernel_id from kernels").fetchall()}
        rows = committed_pairs(run_dir, known, args.per_task, args.seed)
        if rows.height == 0:
            raise SystemExit(f"error: no eval pair of {run_dir} has both kernels in {warehouse}")
        kernels = kernel_records(con, set(rows["anchor_kernel_id"].to_list()) | set(rows["candidate_kernel_id"].to_list()))
    pairs = rows.select("pair_id", "task", "hardware_id", "anchor_kernel_id", "candidate_kernel_id")
    want = rows.select([f"p{i}" for i in range(1, 9)]).to_numpy()
    scales = np.array([head.task_scales.get(t, head.pooled_scale) for t in pairs["task"].to_list()])
    want_log2 = log2_of(want, scales)
    forecaster = EmbedHeadForecaster(head, axes, spec, "embed-precision", home=args.home, device="cpu")
    readings = {dtype: read_with(forecaster, dtype, pairs, kernels) for dtype in ("float32", "bfloat16")}
    f32, b16 = readings["float32"], readings["bfloat16"]
    spread = f32["pc"].std(axis=0)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "host": platform.node(), "cpus": os.cpu_count(), "threads": args.threads,
        "committed_run": settings.surrogate.committed_run, "variant": VARIANT, "pairs": pairs.height,
        "tasks": sorted(set(pairs["task"].to_list())), "tokens_read": f32["tokens_read"],
        "components": int(spec["components"]), "parts": spec["parts"],
        "vs_gpu": {d: {**compare(r["p"], want, r["log2"], want_log2), "read_s": round(r["seconds"], 1),
                       "loaded": r["dtype_loaded"]} for d, r in readings.items()},
        "bf16_vs_fp32": {**compare(b16["p"], f32["p"], b16["log2"], f32["log2"]),
                         "pc_spread": [round(float(s), 3) for s in spread],
                         "pc_max_abs_diff_rel_spread": [round(float(v), 4) for v in
                                                        np.abs(b16["pc"] - f32["pc"]).max(axis=0) / spread],
                         "pc_mean_abs_diff_rel_spread": [round(float(v), 4) for v in
                                                         np.abs(b16["pc"] - f32["pc"]).mean(axis=0) / spread],
                         "zero_shot_max_abs_diff": round(float(np.abs(b16["zero_shot"] - f32["zero_shot"]).max()), 4)},
        "per_pair": [{"pair_id": pid, "task": t, "gpu_log2": round(float(g), 4),
                      "fp32_log2": round(float(a), 4), "bf16_log2": round(float(b), 4)}
                     for pid, t, g, a, b in zip(pairs["pair_id"], pairs["task"], want_log2, f32["log2"], b16["log2"],
                                                strict=True)],
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{report['date']} {report['host']} ({report['cpus']} CPUs, {args.threads} threads): {pairs.height} eval "
          f"pairs of {report['committed_run']} ({len(report['tasks'])} tasks), {int(report['tokens_read'])} tokens read")
    for d, r in report["vs_gpu"].items():
        print(f"  {d} vs the GPU's forecasts: max |dp| {r['max_abs_dp']} (mean of per-pair max {r['mean_max_abs_dp']}), "
              f"same argmax {r['same_argmax']}/{pairs.height}, |d log2 S| max {r['max_abs_dlog2']} mean "
              f"{r['mean_abs_dlog2']}; read in {r['read_s']} s")
    c = report["bf16_vs_fp32"]
    print(f"  bf16 vs fp32: max |dp| {c['max_abs_dp']}, same argmax {c['same_argmax']}/{pairs.height}, coordinates' "
          f"max |diff| / spread {c['pc_max_abs_diff_rel_spread']}, mean {c['pc_mean_abs_diff_rel_spread']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
