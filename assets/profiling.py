"""kernel_measurements: measured kernels per hardware (dynamic partitions), in DuckDB `measurements`.

A graph of three steps, so measuring fans out over the GPUs of a host through Dagster:

    plan_measurements            reads the kernels not yet measured on this hardware (where the
        |  one output per step   profiler measures it) and splits them, one shard per GPU
    measure_shard[gpu_i]         the profiler on shard i: the GPU worker pinned to GPU i
        |  collect               (CUDA_VISIBLE_DEVICES=i), side by side on the multiprocess executor
    ingest_measurements          the shipped data/ files, the inbox and every shard's results go
                                 through the same idempotent ingest

How a shard is measured is the `profiler` resource's kind (orchestration.resources.ProfilerResource):
`cuda` (the worker on this host's GPUs, the default), `recorded` (results already measured, from
a folder) or `batch_file` (the batch written for an outside job runner; its results come back
through the inbox sensor).

Only the first and last steps touch DuckDB (pool `duckdb_writer`); the measuring steps hold no
connection, so N of them run at once. Under Kubernetes (orchestration/k8s.py) each
measure_shard step is a pod that requests one GPU.
"""


import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg

from assets._checks import offending_ids_result
from assets._metadata import markdown_table
from orchestration.partitions import HARDWARE_PARTITIONS, hardware_of_file, result_files
from orchestration.resources import ProfilerResource, SettingsResource, WarehouseResource

