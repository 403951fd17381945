"""Split a candidates frame (see candidates.build_candidates) into the warehouse's row sets."""

from __future__ import annotations

import polars as pl

from warehouse.formats import KERNEL_BATCH_SCHEMA

CPU_CHECK = "cpu_interpreter"


def kernel_rows(frame: pl.DataFrame) -> pl.DataFrame:
    """The `kernels` table columns."""
    return frame.select([f.name for f in KERNEL_BATCH_SCHEMA])


def feature_rows(frame: pl.DataFrame) -> pl.DataFrame:
    """`kernel_features` rows for kernels that went through the AOT compile.

    'skipped' (the PyTorch reference: nothing to compile) and 'error' (our side failed, e.g. the
    task input could not be built) are not facts about the kernel, so they get no row; the
    kernel_candidates check then reports an 'error' kernel as missing its compile record.
    """
    done = frame.filter(pl.col("compile_status").is_in(["compiled", "compile_failed", "rejected"]))
    return done.select(
        "kernel_id",
        pl.col("compile_target").alias("target"),
        pl.col("compile_status").alias("status"),
        "n_regs",
        "n_spills",
        "shared_bytes",
        *[c for c in ("n_kernels", "n_launches") if c in frame.columns],
        pl.col("compile_error").alias("error"),
    )


def check_rows(frame: pl.DataFrame) -> pl.DataFrame:
    """`kernel_checks` rows for kernels checked under the CPU interpreter."""
    done = frame.filter(pl.col("check_ok").is_not_null())
    return done.select(
        "kernel_id",
        pl.lit(CPU_CHECK).alias("check_kind"),
        pl.col("check_ok").alias("ok"),
        pl.col("check_failure_kind").alias("failure_kind"),
        pl.col("check_message").alias("message"),
        pl.col("check_s").alias("seconds"),
    )


def summary_markdown(frame: pl.DataFrame) -> str:
    """Counts by task x algorithm x compile status, as a markdown table for the UI."""
    counts = (
        frame.group_by("task", "algorithm", "compile_status")
        .len()
        .sort("task", "algorithm", "compile_status", nulls_last=True)
    )
    lines = ["| task | algorithm | compile | kernels |", "|---|---|---|---|"]
    lines += [f"| {r['task']} | {r['algorithm']} | {r['compile_status'] or '-'} | {r['len']} |" for r in counts.iter_rows(named=True)]
    return "\n".join(lines)
