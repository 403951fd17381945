"""`kernelcast measure`: this host's unmeasured kernels through the Dagster fan-out, one step per GPU.

    kernelcast measure --batch B.parquet [--gpus N] [--limit K] [--out DIR] [--json]

The kernels of the batch files are added to the warehouse, then `measurement_ingest_job` runs
for the partition of this host's GPU on the multiprocess executor: `plan_measurements` splits the
unmeasured kernels into N shards, N `measure_shard` steps run the profiling worker side by side
(CUDA_VISIBLE_DEVICES=i each), `ingest_measurements` merges their results through the ingest.
The run lands on the instance under $KERNELCAST_HOME/dagster like every other (`kernelcast ui`).
While a measuring service runs on a GPU (`kernelcast serve-measure`), that GPU's step hands its
shard to the service instead of starting a worker (pipelines/profiling/launch.py).

    kernelcast serve-measure [--device cuda|cpu] [--queue Q] [--protocol P] [--status | --stop]

runs that service (pipelines/profiling/service.py) in the foreground until SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import typer


def measure(
    batch: list[Path] = typer.Option([], "--batch", help="Kernel batch Parquet files (or folders) to add first."),
    gpus: int | None = typer.Option(None, "--gpus", min=1, help="Measuring steps (default: every CUDA device)."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Measure at most this many kernels."),
    out: Path | None = typer.Option(None, "--out", help="Copy the shards' result files and summary.json here."),
    profile: str | None = typer.Option(None, "--profile", help="smoke | default | gpu."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Measure this host's unmeasured kernels: one Dagster step per GPU, merged by the ingest."""
    import dagster as dg

    from orchestration.cli_common import ensure_tasks
    from orchestration.definitions import build_defs
    from orchestration.partitions import HARDWARE_PARTITIONS
    from orchestration.run_display import output_to
    from orchestration.runner import execute_code_location_job, prepare_home
    from orchestration.settings import load_settings
    from pipelines.profiling.hardware import gpu_count, host_hardware_id
    from warehouse.db import connect
    from warehouse.ingest import ingest_path

    missing = [str(path) for path in batch if not path.exists()]
    if missing:  # before anything is created or written
        raise FileNotFoundError(f"{', '.join(missing)}: no such file or folder")
    if gpus is not None:
        os.environ["KERNELCAST_GPUS"] = str(gpus)  # the step processes read the same count
    if limit is not None:
        os.environ["KERNELCAST_MAX_KERNELS"] = str(limit)  # the plan step runs in a process of its own
    settings = load_settings(profile)
    hardware = host_hardware_id(settings.profiling.measure_device)
    if hardware is None:
        raise ValueError("no CUDA GPU on this host (KERNELCAST_MEASURE_DEVICE=cpu measures in Triton's interpreter)")
    prepare_home(settings)
    with connect(settings.warehouse_path) as con:
        ensure_tasks(con)  # the measurement checks compare each row with its task's cases
        for path in batch:
            ingest_path(con, path)
    instance = dg.DagsterInstance.get()
    if hardware not in instance.get_dynamic_partitions(HARDWARE_PARTITIONS.name):
        instance.add_dynamic_partitions(HARDWARE_PARTITIONS.name, [hardware])
    n = gpu_count(settings.profiling.gpus, settings.profiling.measure_device)
    log_path = settings.home / "logs" / f"measure-{time.strftime('%Y%m%d-%H%M%S')}.log"
    # Always the multiprocess executor (at least 2 processes, so also with one GPU): the path a
    # host of N GPUs takes, each measuring step in its own process. Dagster's and the worker's
    # own output go to the log file.
    with open(log_path, "a", buffering=1) as logfile, output_to(logfile):
        summary = execute_code_location_job(build_defs(settings), instance, "measurement_ingest_job", hardware,
                                            processes=max(2, n), tags={"kernelcast/launched_by": "kernelcast measure"})
    report = {**_report(instance, summary, settings.home / "measured" / summary.run_id[:8], n), "log": str(log_path)}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for shard in report["shards"]:
            shutil.copy(shard["results"], out / Path(shard["results"]).name)
        (out / "summary.json").write_text(json.dumps(report, indent=1, default=str))
    if as_json:
        typer.echo(json.dumps(report, indent=2, default=str))
    else:
        typer.echo(f"{hardware}: {report['measuring_steps']} measuring step(s) of {n} GPU(s), "
                   f"{report['rows_added']} rows added in {report['seconds']:.0f} s (run {summary.run_id[:8]})")
        typer.echo(f"{'GPU':>3} {'pid':>8} {'kernels':>8} {'ok':>5} {'failed':>6} {'seconds':>8}")
        for s in report["shards"]:
            typer.echo(f"{s['gpu']:>3} {s['pid']!s:>8} {s['kernels']:>8} {s['ok']:>5} {s['failed']:>6} {s['seconds']!s:>8}")
    if not summary.success:
        raise RuntimeError(f"{summary.error} (log: {log_path}; run {summary.run_id[:8]} in `kernelcast ui`)")