GROUP = "profiling"
SPEEDUP_REQUIRES_CORRECTNESS = "speedup_requires_correctness"
SPEEDUPS_FINITE_POSITIVE = "speedups_finite_positive"
ONE_FINGERPRINT_PER_BATCH = "one_fingerprint_per_batch"
# One GPU per measuring step when the k8s executor runs it (ignored by the other executors).
GPU_STEP_TAGS = {"dagster-k8s/config": {"container_config": {"resources": {
    "requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}}}


def _partition_files(files: list[Path], hardware: str) -> tuple[list[Path], list[Path]]:
    """Kernel files (any hardware) and the result files of this hardware, in a stable order."""
    kernels, results = [], []
    for f in files:
        hw = hardware_of_file(f)
        if hw is None:
            kernels.append(f)
        elif hw == hardware:
            results.append(f)
    return kernels, results


@contextlib.contextmanager
def pinned_gpu(index: int | None) -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES=index for child processes started inside the block (None: as is).

    Restored afterwards, so steps sharing a process (in-process executor) do not leak it."""
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    if index is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


@dg.op(ins={"after": dg.In(dg.Nothing)}, out=dg.DynamicOut(dict), pool="duckdb_writer")
def plan_measurements(context: dg.OpExecutionContext, settings: SettingsResource, warehouse: WarehouseResource,
                      profiler: ProfilerResource):
    """Unmeasured candidates of this hardware, one shard per measuring step of the profiler (none
    where it measures nothing here)."""
    from pipelines.sharding import split_batch
    from warehouse.queue import unmeasured_kernels

    cfg = settings.get()
    hardware = context.partition_key
    try:
        steps = profiler.steps(cfg.profiling, hardware)
    except ValueError as exc:
        raise dg.Failure(str(exc)) from None
    if not steps:
        context.log.info(f"this host does not measure {hardware}: ingest only")
        return
    with warehouse.connect(read_only=True) as con:
        todo = unmeasured_kernels(con, hardware, cfg.profiling.max_kernels)
    if todo.is_empty():
        context.log.info(f"every candidate is measured on {hardware}")
        return
    shards = split_batch(todo, steps)
    folder = cfg.home / "measured" / context.run.run_id[:8]
    folder.mkdir(parents=True, exist_ok=True)
    for i, shard in enumerate(shards):
        batch = folder / f"batch-gpu{i}.parquet"
        shard.write_parquet(batch, compression="zstd")
        target = f"GPU {i}" if profiler.kind == "cuda" else f"the {profiler.kind} profiler"
        context.log.info(f"shard {i}: {shard.height} kernels -> {target}")
        yield dg.DynamicOutput({"gpu": i, "batch": str(batch), "kernels": shard.height,
                                "workers": max(1, cfg.profiling.compile_workers // len(shards))},
                               mapping_key=f"gpu_{i}")


@dg.op(tags=GPU_STEP_TAGS)
def measure_shard(context: dg.OpExecutionContext, settings: SettingsResource, profiler: ProfilerResource,
                  shard: dict) -> dict:
    """One shard measured by the profiler (on its own GPU for the cuda kind); returns where its
    results are (absent when nothing was measured here)."""
    cfg = settings.get()
    hardware = context.partition_key
    batch = Path(shard["batch"])
    out = batch.with_name(batch.name.replace("batch-", "results-"))
    gpu = profiler.pinned_gpu(shard["gpu"])
    t0 = time.perf_counter()
    with pinned_gpu(gpu):
        try:
            rc, note = profiler.measure(batch, out, hardware, cfg.home, cfg.profiling, shard["workers"])
        except FileNotFoundError as exc:
            raise dg.Failure(f"{profiler.kind} profiler: {exc}") from None
    seconds = time.perf_counter() - t0
    context.log.info(f"step {shard['gpu']} ({profiler.kind}): {note}, {shard['kernels']} kernels in {seconds:.0f} s")
    if rc != 0 and not out.exists():
        raise dg.Failure(f"profiling worker on GPU {shard['gpu']} exited {rc} without results ({batch})")
    return {**shard, "results": str(out), "exit_code": rc, "seconds": round(seconds, 1),
            "cuda_visible_devices": "" if gpu is None else str(gpu)}


@dg.op(out=dg.Out(dg.Nothing), pool="duckdb_writer")
def ingest_measurements(context: dg.OpExecutionContext, settings: SettingsResource, warehouse: WarehouseResource,
                        shards: list[dict]) -> None:
    """The shipped files, the inbox and the shards' results, through the idempotent ingest."""
    from warehouse import checks
    from warehouse.errors import IngestError
    from warehouse.ingest import ingest_file

    cfg = settings.get()
    hardware = context.partition_key
    kernel_files, res_files = _partition_files(result_files(cfg), hardware)
    added, profiled, rejected, files = 0, 0, [], 0
    shard_files = [Path(s["results"]) for s in shards if Path(s["results"]).exists()]
    with warehouse.connect() as con:
        for f in kernel_files + res_files + shard_files:
            try:
                report = ingest_file(con, f)
            except IngestError as exc:  # a bad file is reported, never half-written
                rejected.append(f"{f.name}: {exc}")
                context.log.warning(f"rejected {f}: {exc}")
                continue
            files += 1
            if report.kind == "results":
                added += report.added
                profiled += report.added if f in shard_files else 0
        features = _ingest_compile_features(context, con, cfg)
        counts = checks.partition_counts(con, hardware)
    table = markdown_table(["GPU", "CUDA_VISIBLE_DEVICES", "kernels", "seconds", "exit code"],
                           [(s["gpu"], s["cuda_visible_devices"] or "-", s["kernels"], s["seconds"], s["exit_code"])
                            for s in sorted(shards, key=lambda s: s["gpu"])])
    context.add_output_metadata({
        "table": "measurements", "hardware_id": hardware, "rows": counts["measurements"],
        "correct": counts["correct"], "batches": counts["batches"], "files_ingested": files,
        "rows_added": added, "profiled_here": profiled, "measuring_steps": len(shards),
        "compile_features_added": features,
        "shards": dg.MetadataValue.md(table if shards else "(nothing measured on this host)"),
        "files_rejected": dg.MetadataValue.md("\n".join(f"- {r}" for r in rejected) or "none"),
    })


def _ingest_compile_features(context, con, cfg) -> int:
    """The committed compile features (data/features/<target>/*.parquet) of known kernels."""
    from warehouse.errors import ValidationError
    from warehouse.kernels import ingest_compile_features

    added = 0
    for f in sorted(cfg.data_dir.glob("features/*/*.parquet")):
        try:
            added += ingest_compile_features(con, f)
        except ValidationError as exc:
            context.log.warning(f"rejected {f}: {exc}")
    return added


@dg.graph_asset(
    group_name=GROUP,
    kinds={"duckdb", "triton"},
    partitions_def=HARDWARE_PARTITIONS,
    ins={"kernel_candidates": dg.AssetIn(dagster_type=dg.Nothing)},
    description="Kernel measurements of one hardware type (DuckDB `measurements`): the shipped data/ files, "
                "the inbox, and on a CUDA host of this type, new measurements of unmeasured candidates, "
                "one measuring step per GPU.",
)
def kernel_measurements(kernel_candidates):
    return ingest_measurements(plan_measurements(kernel_candidates).map(measure_shard).collect())


@dg.multi_asset_check(
    specs=[
        dg.AssetCheckSpec(SPEEDUP_REQUIRES_CORRECTNESS, asset="kernel_measurements", blocking=True,
                          description="Every speedup comes from every benchmark case run, checked and timed."),
        dg.AssetCheckSpec(SPEEDUPS_FINITE_POSITIVE, asset="kernel_measurements", blocking=True),
        dg.AssetCheckSpec(ONE_FINGERPRINT_PER_BATCH, asset="kernel_measurements", blocking=True),
    ],
    pool="duckdb_writer",
)
def measurement_checks(context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource):
    """The data checks of one hardware partition's measurements (a failure blocks curation)."""
    from warehouse import checks

    hardware = context.op_execution_context.partition_key
    with warehouse.connect(read_only=True) as con:
        bad_cases = checks.ok_without_every_case(con, hardware)
        bad_values = checks.nonfinite_speedups(con, hardware)
        bad_batches = checks.batches_with_several_fingerprints(con, hardware)
    yield offending_ids_result(SPEEDUP_REQUIRES_CORRECTNESS, bad_cases, asset_key="kernel_measurements")
    yield offending_ids_result(SPEEDUPS_FINITE_POSITIVE, bad_values, asset_key="kernel_measurements")
    yield offending_ids_result(ONE_FINGERPRINT_PER_BATCH, bad_batches, asset_key="kernel_measurements")


defs = dg.Definitions(assets=[kernel_measurements], asset_checks=[measurement_checks])
