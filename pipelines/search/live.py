"""Live search on this host's GPU: the same PUCT runs, measured by the profiling worker.

    python3 -m pipelines.search.live --tasks softmax,rms_norm --modes standard,filtered \\
        --seeds 2 --budget 16 --forecaster-file F.pkl --workdir W --out O [--device cuda|cpu]

Every run (task x mode x seed) keeps its event log in W/logs/<run>.jsonl; all runs advance in
lockstep and each round's measurements (every run's requests together, a kernel asked for by
two runs measured once) are one batch (W/worker/batch-NNN.parquet -> results-NNN.parquet),
measured by this GPU's measuring service when one runs (--service), else by a worker run. A run stopped by --deadline-s, a crash or Ctrl-C resumes with the same
command: logs replay, measured kernels are read back, nothing is measured twice.

Outputs in O (a folder):
    live-search.json        per run: the summary of simulate.run_summary (curve of the best
                            measured speedup vs measurements, candidates considered, forecasts,
                            improved share) and its events; per task: each mode's mean final best
    results-live.parquet    every worker result row (RESULT_SCHEMA): ingest like any batch
    kernels-live.parquet    every measured kernel (and trusted parent) with its lineage
                            (KERNEL_BATCH_SCHEMA): the --kernels file of scripts/commit_measurements.py

The forecaster is a pickled object with `predict_kernels` (--forecaster-file), or "uniform"
for a dry run. Imports: the standard library, numpy, pyarrow, torch/triton through the worker
(no polars, duckdb, dagster or mlflow: the GPU host has none).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.forecasting.references import UniformForecaster
from pipelines.search import space
from pipelines.search.config import MODES, SearchConfig
from pipelines.search.driver import SearchRun, drive
from pipelines.search.events import JsonlLog, to_json
from pipelines.search.forecasters import file_forecaster, forecaster_name
from pipelines.search.measure import LiveMeasurer, MeasureError, write_kernel_batch
from pipelines.search.simulate import run_summary


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m pipelines.search.live", description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", required=True, help="comma-separated task names")
    ap.add_argument("--modes", default="standard,filtered", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--budget", type=int, default=16, help="GPU measurements per run (the root aside)")
    ap.add_argument("--batch-size", type=int, default=2, help="parents per step")
    ap.add_argument("--anchor", default="reference", choices=("reference", "parent"))
    ap.add_argument("--forecaster-file", default=None, help="pickled object with predict_kernels")
    ap.add_argument("--forecaster", default=None, choices=("uniform",), help="dry run without a model file")
    ap.add_argument("--hardware-id", default=None, help="recorded in the configs (default: from the GPU)")
    ap.add_argument("--workdir", required=True, help="logs and worker files (keep it to resume)")
    ap.add_argument("--out", required=True, help="folder for live-search.json, results-live.parquet, kernels-live.parquet")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--deadline-s", type=float, default=None, help="start no new round after this many seconds")
    ap.add_argument("--worker-timeout-s", type=float, default=600.0, help="wall limit of one worker run")
    ap.add_argument("--worker-arg", action="append", default=[], help="extra worker flag (repeatable), e.g. --worker-arg=--max-reps=50")
    ap.add_argument("--service", default="auto", choices=("auto", "on", "off"),
                    help="measure through this GPU's measuring service (kernelcast serve-measure): auto = when one "
                         "runs, else one worker run per round; on = the service or stop; off = worker runs")
    ap.add_argument("--queue", default=None, help="the measuring service's queue folder (default: this GPU's)")
    return ap


def _hardware_id(device: str) -> str:
    if device == "cpu":
        return "cpu"
    import torch

    from warehouse.formats import hardware_id

    if not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA device here (use --device cpu for a dry run)")
    return hardware_id(torch.cuda.get_device_name(), torch.cuda.get_device_capability())


def _merge_parquet(paths: list[Path], out: Path) -> int:
    tables = [pq.read_table(p) for p in paths]
    if not tables:
        return 0
    table = pa.concat_tables(tables)
    tmp = out.with_name(out.name + ".partial")
    pq.write_table(table, tmp, compression="zstd")
    tmp.replace(out)
    return table.num_rows


def compare(summaries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task and mode: seeds, mean final best, mean candidates considered, forecasts."""
    out: dict[str, dict[str, Any]] = {}
    for s in summaries:
        m = out.setdefault(s["task"], {}).setdefault(s["mode"], {"seeds": 0, "final_best": [], "considered": [],
                                                                  "forecasts": [], "measurements": []})
        m["seeds"] += 1
        for key, name in (("final_best", "final_best"), ("considered", "candidates_considered"),
                          ("forecasts", "forecasts"), ("measurements", "measurements")):
            if s[name] is not None:
                m[key].append(s[name])
    for modes in out.values():
        for m in modes.values():
            for key in ("final_best", "considered", "forecasts", "measurements"):
                vals = m.pop(key)
                m[f"{key}_mean"] = sum(vals) / len(vals) if vals else None
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        print(f"error: unknown mode {bad[0]!r}; modes: {', '.join(MODES)}", file=sys.stderr)
        return 2
    needs = any(m in ("filtered", "selective") for m in modes)
    forecaster = None
    try:
        if args.forecaster_file:
            forecaster = file_forecaster(args.forecaster_file)
        elif args.forecaster == "uniform":
            forecaster = UniformForecaster()
        elif needs:
            raise ValueError("filtered/selective runs need --forecaster-file PATH (or --forecaster uniform)")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    label = forecaster_name(forecaster, Path(args.forecaster_file).name if args.forecaster_file else "")
    hw = args.hardware_id or _hardware_id(args.device)
    workdir, out = Path(args.workdir), Path(args.out)
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)

    runs, logs = [], []
    try:
        for task in tasks:
            for mode in modes:
                for seed in range(args.seeds):
                    cfg = SearchConfig(task=task, mode=mode, seed=seed, budget=args.budget, batch_size=args.batch_size,
                                       anchor=args.anchor, hardware_id=hw,
                                       forecaster=label if mode in ("filtered", "selective") else "").validate()
                    log = JsonlLog(workdir / "logs" / f"{cfg.run_name()}.jsonl")
                    logs.append(log)
                    runs.append(SearchRun(cfg, log=log, forecaster=forecaster if cfg.forecasts else None))
    except ValueError as exc:
        print(f"error: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    worker_args = list(args.worker_arg)
    if args.device == "cpu" and not any(a.startswith("--max-reps") for a in worker_args):
        worker_args.append("--max-reps=3")
    measurer = LiveMeasurer(workdir / "worker", device=args.device, worker_args=worker_args,
                            timeout_s=args.worker_timeout_s, service=args.service, queue=args.queue)
    t0 = time.monotonic()
    deadline = t0 + args.deadline_s if args.deadline_s is not None else None
    stopped = None

    def on_term(signum, frame):  # SIGTERM (e.g. `timeout`): stop like Ctrl-C, still write the outputs
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)

    def progress(done: int, n: int) -> None:
        print(f"[live search] {done}/{n} runs done, {len(measurer.cache)} kernels measured, "
              f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)

    try:
        rounds = drive(runs, measurer, progress=progress, deadline=deadline)
    except (MeasureError, KeyboardInterrupt) as exc:
        stopped, rounds = f"{type(exc).__name__}: {exc}".splitlines()[0], None
    finally:
        for log in logs:
            log.close()
    summaries = [run_summary(r) for r in runs]
    unfinished = [s for s in summaries if s["finished"] is None]
    n_results = _merge_parquet(measurer.result_files, out / "results-live.parquet")
    records = dict(measurer.records)
    for run in runs:  # trusted (selective) parents are not measured, but their children's lineage needs them
        for node in run.state.archive:
            if node.kernel_id not in records:
                records[node.kernel_id] = space.kernel_record(run.config.task, run.state.kernels[node.kernel_id],
                                                              parent_id=node.parent)
    if records:
        write_kernel_batch(list(records.values()), out / "kernels-live.parquet")
    report = {
        "tasks": tasks, "modes": modes, "seeds": args.seeds, "budget": args.budget, "anchor": args.anchor,
        "forecaster": label, "hardware_id": hw, "wall_s": time.monotonic() - t0,
        "worker_wall_s": measurer.worker_wall_s, "worker_runs": len(measurer.result_files), "rounds": rounds,
        "service_runs": measurer.service_runs,
        "kernels_measured": len(measurer.cache), "result_rows": n_results, "stopped": stopped,
        "unfinished_runs": len(unfinished), "comparison": compare(summaries),
        "runs": [{**s, "events": [to_json(e) for e in r.log.read()]} for s, r in zip(summaries, runs)],
    }
    (out / "live-search.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"{'task':<16} {'mode':<10} {'seeds':>5} {'final best':>11} {'considered':>11} {'forecasts':>10}")
    for task, ms in report["comparison"].items():
        for mode, m in ms.items():
            fb = "-" if m["final_best_mean"] is None else f"{m['final_best_mean']:.3f}"
            print(f"{task:<16} {mode:<10} {m['seeds']:>5} {fb:>11} {m['considered_mean'] or 0:>11.1f} "
                  f"{m['forecasts_mean'] or 0:>10.1f}")
    print(f"{len(measurer.cache)} kernels measured in {len(measurer.result_files)} worker runs "
          f"({measurer.worker_wall_s:.0f} s of {report['wall_s']:.0f} s wall); "
          f"{len(unfinished)} runs unfinished" + (f"; stopped: {stopped}" if stopped else ""))
    return 0 if not stopped else 3


if __name__ == "__main__":
    sys.exit(main())
