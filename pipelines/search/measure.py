"""Where a search's measurements come from: the measured table, or the GPU worker.

A measurer takes a list of `MeasureItem` (kernels of any tasks, with their parents) and returns
an Outcome per kernel id. The driver gathers the requests of several searches into one call,
so a live round is one worker batch.

    SimulatedMeasurer  reads the table; a kernel it does not hold comes back "unmeasured"
    LiveMeasurer       writes a kernel batch and hands it to this GPU's measuring service when one
                       runs (pipelines/profiling/service.py: start-up and reference timings paid
                       once, not per round), else runs `python3 -m pipelines.profiling.worker` on
                       it; writes the rows as a result file; results are kept (and reused within
                       the search) and every result file is listed for ingestion like any batch

This module imports only the standard library, numpy and pyarrow (the GPU host has no polars).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.profiling import service_queue
from pipelines.profiling.results import rows_to_table
from pipelines.search import space
from pipelines.search.events import Child, Outcome
from pipelines.search.table import MeasuredTable
from warehouse.formats import KERNEL_BATCH_SCHEMA

log = logging.getLogger(__name__)


class MeasureError(RuntimeError):
    """Measurements could not be made (the worker failed or stopped early); nothing is logged,
    so a rerun of the search asks for the same kernels again."""


@dataclass(frozen=True)
class MeasureItem:
    task: str
    child: Child
    parent: str | None


class Measurer(Protocol):
    def measure(self, items: Sequence[MeasureItem]) -> dict[str, Outcome]:
        """An Outcome for every item's kernel id."""
        ...


class SimulatedMeasurer:
    """Outcomes from a measured table; kernels it lacks are "unmeasured" (counted, not skipped)."""

    def __init__(self, table: MeasuredTable):
        self.table = table

    def measure(self, items: Sequence[MeasureItem]) -> dict[str, Outcome]:
        out = {}
        for it in items:
            kid = it.child.kernel_id
            out[kid] = self.table.get(kid) or Outcome(kid, "unmeasured")
        return out


def outcome_from_result(row: dict) -> Outcome:
    """A worker result row (RESULT_SCHEMA) as an Outcome."""
    speedup = row.get("speedup")
    if row.get("status") == "ok" and speedup is not None and speedup > 0:
        return Outcome(row["kernel_id"], "ok", float(speedup))
    return Outcome(row["kernel_id"], "failed", None, row.get("failure_kind") or "failed")


def write_kernel_batch(records: Sequence[dict], path: Path) -> Path:
    """A kernel batch file (KERNEL_BATCH_SCHEMA, zstd), written whole (temp name, then rename)."""
    names = KERNEL_BATCH_SCHEMA.names
    table = pa.Table.from_pylist([{n: r.get(n) for n in names} for r in records], schema=KERNEL_BATCH_SCHEMA)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    pq.write_table(table, tmp, compression="zstd")
    tmp.replace(path)
    return path


@dataclass
class LiveMeasurer:
    """Measures on this host's GPU through the profiling worker, one worker run per call.

    Args:
        workdir: where batch and result files go (batch-<n>.parquet, results-<n>.parquet).
        device: "cuda", or "cpu" (Triton interpreter: tests and dry runs).
        worker_args: extra worker flags (e.g. ["--compile-workers", "12"]).
        timeout_s: wall limit of one worker run (or one service job); past it the run is a MeasureError.
        service: "auto" (the measuring service when one runs on this GPU's queue, else the
            worker), "on" (the service or a MeasureError), "off" (always a worker run). The
            service measures with its own settings: worker_args apply to worker runs only.
        queue: the service's queue folder (default: service_queue.default_queue(device)).
    """

    workdir: Path
    device: str = "cuda"
    worker_args: Sequence[str] = ()
    timeout_s: float = 600.0
    cache: dict[str, Outcome] = field(default_factory=dict)
    result_files: list[Path] = field(default_factory=list)
    records: dict[str, dict] = field(default_factory=dict)  # every kernel sent, with lineage
    worker_wall_s: float = 0.0
    service: str = "auto"
    queue: str | None = None
    service_runs: int = 0  # rounds measured by the service (the rest by worker runs)

    def __post_init__(self) -> None:
        # A resumed search reads what earlier worker runs of it measured: no kernel twice.
        self.workdir = Path(self.workdir)
        for out in sorted(self.workdir.glob("results-*.parquet")):
            self.result_files.append(out)
            for row in pq.read_table(out).to_pylist():
                self.cache[row["kernel_id"]] = outcome_from_result(row)
        for batch in sorted(self.workdir.glob("batch-*.parquet")):
            for r in pq.read_table(batch).to_pylist():
                self.records[r["kernel_id"]] = r

    def measure(self, items: Sequence[MeasureItem]) -> dict[str, Outcome]:
        todo: dict[str, dict] = {}
        for it in items:
            kid = it.child.kernel_id
            if kid not in self.cache and kid not in todo:
                todo[kid] = space.kernel_record(it.task, it.child, parent_id=it.parent)
        if todo:
            self._run(list(todo.values()))
        missing = [it.child.kernel_id for it in items if it.child.kernel_id not in self.cache]
        if missing:
            raise MeasureError(f"the worker returned no result for {len(missing)} kernels, e.g. {missing[0]}")
        return {it.child.kernel_id: self.cache[it.child.kernel_id] for it in items}

    def _use_service(self) -> bool:
        if self.service == "off":
            return False
        up = service_queue.running(self.queue, self.device)
        if not up and self.service == "on":
            raise MeasureError(f"no measuring service on {service_queue.default_queue(self.device, self.queue)}")
        return up

    def _run(self, records: list[dict]) -> None:
        n = len(self.result_files) + 1
        batch = write_kernel_batch(records, self.workdir / f"batch-{n:03d}.parquet")
        out = self.workdir / f"results-{n:03d}.parquet"
        if self._use_service():
            t0 = time.monotonic()
            try:
                rows = service_queue.submit(records, queue=self.queue, device=self.device, timeout_s=self.timeout_s)
            except service_queue.ServiceUnavailable as e:
                if self.service == "on":
                    raise MeasureError(str(e)) from None
                log.warning("%s; measuring %s with a worker run", e, batch.name)
            except service_queue.ServiceError as e:
                raise MeasureError(str(e)) from None
            else:
                tmp = out.with_name(out.name + ".partial")
                pq.write_table(rows_to_table(rows), tmp, compression="zstd")
                tmp.replace(out)
                self.service_runs += 1
                self._read_results(records, out)
                return
            finally:
                self.worker_wall_s += time.monotonic() - t0
        cmd = [sys.executable, "-m", "pipelines.profiling.worker", "--batch", str(batch), "--out", str(out),
               "--device", self.device, *self.worker_args]
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True,
                                  timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise MeasureError(f"the worker ran past {self.timeout_s:.0f} s on {batch.name}") from None
        finally:
            self.worker_wall_s += time.monotonic() - t0
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["no output"]
            raise MeasureError(f"worker exit {proc.returncode} on {batch.name}: {tail[0]}")
        self._read_results(records, out)

    def _read_results(self, records: list[dict], out: Path) -> None:
        for r in records:
            self.records[r["kernel_id"]] = r
        self.result_files.append(out)
        for row in pq.read_table(out).to_pylist():
            self.cache[row["kernel_id"]] = outcome_from_result(row)
        log.info("measured %d kernels in %s", len(records), out.name)
