"""How fast the registered surrogates forecast fresh kernels: warm batches in process, and one
file through `kernelcast forecast`.

    PYTHONPATH=. .venv/bin/python benchmarks/forecast.py [--home H] [--task softmax] [--count 40]
        [--models champion-external,champion] [--workers 2] [--cli-repeats 3] [--json]

For each model (an alias of models:/kernelcast-surrogate, a models:/ URI, kind:<kind>, ...):
load it once (pipelines.forecasting.sources.SourceForecaster: a pool of reader children, read
sources kept in memory only, so every timed candidate is read), forecast a warm-up batch of at least one
candidate per reader child (the children start, the task's inputs are built, a language model loads), then time a batch of
`--count` fresh candidates of the task against the task's reference: candidates per second,
and how the time splits between reading the sources (import, trace, sm_90 compile) and the
model. Fresh: points of the task's kernel space drawn with `--seed`, none of them in the
warm-up batch; every model gets the same ones. Then `kernelcast forecast` on one fresh file
against the same anchor, `--cli-repeats` times, each a new process (the anchor is read once
and kept in <home>/feature-cache, as for a user who forecasts file after file).

On a GPU host (no mlflow, polars or duckdb), with the files `kernelcast export-forecaster` wrote
of the registered versions (a cost model: numpy and pandas; a code-embed version: its head, the
base model read there from $KERNELCAST_BASE_GGUF, on the GPU in bfloat16):

    python3 benchmarks/forecast.py --forecaster-file COST.pkl --forecaster-file EMBED.pkl \\
        --task softmax --count 160 --workers 14 [--measured-per-s R]

times the same batch through each file, one after the other in one run (the compiles of the
candidates a file does not know by the same reader children, kept up; the code-embed file's
warm-up loads its base model); the registered versions and the command line need the rest of
the stack and are skipped there, saying so. `--measured-per-s` (the rate the worker measured
fresh kernels on that host) adds each file's ratio to it.

Figures come with the host's CPU count and the command; nothing here is a threshold.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HW = "nvidia-h200-sm90"
WARMUP = 4


def fresh_sources(task: str, n: int, seed: int) -> list[str]:
    """n distinct kernel sources of the task's space (valid points, drawn with `seed`)."""
    from pipelines.generation import registry

    points = [p for p in registry.iter_points(task) if registry.is_valid_point(p)]
    random.Random(seed).shuffle(points)
    out, seen = [], set()
    for p in points:
        src = registry.render_point(p)
        if src not in seen:
            seen.add(src)
            out.append(src)
        if len(out) == n:
            break
    if len(out) < n:
        raise SystemExit(f"error: the {task} space has only {len(out)} distinct kernels, asked for {n}")
    return out


def timed_batches(forecast: Any, anchor: str, warmup: list[str], batch: list[str]) -> dict[str, Any]:
    """Warm-up, then the timed batch; `forecast(anchor, sources)` returns (p (n, 8), refused)."""
    t0 = time.perf_counter()
    forecast(anchor, warmup)
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    p, refused = forecast(anchor, batch)
    seconds = time.perf_counter() - t0
    ok = sum(r is None for r in refused)
    return {"warmup_s": round(warm_s, 2), "batch": len(batch), "forecast": ok, "refused": len(batch) - ok,
            "seconds": round(seconds, 2), "per_s": round(len(batch) / seconds, 2),
            "first_refusal": next((r for r in refused if r), None)}


def bench_registered(model: str, home: Path, task: str, anchor: str, warmup: list[str], batch: list[str],
                     workers: int) -> dict[str, Any]:
    from models.registry import SURROGATE_MODEL
    from pipelines.forecasting.load import load_forecaster
    from pipelines.forecasting.sources import SourceForecaster

    ref = model if ":" in model else f"models:/{SURROGATE_MODEL}@{model}"
    uri = f"sqlite:///{(home / 'mlflow.db').resolve()}"
    t0 = time.perf_counter()
    try:
        adapter = load_forecaster(ref, tracking_uri=uri, home=home)
    except ValueError as exc:
        return {"model": ref, "skipped": str(exc)}
    f = SourceForecaster(adapter, n_workers=workers)  # memory cache only: every timed candidate is read
    load_s = time.perf_counter() - t0

    def forecast(a: str, sources: list[str]):
        out = f.forecast(task, a, sources, HW)
        return out.p, out.refused

    try:
        before = dict(f.seconds)
        res = timed_batches(forecast, anchor, warmup, batch)
        read = f.seconds["read"] - before["read"]
        model_s = f.seconds["forecast"] - before["forecast"]
    finally:
        f.close()
    return {"model": ref, "version": getattr(adapter, "version", None), "kind": adapter.kind,
            "load_s": round(load_s, 2), **res,
            "read_and_model_s": [round(read, 2), round(model_s, 2)]}  # both batches together


