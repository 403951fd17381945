"""Kernel candidates of a task: sample, compile for the target, optionally check on the CPU.

`build_candidates` is the pipeline function behind the `kernel_candidates` asset and
`kernelcast generate`; `write_batch` writes its frame as the kernel batch file the GPU worker
and the warehouse read (KERNEL_BATCH_SCHEMA columns first, then the feature columns below as
extra columns in the SAME Parquet file: the worker ignores them, no sidecar to lose).

Feature columns (always present; null where not computed):
    compile_status, n_regs, n_spills, shared_bytes, n_kernels, n_launches, compile_error,
    compile_s, compile_target                                           (aot.compile_many)
    check_ok, check_failure_kind, check_message, check_s               (profiling.check)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.generation import aot, sampler
from pipelines.generation.reference import reference_record
from pipelines.tasks import TASK_MODULES
from warehouse.formats import KERNEL_BATCH_SCHEMA

log = logging.getLogger(__name__)

StageProgress = Callable[[str, int, int], None]  # (stage: generate|compile|check, done, total)

MODES = ("lineage", "uniform")

FEATURE_COLUMNS: dict[str, pl.DataType] = {
    "compile_status": pl.String(),
    "n_regs": pl.Int64(),
    "n_spills": pl.Int64(),
    "shared_bytes": pl.Int64(),
    "n_kernels": pl.Int64(),
    "n_launches": pl.Int64(),
    "compile_error": pl.String(),
    "compile_s": pl.Float64(),
    "compile_target": pl.String(),
    "check_ok": pl.Boolean(),
    "check_failure_kind": pl.String(),
    "check_message": pl.String(),
    "check_s": pl.Float64(),
}

RECORD_COLUMNS: dict[str, pl.DataType] = {f.name: pl.String() for f in KERNEL_BATCH_SCHEMA}


def _stage(progress: StageProgress | None, stage: str) -> Callable[[int, int], None] | None:
    if progress is None:
        return None
    return lambda done, total: progress(stage, done, total)


def sample_records(
    task: str,
    count: int,
    seed: int,
    mode: str = "lineage",
    progress: Callable[[int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """`count` kernel records of the task's space, by lineage (default) or uniform sampling."""
    if mode == "lineage":
        return sampler.generate_lineage(task, count, seed, progress=progress)
    if mode == "uniform":
        return sampler.sample_uniform(task, count, seed, progress=progress)
    raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


def build_candidates(
    task: str,
    count: int,
    seed: int = 0,
    check: bool = False,
    compile: bool = True,
    progress: StageProgress | None = None,
    *,
    mode: str = "lineage",
    include_reference: bool = True,
    n_workers: int = 2,
    compile_timeout_s: float = aot.DEFAULT_TIMEOUT_S,
    check_timeout_s: float = 60.0,
    target: tuple[int, int] = (90, 32),
    case: str = "benchmark",
) -> pl.DataFrame:
    """Kernel records of `task` plus compile features and CPU check outcomes.

    Args:
        task: task name with a kernel space.
        count: generated kernels (the reference row, if any, comes on top).
        seed: sampling seed; same arguments -> same kernel ids in the same order.
        check: run correctness on CPU (Triton interpreter, correctness cases) per kernel.
        compile: AOT-compile each kernel for `target` (registers, spills, shared memory).
        progress: called as progress(stage, done, total), stage in generate|compile|check.
        mode: 'lineage' (mutation tree from the SEED) or 'uniform' (stratified by family).
        include_reference: prepend the task's PyTorch reference as a kernel row (registry tasks).
        n_workers: child processes for compile and check.
        compile_timeout_s: per-kernel compile limit.
        check_timeout_s: per-kernel check limit.
        target: (compute capability, warp size) of the compile.
        case: which task case drives the compile ('benchmark' or 'correctness'; see aot).

    Returns:
        One row per kernel: KERNEL_BATCH_SCHEMA columns then FEATURE_COLUMNS.
    """
    records = sample_records(task, count, seed, mode, progress=_stage(progress, "generate"))
    if include_reference and task in TASK_MODULES:
        records = [reference_record(task)] + records
    rows = [{**r, **{c: None for c in FEATURE_COLUMNS}} for r in records]
    if compile:
        _add_compile_features(rows, records, n_workers, compile_timeout_s, progress, target, case)
        log.info("%s: compiled %d kernels for sm_%d", task, len(rows), target[0])
    if check:
        _add_checks(rows, records, n_workers, check_timeout_s, progress)
    return pl.DataFrame(rows, schema={**RECORD_COLUMNS, **FEATURE_COLUMNS}, orient="row")


