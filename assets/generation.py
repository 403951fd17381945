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
    import polars as pl

    from pipelines.generation import tables
    from pipelines.generation.candidates import (
        build_candidates_many,
        committed_compile_features,
        sample_records,
    )
    from pipelines.tasks import task_names
    from warehouse import checks_generation as gchecks
    from warehouse.ids import kernel_id
    from warehouse.kernels import add_kernel_checks, add_kernel_features, add_kernels

    cfg = settings.get()
    g = cfg.generation
    todo, skipped = [], []
    for i, task in enumerate(task_names()):
        # Sampling is deterministic and cheap; compiling is not. A task whose sampled kernels are
        # all stored with their sm_90 features already is skipped (a rerun with nothing new).
        ids = [r["kernel_id"] for r in sample_records(task, g.kernels_per_task, g.seed)]
        if g.compile_features:
            with warehouse.connect(read_only=True) as con:
                if len(gchecks.known_kernels(con, ids, "sm_90")) == len(ids):
                    skipped.append(task)
                    continue
        context.log.info(f"[{i + 1}/{len(task_names())}] {task}: {g.kernels_per_task} kernels")
        todo.append(task)
    frames, compiled_here = [], 0
    if todo:
        known = committed_compile_features(cfg.data_dir / "features" / "sm_90") \
            if g.compile_features and g.reuse_committed_features else {}

        def progress(stage: str, done: int, total: int) -> None:
            if done == total or done % 10 == 0:  # the live line follows [done/total]
                context.log.info(f"{stage} [{done}/{total}]")

        # Checks under the interpreter cost ~seconds per kernel: a deterministic sample (the
        # reference row and the first kernels of the lineage walk) keeps `make run` bounded.
        frame, compiled_here = build_candidates_many(
            todo, g.kernels_per_task, seed=g.seed, check_count=g.cpu_check_sample, compile=g.compile_features,
            known=known, progress=progress, n_workers=g.workers, compile_timeout_s=g.timeout_s,
            check_timeout_s=g.timeout_s)
        frames.append(frame)
    if not frames:
        with warehouse.connect(read_only=True) as con:
            orphans = gchecks.orphan_parents(con)
        return dg.MaterializeResult(
            metadata={"table": "kernels", "rows": 0, "rows_added": 0, "skipped_tasks": ", ".join(skipped),
                      "note": "every sampled kernel already stored with its features"},
            check_results=[offending_ids_result(UNIQUE_KERNEL_IDS, []), offending_ids_result(PARENTS_EXIST, orphans),
                           offending_ids_result(EVERY_KERNEL_COMPILED_OR_FAILED, [])],
        )
    frame = pl.concat(frames)
    mismatched = [r for r, s in zip(frame["kernel_id"], frame["source"]) if kernel_id(s) != r]
    duplicates = frame.filter(pl.col("kernel_id").is_duplicated())["kernel_id"].unique().to_list()
    with warehouse.connect() as con:
        added = add_kernels(con, tables.kernel_rows(frame.unique("kernel_id", keep="first")))
        add_kernel_features(con, tables.feature_rows(frame.unique("kernel_id", keep="first")))
        add_kernel_checks(con, tables.check_rows(frame.unique("kernel_id", keep="first")))
        orphans = gchecks.orphan_parents(con)
        uncompiled = gchecks.without_compile_record(con, frame.filter(pl.col("language") == "triton")["kernel_id"].to_list(), "sm_90") if g.compile_features else []
    checked = frame.filter(pl.col("check_ok").is_not_null())
    return dg.MaterializeResult(
        metadata={
            "table": "kernels",
            "rows": frame.height,
            "rows_added": added,
            "tasks": frame["task"].n_unique(),
            "skipped_tasks": ", ".join(skipped) or "none",
            "compiled": int((frame["compile_status"] == "compiled").sum()),
            "compiled_here": compiled_here,
            "cpu_checked": checked.height,
            "cpu_check_passed": int(checked["check_ok"].sum()),
            "preview": dg.MetadataValue.md(tables.summary_markdown(frame)),
        },
        check_results=[
            offending_ids_result(UNIQUE_KERNEL_IDS, duplicates + mismatched),
            offending_ids_result(PARENTS_EXIST, orphans),
            offending_ids_result(EVERY_KERNEL_COMPILED_OR_FAILED, uncompiled),
        ],
    )



defs = dg.Definitions(assets=[kernel_candidates])
