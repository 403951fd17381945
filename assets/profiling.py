"""kernel_measurements: measured kernels per hardware (dynamic partitions), in DuckDB `measurements`."""


from pathlib import Path

import dagster as dg

from assets._checks import offending_ids_result
from orchestration.partitions import HARDWARE_PARTITIONS, hardware_of_file, result_files
from orchestration.resources import SettingsResource, WarehouseResource

GROUP = "profiling"
SPEEDUP_REQUIRES_CORRECTNESS = "speedup_requires_correctness"
SPEEDUPS_FINITE_POSITIVE = "speedups_finite_positive"
ONE_FINGERPRINT_PER_BATCH = "one_fingerprint_per_batch"


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


@dg.asset(
    group_name=GROUP,
    kinds={"duckdb", "triton"},
    pool="duckdb_writer",
    partitions_def=HARDWARE_PARTITIONS,
    deps=["kernel_candidates"],
    check_specs=[
        dg.AssetCheckSpec(SPEEDUP_REQUIRES_CORRECTNESS, asset="kernel_measurements", blocking=True,
                          description="Every speedup comes from every benchmark case run, checked and timed."),
        dg.AssetCheckSpec(SPEEDUPS_FINITE_POSITIVE, asset="kernel_measurements", blocking=True),
        dg.AssetCheckSpec(ONE_FINGERPRINT_PER_BATCH, asset="kernel_measurements", blocking=True),
    ],
)
def kernel_measurements(
    context: dg.AssetExecutionContext, settings: SettingsResource, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    """Kernel measurements of one hardware type (DuckDB `measurements`): the shipped data/ files,
    the inbox, and on a CUDA host of this type, new measurements of unmeasured candidates."""
    from pipelines.profiling import launch
    from warehouse import checks
    from warehouse.errors import IngestError
    from warehouse.ingest import ingest_file
    from warehouse.queue import unmeasured_kernels

    cfg = settings.get()
    hardware = context.partition_key
    kernel_files, res_files = _partition_files(result_files(cfg), hardware)
    added, rejected, files = 0, [], 0
    with warehouse.connect() as con:
        for f in kernel_files + res_files:
            try:
                report = ingest_file(con, f)
                added += report.added if report.kind == "results" else 0
                files += 1
            except IngestError as exc:  # a bad file is reported, never half-written
                rejected.append(f"{f.name}: {exc}")
                context.log.warning(f"rejected {f}: {exc}")
    profiled = 0
    if cfg.profiling.measure_on_cuda and launch.cuda_hardware_id() == hardware:
        # A CUDA host of this type: measure what the warehouse has not measured here yet.
        with warehouse.connect(read_only=True) as con:
            todo = unmeasured_kernels(con, hardware, cfg.profiling.max_kernels)
        if todo.height:
            stamp = context.run.run_id[:8]
            batch, out = cfg.home / "measured" / f"batch-{stamp}.parquet", cfg.home / "measured" / f"results-{stamp}.parquet"
            out.parent.mkdir(parents=True, exist_ok=True)
            todo.write_parquet(batch, compression="zstd")
            rc = launch.run_worker(batch, out, timeout_s=cfg.profiling.timeout_s, compile_workers=cfg.profiling.compile_workers)
            context.log.info(f"worker exit code {rc}; {todo.height} kernels sent")
            if out.exists():
                with warehouse.connect() as con:
                    profiled = ingest_file(con, out).added
    with warehouse.connect() as con:
        counts = checks.partition_counts(con, hardware)
        bad_cases = checks.ok_without_every_case(con, hardware)
        bad_values = checks.nonfinite_speedups(con, hardware)
        bad_batches = checks.batches_with_several_fingerprints(con, hardware)
    return dg.MaterializeResult(
        metadata={
            "table": "measurements",
            "hardware_id": hardware,
            "rows": counts["measurements"],
            "correct": counts["correct"],
            "batches": counts["batches"],
            "files_ingested": files,
            "rows_added": added + profiled,
            "profiled_here": profiled,
            "files_rejected": dg.MetadataValue.md("\n".join(f"- {r}" for r in rejected) or "none"),
        },
        check_results=[
            offending_ids_result(SPEEDUP_REQUIRES_CORRECTNESS, bad_cases),
            offending_ids_result(SPEEDUPS_FINITE_POSITIVE, bad_values),
            offending_ids_result(ONE_FINGERPRINT_PER_BATCH, bad_batches),
        ],
    )



defs = dg.Definitions(assets=[kernel_measurements])