def _add_compile_features(rows, records, n_workers, timeout_s, progress, target, case,
                          known: Mapping[str, aot.Features] | None = None) -> int:
    """Compile features into `rows` (aligned with `records`): from `known` where it has the
    kernel, compiled here otherwise. Returns how many were compiled here."""
    known = known or {}
    todo = [i for i, r in enumerate(records) if r["kernel_id"] not in known]
    compiled = aot.compile_many([records[i] for i in todo], n_workers=n_workers, timeout_s=timeout_s,
                                progress=_stage(progress, "compile"), target=target, case=case) if todo else []
    feats = [known.get(r["kernel_id"]) for r in records]
    for i, f in zip(todo, compiled, strict=True):
        feats[i] = f
    for row, f in zip(rows, feats, strict=True):
        row.update(
            compile_status=f.status,
            n_regs=f.n_regs,
            n_spills=f.n_spills,
            shared_bytes=f.shared_bytes,
            n_kernels=f.n_kernels,
            n_launches=f.n_launches,
            compile_error=f.error,
            compile_s=f.seconds,
            compile_target=f"sm_{target[0]}",
        )
    return len(todo)


def _add_checks(rows, records, n_workers, timeout_s, progress) -> None:
    """CPU check outcomes into `rows` (aligned with `records`)."""
    from pipelines.profiling.check import check_sources

    # a kernel rejected or failed at compile is still checked: the CPU interpreter neither
    # enforces shared memory nor runs ptxas, and the two answers are different facts
    outcomes = check_sources(
        [(r["task"], r["source"]) for r in records],
        n_workers=n_workers,
        timeout_s=timeout_s,
        progress=_stage(progress, "check"),
    )
    for row, o in zip(rows, outcomes, strict=True):
        row.update(
            check_ok=o.ok,
            check_failure_kind=o.failure_kind,
            check_message=o.message,
            check_s=o.seconds,
        )


def _task_records(task: str, count: int, seed: int) -> list[dict[str, Any]]:
    records = sample_records(task, count, seed)
    return ([reference_record(task)] + records) if task in TASK_MODULES else records


def build_candidates_many(
    tasks: Sequence[str],
    count: int,
    seed: int = 0,
    *,
    check_count: int = 0,
    compile: bool = True,
    known: Mapping[str, aot.Features] | None = None,
    progress: StageProgress | None = None,
    n_workers: int = 2,
    compile_timeout_s: float = aot.DEFAULT_TIMEOUT_S,
    check_timeout_s: float = 60.0,
    target: tuple[int, int] = (90, 32),
) -> tuple[pl.DataFrame, int]:
    """`build_candidates` of several tasks at once (lineage mode, each task's reference row
    first), the first `check_count` kernels of each task's walk (and its reference) CPU-checked.

    One pool of compile workers and one of check children serve every task: a child's start
    imports torch and Triton (seconds each on 2 cores), paid once instead of once per task.
    A kernel found in `known` (the committed compile records of the target,
    `committed_compile_features`) takes that record instead of compiling again: the
    measurement ingest writes the same records over the warehouse's anyway.

    Returns:
        (the tasks' rows in task order, exactly as `build_candidates` per task and concatenated;
        how many kernels were compiled here).
    """
    records = [r for t in tasks for r in _task_records(t, count, seed)]
    rows = [{**r, **{c: None for c in FEATURE_COLUMNS}} for r in records]
    compiled = _add_compile_features(rows, records, n_workers, compile_timeout_s, progress, target, "benchmark",
                                     known) if compile else 0
    if check_count:
        sample = [r for t in tasks for r in _task_records(t, check_count, seed)]
        checked = [{"kernel_id": r["kernel_id"]} for r in sample]
        _add_checks(checked, sample, n_workers, check_timeout_s, progress)
        outcome = {c["kernel_id"]: c for c in checked}
        for row in rows:
            if row["kernel_id"] in outcome:
                row.update({k: v for k, v in outcome[row["kernel_id"]].items() if k != "kernel_id"})
    frame = pl.DataFrame(rows, schema={**RECORD_COLUMNS, **FEATURE_COLUMNS}, orient="row") if rows \
        else pl.DataFrame(schema={**RECORD_COLUMNS, **FEATURE_COLUMNS})
    return frame, compiled


