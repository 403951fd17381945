"""kernel_candidates: generated Triton kernels with lineage and compile features, in DuckDB."""


import dagster as dg

from assets._checks import offending_ids_result
from orchestration.resources import SettingsResource, WarehouseResource

GROUP = "generation"
UNIQUE_KERNEL_IDS = "unique_kernel_ids"
PARENTS_EXIST = "parents_exist"
EVERY_KERNEL_COMPILED_OR_FAILED = "every_kernel_compiled_or_recorded"


@dg.asset(
    group_name=GROUP,
    kinds={"duckdb", "triton"},
    pool="duckdb_writer",
    deps=["kernel_tasks"],
    check_specs=[
        dg.AssetCheckSpec(UNIQUE_KERNEL_IDS, asset="kernel_candidates", blocking=True,
                          description="Ids are unique and equal the sha256 of the normalised source."),
        dg.AssetCheckSpec(PARENTS_EXIST, asset="kernel_candidates", blocking=True),
        dg.AssetCheckSpec(EVERY_KERNEL_COMPILED_OR_FAILED, asset="kernel_candidates", blocking=True,
                          description="Every generated kernel has an sm_90 compile record (compiled, compile_failed or rejected)."),
    ],
)
def kernel_candidates(
    context: dg.AssetExecutionContext, settings: SettingsResource, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    """Candidate kernels per task (DuckDB `kernels`, `kernel_features`, `kernel_checks`): a lineage
    walk through each task's Triton kernel space, AOT-compiled for sm_90, a sample CPU-checked."""
    from pipelines.generation import tables
    from pipelines.generation.stored import generate_and_store

    cfg = settings.get()
    out = generate_and_store(warehouse.path, cfg.data_dir, cfg.generation, log=context.log.info)
    checks = [offending_ids_result(UNIQUE_KERNEL_IDS, out.bad_ids),
              offending_ids_result(PARENTS_EXIST, out.orphan_parents),
              offending_ids_result(EVERY_KERNEL_COMPILED_OR_FAILED, out.uncompiled)]
    if out.frame is None:
        return dg.MaterializeResult(
            metadata={"table": "kernels", "rows": 0, "rows_added": 0, "skipped_tasks": ", ".join(out.skipped_tasks),
                      "note": "every sampled kernel already stored with its features"},
            check_results=checks)
    frame, checked = out.frame, out.frame.filter(out.frame["check_ok"].is_not_null())
    return dg.MaterializeResult(
        metadata={
            "table": "kernels",
            "rows": frame.height,
            "rows_added": out.rows_added,
            "tasks": frame["task"].n_unique(),
            "skipped_tasks": ", ".join(out.skipped_tasks) or "none",
            "compiled": int((frame["compile_status"] == "compiled").sum()),
            "compiled_here": out.compiled_here,
            "cpu_checked": checked.height,
            "cpu_check_passed": int(checked["check_ok"].sum()),
            "preview": dg.MetadataValue.md(tables.summary_markdown(frame)),
        },
        check_results=checks,
    )


defs = dg.Definitions(assets=[kernel_candidates])
