"""Running a selection of the asset graph in process and reading what happened, for the
orchestration and surrogate-asset tests. Not a test module (no test_ prefix)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import polars as pl

REPO = Path(__file__).resolve().parents[1]
H200_DIR, H100_DIR = REPO / "data" / "measurements" / "h200", REPO / "data" / "measurements" / "h100"
RUN_B = "results-2026-11-29-harness1-run-b.parquet"


def materialize(defs: dg.Definitions, selection, instance, partition_key: str | None = None):
    """Execute `selection` of `defs` as one job on `instance`; the result, failures included."""
    job = dg.define_asset_job("t", selection=selection)
    resolved = dg.Definitions.merge(defs, dg.Definitions(jobs=[job])).resolve_job_def("t")
    return resolved.execute_in_process(instance=instance, partition_key=partition_key, raise_on_error=False)


def check_results(result) -> dict[str, bool]:
    """Check name -> passed, for every asset check the run evaluated."""
    return {
        ev.event_specific_data.check_name: ev.event_specific_data.passed
        for ev in result.all_events
        if ev.event_type_value == "ASSET_CHECK_EVALUATION"
    }


def materialized(result) -> set[str]:
    """The asset keys the run materialised."""
    return {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}


def h100_batch(inbox: Path, parents_from: str = RUN_B) -> tuple[list[Path], int]:
    """The committed H100 rows of rewrites whose parents an H200 results file (default run B)
    measured, one results file per committed one (a batch each), with their kernels, written to a
    folder (an inbox, a data folder). Returns (the results files, their rows)."""
    parents = set(pl.read_parquet(H200_DIR / parents_from)["kernel_id"].to_list())
    kernels = pl.concat([pl.read_parquet(f) for f in sorted(H100_DIR.glob("kernels-*.parquet"))], how="diagonal_relaxed")
    kernels = kernels.filter(pl.col("parent_kernel_id").is_in(list(parents)))
    inbox.mkdir(parents=True, exist_ok=True)
    written, n = [], 0
    for f in sorted(H100_DIR.glob("results-*.parquet")):
        rows = pl.read_parquet(f).filter(pl.col("kernel_id").is_in(kernels["kernel_id"].to_list()))
        if rows.height:
            written.append(inbox / f"results-h100-{len(written)}.parquet")
            rows.write_parquet(written[-1])
            n += rows.height
    kernels.write_parquet(inbox / "kernels-h100.parquet")
    return written, n
