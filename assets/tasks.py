"""kernel_tasks: the task suite, written to the warehouse's `tasks` table."""


import dagster as dg

from assets._metadata import markdown_table
from orchestration.resources import WarehouseResource
from pipelines.tasks import catalog

GROUP = "tasks"
REFERENCES_PASS_OWN_CHECK = "references_pass_own_check"


@dg.asset(
    group_name=GROUP,
    kinds={"duckdb", "torch"},
    pool="duckdb_writer",
    check_specs=[dg.AssetCheckSpec(REFERENCES_PASS_OWN_CHECK, asset="kernel_tasks", blocking=True)],
)
def kernel_tasks(warehouse: WarehouseResource) -> dg.MaterializeResult:
    """The kernel task suite (GPU MODE contract), one row per task in DuckDB table `tasks`."""
    from warehouse import tables

    rows = catalog.task_rows()
    with warehouse.connect() as con:
        tables.upsert_tasks(con, rows)
    checks = [catalog.reference_self_check(r["task"]) for r in rows]
    failed = [c for c in checks if not c.ok]
    preview = markdown_table(
        ["task", "benchmark cases", "correctness cases", "self-check"],
        [(r["task"], r["benchmark_cases"].count("seed"), r["correctness_cases"].count("seed"),
          f"{'ok' if c.ok else c.message} ({c.seconds:.1f} s)") for r, c in zip(rows, checks, strict=True)],
    )
    return dg.MaterializeResult(
        metadata={"rows": len(rows), "table": "tasks", "preview": dg.MetadataValue.md(preview)},
        check_results=[
            dg.AssetCheckResult(
                check_name=REFERENCES_PASS_OWN_CHECK,
                passed=not failed,
                severity=dg.AssetCheckSeverity.ERROR,
                metadata={"failed": len(failed), "threshold": 0, "offending": ", ".join(c.task for c in failed[:5])},
            )
        ],
    )


defs = dg.Definitions(assets=[kernel_tasks])