def _report(instance, summary, folder: Path, n_gpus: int) -> dict:
    """The run in numbers: per shard its process, kernels, outcomes and wall time."""
    import pyarrow.parquet as pq

    starts, ends = {}, {}
    for entry in instance.all_logs(summary.run_id):
        key = entry.step_key or ""
        if "measure_shard[" in key:
            gpu = int(key.split("[gpu_")[1].rstrip("]"))
            if entry.dagster_event_type and entry.dagster_event_type.value == "STEP_START":
                starts[gpu] = (entry.dagster_event.pid, entry.timestamp)
            elif entry.dagster_event_type and entry.dagster_event_type.value == "STEP_SUCCESS":
                ends[gpu] = entry.timestamp
    shards = []
    for gpu, (pid, t0) in sorted(starts.items()):
        results = folder / f"results-gpu{gpu}.parquet"
        status = pq.read_table(results, columns=["status"])["status"].to_pylist() if results.exists() else []
        kernels = pq.ParquetFile(folder / f"batch-gpu{gpu}.parquet").metadata.num_rows
        shards.append({"gpu": gpu, "pid": pid, "kernels": kernels, "ok": status.count("ok"),
                       "failed": len(status) - status.count("ok"), "results": str(results),
                       "seconds": round(ends[gpu] - t0, 1) if gpu in ends else None})
    meta = summary.metadata.get("kernel_measurements", {})
    return {"run_id": summary.run_id, "partition": summary.partition, "success": summary.success,
            "gpus": n_gpus, "measuring_steps": len(shards), "rows_added": meta.get("rows_added", 0),
            "profiled_here": meta.get("profiled_here", 0), "seconds": round(summary.seconds, 1),
            "checks_failed": summary.checks_failed, "shards": shards}


def serve_measure(
    device: str = typer.Option("cuda", "--device", help="cuda, or cpu (Triton's interpreter: tests and CPU hosts)."),
    queue: Path | None = typer.Option(None, "--queue", help="The queue folder (default: $KERNELCAST_MEASURE_QUEUE or "
                                                             "~/.cache/kernelcast/measure/cuda-N), created 0700."),
    protocol: str = typer.Option("kernelcast", "--protocol", help="kernelcast | paper | gpumode."),
    compile_workers: int | None = typer.Option(None, "--compile-workers", min=1, help="Compile children (default: cores - 2)."),
    timeout_s: float = typer.Option(120.0, "--timeout-s", help="Per compile job / per measuring step."),
    max_reps: int | None = typer.Option(None, "--max-reps", min=1, help="Cap on timed calls per case."),
    ref_refresh_s: float = typer.Option(60.0, "--ref-refresh-s", help="Re-time a task's reference after this long."),
    ref_cache: str | None = typer.Option(None, "--ref-cache", help="Reference timings across runs (a file, or off)."),
    stop_grace_s: float = typer.Option(10.0, "--stop-grace-s", help="How long a kernel being measured may finish after a stop."),
    log_dir: str | None = typer.Option(None, "--log-dir", help="Keep the children's logs here."),
    status: bool = typer.Option(False, "--status", help="Print the running service's status JSON and exit."),
    stop: bool = typer.Option(False, "--stop", help="Ask the running service to stop and wait for it."),
) -> None:
    """Run the warm measuring service of this GPU until SIGTERM, Ctrl-C or `--stop`.

    It pays start-up and reference timing once and then measures every kernel dropped into its
    queue, with the profiling worker's sandbox and harness; `kernelcast measure`, the live search
    and `python3 -m pipelines.search.live` use it while it runs (else a one-shot worker).
    """
    from pipelines.profiling import service
    from pipelines.profiling.worker_config import WorkerConfig

    if device not in ("cuda", "cpu"):
        raise ValueError(f"--device must be cuda or cpu, got {device!r}")
    if status:
        typer.echo(json.dumps(service.status(queue, device), indent=1))
        return
    if stop:
        if not service.stop(queue, device):
            raise RuntimeError("the measuring service is still running after 60 s")
        typer.echo("stopped")
        return
    d = WorkerConfig()
    cfg = WorkerConfig(device=device, protocol=protocol, compile_workers=compile_workers or d.compile_workers,
                       timeout_s=timeout_s, max_reps=max_reps, ref_refresh_s=ref_refresh_s, ref_cache=ref_cache,
                       log_dir=log_dir)
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    result = service.serve(queue, cfg, stop_grace_s)
    typer.echo(f"measuring service stopped ({result['stopped']}): {result['measured']} kernels measured", err=True)
