"""Autotune one task's kernel with and without a forecaster pruning the configs.

    python3 -m benchmarks.autotune_demo --task softmax --forecaster-file F.pkl [--forecaster-file G.pkl]
        [--uniform] [--top-k 0.25] [--case 0] [--device cuda|cpu] --out autotune.json

The kernel is a family of the task's space (softmax: online_two_pass) with its algorithm
choices fixed; each @triton.autotune config is one point of it (BLOCK_N, num_warps,
num_stages). First every forecaster prunes (`autotune.surrogate_pruning`: only its top_k
configs are benchmarked), then the exhaustive autotuner benchmarks every config; each phase
gets a fresh Triton cache and a fresh copy of the kernel, so no phase reuses another's compiles.
Reported per phase: configs benchmarked, the best config and its time, wall time of the
autotuning call (compiles, forecasts and benchmarks), and for pruned phases the exhaustive
time of the config they chose against the exhaustive best (the within-5% goal, on one table of
timings). The tuned kernel's output is checked against the task reference.

--device cpu runs Triton's interpreter on the task's small correctness case with a wall-clock
benchmark (tests and dry runs): the timings mean nothing there.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.forecasting.references import UniformForecaster
from pipelines.generation import registry
from pipelines.generation.registry import KernelPoint
from pipelines.search.autotune import LAUNCH_KNOBS, surrogate_pruning
from pipelines.search.forecasters import file_forecaster, forecaster_name


@dataclass(frozen=True)
class Tunable:
    """How one family's kernel is autotuned: its jit function and how to launch it."""

    algorithm: str
    kernel: str  # name of the @triton.jit function in the rendered module
    fixed: dict[str, Any]  # the family's non-config knobs
    grid: dict[str, tuple]  # UPPER_CASE knob -> values tried (a subset of the family's domain)
    launch: Callable[[Any, Any], Any]  # (autotuned kernel, task input) -> output


def _softmax_launch(kernel, data):
    import torch

    (x,) = data
    M, N = x.shape
    y = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
    kernel[(M,)](x, y, M, N, x.stride(0), y.stride(0))
    return y


TUNABLES: dict[str, Tunable] = {
    "softmax": Tunable(
        algorithm="online_two_pass", kernel="softmax_kernel",
        fixed={"eviction": "none", "online_state": "vector"},
        grid={"BLOCK_N": (256, 512, 1024, 2048, 4096), "NUM_WARPS": (1, 2, 4, 8), "NUM_STAGES": (1, 2)},
        launch=_softmax_launch,
    ),
}


def configs_for(task: str, tunable: Tunable, grid: dict[str, tuple] | None = None) -> list:
    """triton.Config for every valid point of the family on the grid (fixed knobs held)."""
    import itertools

    import triton

    grid = grid or tunable.grid
    fam = registry.family(task, tunable.algorithm)
    names = list(grid)
    out = []
    for combo in itertools.product(*(grid[n] for n in names)):
        knobs = {**tunable.fixed, **dict(zip(names, combo))}
        point = KernelPoint(task, tunable.algorithm, {k.name: knobs.get(k.name) for k in fam.knobs})
        if not registry.is_valid_point(point):
            continue
        kwargs = {n: v for n, v in zip(names, combo) if n not in LAUNCH_KNOBS}
        launch = {LAUNCH_KNOBS[n]: v for n, v in zip(names, combo) if n in LAUNCH_KNOBS}
        out.append(triton.Config(kwargs, **launch))
    return out


def _fresh_kernel(task: str, tunable: Tunable, tag: str):
    """The family's jit kernel from a newly imported copy of its rendered module."""
    fam = registry.family(task, tunable.algorithm)
    values = {k.name: tunable.fixed.get(k.name, tunable.grid.get(k.name, k.values)[0]) for k in fam.knobs}
    source = registry.render_point(KernelPoint(task, tunable.algorithm, values))
    folder = Path(tempfile.mkdtemp(prefix=f"kernelcast-autotune-{tag}-"))
    path = folder / f"tuned_{tag}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"kernelcast_tuned_{tag}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, tunable.kernel)


def _cpu_bench(fn, quantiles=None):
    t0 = time.perf_counter()
    fn()
    ms = (time.perf_counter() - t0) * 1e3
    return [ms, ms, ms] if quantiles else ms


def _key(config) -> str:
    return json.dumps(config.all_kwargs(), sort_keys=True, default=str)