def committed_compile_features(folder: str | os.PathLike, target: str = "sm_90") -> dict[str, aot.Features]:
    """kernel id -> its compile record in the compile-features files of `target` under `folder`
    (data/features/<target>/*.parquet; a source-features file, with `compile_status`, is not one).
    Records of a status the warehouse keeps (compiled, compile_failed, rejected) only; a later
    file wins; an unreadable file is skipped with a warning."""
    out: dict[str, aot.Features] = {}
    for path in sorted(Path(folder).glob("*.parquet")):
        try:
            frame = pl.read_parquet(path)
        except Exception as exc:  # noqa: BLE001 - a bad file costs compiles, not the run
            log.warning("%s: unreadable compile-features file, ignored (%s)", path, type(exc).__name__)
            continue
        if "compile_status" in frame.columns or not {"kernel_id", "target", "status"} <= set(frame.columns):
            continue
        keep = frame.filter((pl.col("target") == target) & pl.col("status").is_in(KEPT_STATUSES))
        for r in keep.to_dicts():
            out[r["kernel_id"]] = aot.Features(
                r["status"], n_regs=r.get("n_regs"), n_spills=r.get("n_spills"), shared_bytes=r.get("shared_bytes"),
                n_kernels=r.get("n_kernels") or 0, n_launches=r.get("n_launches") or 0, error=r.get("error"),
                seconds=float(r.get("seconds") or 0.0))
    return out


KEPT_STATUSES = ("compiled", "compile_failed", "rejected")  # warehouse.kernels.FEATURE_STATUSES


def batch_table(frame: pl.DataFrame) -> pa.Table:
    """The frame as an Arrow table: KERNEL_BATCH_SCHEMA (typed, in order) then extra columns."""
    missing = [f.name for f in KERNEL_BATCH_SCHEMA if f.name not in frame.columns]
    if missing:
        raise ValueError(f"kernel batch lacks columns: {', '.join(missing)}")
    arrow = frame.to_arrow()
    for f in KERNEL_BATCH_SCHEMA:
        if not f.nullable and arrow.column(f.name).null_count:
            raise ValueError(f"kernel batch column {f.name} has nulls")
    base = [arrow.column(f.name).cast(f.type) for f in KERNEL_BATCH_SCHEMA]
    extra = [c for c in arrow.column_names if c not in KERNEL_BATCH_SCHEMA.names]
    schema = pa.schema(list(KERNEL_BATCH_SCHEMA) + [arrow.schema.field(c) for c in extra])
    return pa.Table.from_arrays(base + [arrow.column(c) for c in extra], schema=schema)


def write_batch(frame: pl.DataFrame, path: str | os.PathLike) -> Path:
    """Write a kernel batch: Parquet (zstd), KERNEL_BATCH_SCHEMA columns then feature columns.

    Written to a temporary name and renamed, so a reader never sees half a file.

    Returns:
        The path written.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    pq.write_table(batch_table(frame), tmp, compression="zstd")
    os.replace(tmp, out)
    return out
