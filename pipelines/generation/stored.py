"""The candidates the `kernel_candidates` asset stores: each task's sampled kernels built
(compiled for sm_90, a sample CPU-checked) and written to DuckDB `kernels`, `kernel_features`
and `kernel_checks`, with what the asset's checks read back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl


@dataclass(frozen=True)
class StoredCandidates:
    """What one generation left. `frame` is None when every task was skipped (nothing new)."""

    frame: pl.DataFrame | None
    skipped_tasks: list[str]
    rows_added: int = 0
    compiled_here: int = 0
    bad_ids: list[str] = field(default_factory=list)  # duplicated, or not the sha256 of the source
    orphan_parents: list[str] = field(default_factory=list)
    uncompiled: list[str] = field(default_factory=list)  # triton kernels without an sm_90 record


def generate_and_store(warehouse_path: str | Path, data_dir: Path, generation: Any,
                       log: Callable[[str], None] = lambda line: None) -> StoredCandidates:
    """Build every task's candidates that the warehouse lacks, and store them.

    Args:
        warehouse_path: the DuckDB file.
        data_dir: the shipped data (its features/sm_90 compile features are reused when allowed).
        generation: the generation settings (kernels_per_task, seed, compile_features,
            reuse_committed_features, cpu_check_sample, workers, timeout_s).
        log: receives one progress line at a time.
    """
    from pipelines.generation import tables
    from pipelines.generation.candidates import (
        build_candidates_many,
        committed_compile_features,
        sample_records,
    )
    from pipelines.tasks import task_names
    from warehouse import checks_generation as gchecks
    from warehouse.db import connect
    from warehouse.ids import kernel_id
    from warehouse.kernels import add_kernel_checks, add_kernel_features, add_kernels

    g = generation
    todo, skipped = [], []
    for i, task in enumerate(task_names()):
        # Sampling is deterministic and cheap; compiling is not. A task whose sampled kernels are
        # all stored with their sm_90 features already is skipped (a rerun with nothing new).
        ids = [r["kernel_id"] for r in sample_records(task, g.kernels_per_task, g.seed)]
        if g.compile_features:
            with connect(warehouse_path, read_only=True) as con:
                if len(gchecks.known_kernels(con, ids, "sm_90")) == len(ids):
                    skipped.append(task)
                    continue
        log(f"[{i + 1}/{len(task_names())}] {task}: {g.kernels_per_task} kernels")
        todo.append(task)
    if not todo:
        with connect(warehouse_path, read_only=True) as con:
            return StoredCandidates(None, skipped, orphan_parents=gchecks.orphan_parents(con))
    known = committed_compile_features(data_dir / "features" / "sm_90") \
        if g.compile_features and g.reuse_committed_features else {}

    def progress(stage: str, done: int, total: int) -> None:
        if done == total or done % 10 == 0:  # the live line follows [done/total]
            log(f"{stage} [{done}/{total}]")

    # Checks under the interpreter cost ~seconds per kernel: a deterministic sample (the
    # reference row and the first kernels of the lineage walk) keeps `make run` bounded.
    frame, compiled_here = build_candidates_many(
        todo, g.kernels_per_task, seed=g.seed, check_count=g.cpu_check_sample, compile=g.compile_features,
        known=known, progress=progress, n_workers=g.workers, compile_timeout_s=g.timeout_s,
        check_timeout_s=g.timeout_s)
    mismatched = [r for r, s in zip(frame["kernel_id"], frame["source"]) if kernel_id(s) != r]
    duplicates = frame.filter(pl.col("kernel_id").is_duplicated())["kernel_id"].unique().to_list()
    unique = frame.unique("kernel_id", keep="first")
    with connect(warehouse_path) as con:
        added = add_kernels(con, tables.kernel_rows(unique))
        add_kernel_features(con, tables.feature_rows(unique))
        add_kernel_checks(con, tables.check_rows(unique))
        orphans = gchecks.orphan_parents(con)
        triton_ids = frame.filter(pl.col("language") == "triton")["kernel_id"].to_list()
        uncompiled = gchecks.without_compile_record(con, triton_ids, "sm_90") if g.compile_features else []
    return StoredCandidates(frame, skipped, added, compiled_here, duplicates + mismatched, orphans, uncompiled)