def bench_file_forecaster(path: Path, task: str, anchor: str, warmup: list[str], batch: list[str],
                          workers: int) -> dict[str, Any]:
    """An exported forecaster file (a cost model or a code-embed version), the compiles of the
    candidates it does not know done by reader children kept up; a file that cannot load or
    forecast here is reported skipped, in one line."""
    from pipelines.forecasting.source_features import (
        FeatureCache,
        feature_pool,
        source_features_many,
    )
    from pipelines.forecasting.sources import source_name
    from pipelines.search.forecasters import load_forecaster_file

    try:
        forecaster = load_forecaster_file(path)
    except ValueError as exc:
        return {"model": f"file:{path}", "skipped": str(exc)}
    pool, cache = feature_pool(workers), FeatureCache()
    spent = {"read": 0.0}

    def compiler(records: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        rows = source_features_many(records, n_workers=n, pool=pool, cache=cache)
        spent["read"] += time.perf_counter() - t0
        return rows

    forecaster.compiler, forecaster.compile_workers = compiler, workers

    def record(src: str) -> dict[str, Any]:
        return {"kernel_id": source_name(src), "task": task, "source": src, "language": "triton"}

    def forecast(a: str, sources: list[str]):
        p = forecaster.predict_kernels({**record(a), "language": "pytorch"}, [record(s) for s in sources], HW)
        return p, [None] * len(sources)

    head = {"model": f"file:{path}", "name": getattr(forecaster, "name", None), "kind": getattr(forecaster, "kind", "?")}
    try:
        res = timed_batches(forecast, anchor, warmup, batch)
    except ValueError as exc:  # e.g. a code-embed file's base model not found here
        return {**head, "skipped": str(exc).splitlines()[0]}
    finally:
        pool.close()
    total = res["warmup_s"] + res["seconds"]
    out = {**head, **res, "read_and_model_s": [round(spent["read"], 2), round(total - spent["read"], 2)]}
    if getattr(forecaster, "seconds", None):  # the code-embed reader's split of its last batch
        out["last_batch"] = dict(forecaster.seconds)
    return out


def bench_cli(home: Path, task: str, anchor: Path, sources: list[str], repeats: int, model: str | None) -> dict:
    """Wall seconds of `kernelcast forecast` on one fresh file, each run a new process."""
    exe = Path(sys.executable).parent / "kernelcast"
    cmd = [str(exe)] if exe.is_file() else [sys.executable, "-m", "orchestration.cli"]
    env = {**os.environ, "KERNELCAST_HOME": str(home), "PYTHONPATH": str(ROOT)}
    times, outputs = [], []
    with tempfile.TemporaryDirectory(prefix="bench-forecast-") as tmp:
        for i in range(repeats):
            cand = Path(tmp) / f"candidate_{i}.py"
            # a comment no run wrote before: the file is read, not answered from the home's
            # feature cache by an earlier run of this benchmark (the same seed, the same kernels)
            cand.write_text(f"{sources[i]}\n# bench_forecast {os.getpid()}-{time.time_ns()}\n")
            args = [*cmd, "forecast", "--task", task, "--anchor", str(anchor), "--candidate", str(cand), "--json",
                    *(["--model", model] if model else [])]
            t0 = time.perf_counter()
            run = subprocess.run(args, capture_output=True, text=True, env=env, cwd=str(ROOT))
            times.append(round(time.perf_counter() - t0, 2))
            if run.returncode not in (0, 1):
                return {"skipped": f"kernelcast forecast failed: {(run.stderr or run.stdout).strip()[-300:]}"}
            outputs.append(json.loads(run.stdout)[0].get("model_ref"))
    return {"model": model or "default (@champion-external, else @champion)", "answered_by": sorted(set(outputs)),
            "wall_s": times, "median_s": statistics.median(times)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, default=Path(os.environ.get("KERNELCAST_HOME", ".kernelcast")))
    parser.add_argument("--task", default="softmax")
    parser.add_argument("--count", type=int, default=40, help="fresh candidates in the timed batch")
    parser.add_argument("--seed", type=int, default=20261207)
    parser.add_argument("--models", default="champion-external,champion")
    parser.add_argument("--workers", type=int, default=2, help="reader children (one a core is what a compile wants)")
    parser.add_argument("--cli-repeats", type=int, default=3, help="0: no `kernelcast forecast` timing")
    parser.add_argument("--cli-model", default=None, help="--model for the command (default: its own default)")
    parser.add_argument("--forecaster-file", type=Path, action="append", default=[],
                        help="a file of kernelcast export-forecaster (a cost model or a code-embed version): the "
                             "GPU host's way; repeat it to time several in one run")
    parser.add_argument("--measured-per-s", type=float, default=None,
                        help="fresh kernels the worker measured a second on this host (for the ratio)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from pipelines.generation.reference import reference_source

    anchor = reference_source(args.task)
    # one warm-up candidate per reader child at least: a child's first job imports torch and builds
    # the task's inputs, which a warm forecaster has done already
    n_warm = max(WARMUP, args.workers)
    sources = fresh_sources(args.task, n_warm + args.count + max(0, args.cli_repeats), args.seed)
    warmup, batch, cli = sources[:n_warm], sources[n_warm:n_warm + args.count], sources[n_warm + args.count:]
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "host": platform.node(), "cpus": os.cpu_count(),
                              "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
                              "task": args.task, "workers": args.workers, "models": [], "skipped": []}
    stack = all(_importable(m) for m in ("mlflow", "polars", "duckdb"))
    for path in args.forecaster_file:
        report["models"].append(bench_file_forecaster(path, args.task, anchor, warmup, batch, args.workers))
    if stack:
        for model in [m for m in args.models.split(",") if m]:
            report["models"].append(bench_registered(model, args.home, args.task, anchor, warmup, batch, args.workers))
    else:
        report["skipped"].append(f"registered models ({args.models}): this host lacks mlflow, polars or duckdb; "
                                 "pass --forecaster-file (kernelcast export-forecaster) for each")
    if stack and args.cli_repeats > 0:
        with tempfile.TemporaryDirectory(prefix="bench-anchor-") as tmp:
            path = Path(tmp) / f"{args.task}_reference.py"
            path.write_text(anchor)
            report["cli"] = bench_cli(args.home, args.task, path, cli, args.cli_repeats, args.cli_model)
    elif args.cli_repeats > 0:
        report["skipped"].append("kernelcast forecast: not installed on this host")
    for m in report["models"]:
        if args.measured_per_s and "per_s" in m:
            m["vs_measured"] = round(m["per_s"] / args.measured_per_s, 1)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{report['date']} {report['host']} ({report['cpus']} CPUs), task {args.task}, "
          f"{args.workers} reader children: {report['command']}")
    for m in report["models"]:
        if "skipped" in m:
            print(f"  {m['model']}: skipped: {m['skipped']}")
            continue
        split = f", read/model {m['read_and_model_s'][0]}/{m['read_and_model_s'][1]} s" if "read_and_model_s" in m else ""
        print(f"  {m['model']}{' ' + m['name'] if m.get('name') else ''} ({m['kind']}{', version ' + str(m['version']) if m.get('version') else ''}): "
              f"{m['per_s']} candidates/s warm ({m['forecast']} forecast, {m['refused']} refused, {m['batch']} in "
              f"{m['seconds']} s; warm-up {m['warmup_s']} s{', load ' + str(m['load_s']) + ' s' if 'load_s' in m else ''}"
              f"{split})" + (f", {m['vs_measured']}x the measured rate" if "vs_measured" in m else ""))
    if "cli" in report:
        c = report["cli"]
        print("  kernelcast forecast, one fresh file: " + (f"skipped: {c['skipped']}" if "skipped" in c else
              f"{c['median_s']} s median of {c['wall_s']} ({', '.join(c['answered_by'])})"))
    for s in report["skipped"]:
        print(f"  skipped: {s}")
    return 0


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