def run_phase(task_obj, tunable: Tunable, configs: list, data, prune: dict | None, tag: str, device: str) -> dict:
    """One autotuning call on a fresh kernel and cache; its timings, choice and wall time."""
    import torch
    import triton

    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"kernelcast-triton-{tag}-")
    kernel = _fresh_kernel(task_obj.name, tunable, tag)
    extra = {"do_bench": _cpu_bench} if device == "cpu" else {}
    tuned = triton.autotune(configs, key=["M", "N"], prune_configs_by=prune, **extra)(kernel)
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = tunable.launch(tuned, data)
    if device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    ok, msg = task_obj.check_implementation(data, out)
    timings = {_key(c): (t[0] if isinstance(t, list | tuple) else float(t)) for c, t in tuned.configs_timings.items()}
    best = _key(tuned.best_config)
    model = prune["perf_model"] if prune else None
    return {"configs": len(configs), "benchmarked": len(timings), "best_config": best, "best_ms": timings[best],
            "wall_s": wall, "bench_s": getattr(tuned, "bench_time", None), "correct": bool(ok), "check": msg,
            "forecast_rows": model.forecast_rows if model else 0, "timings_ms": timings}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.autotune_demo", description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="softmax", choices=sorted(TUNABLES))
    ap.add_argument("--forecaster-file", action="append", default=[], help="pickled forecaster (repeatable)")
    ap.add_argument("--uniform", action="store_true", help="also prune with the uniform forecaster (ties: config order)")
    ap.add_argument("--top-k", type=float, default=0.25, help="share of configs (<= 1) or a count (> 1)")
    ap.add_argument("--case", type=int, default=0, help="benchmark case index (correctness case on cpu)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--hardware-id", default="nvidia-h200-sm90")
    ap.add_argument("--grid", default=None, help="KNOB=v1+v2;KNOB2=... instead of the default grid")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
    from pipelines.tasks import get_task

    task_obj = get_task(args.task)
    tunable = TUNABLES[args.task]
    grid = None
    if args.grid:
        grid = {k: tuple(int(v) for v in vals.split("+")) for k, _, vals in
                (item.partition("=") for item in args.grid.split(";") if item)}
    configs = configs_for(args.task, tunable, grid)
    cases = task_obj.correctness_cases if args.device == "cpu" else task_obj.benchmark_cases
    case = cases[args.case]
    data = task_obj.generate_input(**case)
    # a share rounds down, as Triton's own float top_k does: "a quarter" never benchmarks more
    top_k = int(args.top_k) if args.top_k > 1 else max(1, int(args.top_k * len(configs)))
    forecasters = []
    try:
        forecasters += [(forecaster_name(file_forecaster(f), Path(f).name), file_forecaster(f))
                        for f in args.forecaster_file]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.uniform or not forecasters:
        forecasters.append(("uniform", UniformForecaster()))

    phases: dict[str, dict] = {}
    for i, (name, fc) in enumerate(forecasters):
        prune = surrogate_pruning(fc, args.task, tunable.algorithm, configs, top_k, tunable.fixed, args.hardware_id)
        phases[f"pruned:{name}"] = run_phase(task_obj, tunable, configs, data, prune, f"p{i}", args.device)
    exhaustive = run_phase(task_obj, tunable, configs, data, None, "full", args.device)
    phases["exhaustive"] = exhaustive
    for name, ph in phases.items():
        if name != "exhaustive":
            chosen = exhaustive["timings_ms"].get(ph["best_config"])
            ph["chosen_ms_in_exhaustive"] = chosen
            ph["slowdown_vs_exhaustive_best"] = chosen / exhaustive["best_ms"] if chosen else None
            ph["within_5pct"] = bool(chosen and chosen <= 1.05 * exhaustive["best_ms"])
            ph["share_benchmarked"] = ph["benchmarked"] / len(configs)
    report = {"task": args.task, "algorithm": tunable.algorithm, "fixed": tunable.fixed, "case": case,
              "device": args.device, "configs": len(configs), "top_k": top_k, "phases": phases}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print(f"autotune {args.task}/{tunable.algorithm}, case {case}: {len(configs)} configs, top_k {top_k}")
    print(f"{'phase':<34} {'benched':>7} {'best ms':>9} {'chosen/exh best':>15} {'wall s':>7} {'correct':>7}")
    for name, ph in phases.items():
        ratio = ph.get("slowdown_vs_exhaustive_best")
        print(f"{name:<34} {ph['benchmarked']:>7} {ph['best_ms']:>9.4f} {'-' if ratio is None else f'{ratio:.3f}':>15} "
              f"{ph['wall_s']:>7.1f} {str(ph['correct']):>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
