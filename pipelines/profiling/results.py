"""Result rows: incremental JSONL while a run goes, one Parquet file (RESULT_SCHEMA) at the end.

Every finished kernel is appended to `<out>.partial.jsonl` and fsynced, so a killed run loses
at most the kernels in flight. A rerun with the same --out reads the final file (if any) and
the partial file, skips the kernel ids already there (except `infrastructure` failures, which
were our fault and are retried) and keeps the batch id, so the rows of all attempts form one
batch. `finalize()` writes the Parquet file atomically (temp file + rename) and removes the
partial file.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from warehouse.formats import RESULT_SCHEMA

log = logging.getLogger(__name__)

PROTOCOLS = ("kernelcast", "paper", "gpumode")  # values of the protocol column; timing.py defines them
RETRIED_KINDS = ("infrastructure",)  # failure kinds a resumed run measures again
# The prefix of a measuring child's log line that holds one case's timed calls (`worker --call-times`:
# runner.py writes it, `python3 -m benchmarks.call_times` reads it back).
CALL_TIMES_TAG = "call-times "


def pairs_reference(protocol: str) -> bool:
    """Whether a row's reference timings are taken beside the kernel's, in its own job, and used
    alone (gpumode: runner.Measurer.paired_reference_timing), rather than shared and refreshed."""
    return protocol == "gpumode"


def partial_path(out_path: Path) -> Path:
    return out_path.with_name(out_path.name + ".partial.jsonl")


def _to_jsonable(row: dict) -> dict:
    out = dict(row)
    if isinstance(out.get("measured_at"), dt.datetime):
        out["measured_at"] = out["measured_at"].isoformat()
    return out


def _from_jsonable(row: dict) -> dict:
    out = dict(row)
    if isinstance(out.get("measured_at"), str):
        out["measured_at"] = dt.datetime.fromisoformat(out["measured_at"])
    return out


def rows_to_table(rows: list[dict]) -> pa.Table:
    """Rows (dicts with RESULT_SCHEMA's fields; missing ones null) as a table in RESULT_SCHEMA."""
    names = RESULT_SCHEMA.names
    clean = [{k: _from_jsonable(r).get(k) for k in names} for r in rows]
    return pa.Table.from_pylist(clean, schema=RESULT_SCHEMA)


def read_results(path: str | Path) -> list[dict]:
    """Rows of a result Parquet file as dicts (measured_at as datetime)."""
    return pq.read_table(path).to_pylist()


class ResultStore:
    """The rows of one output file, on disk after every append."""

    def __init__(self, out_path: str | Path, protocol: str):
        self.out_path = Path(out_path)
        self.partial = partial_path(self.out_path)
        self.rows: dict[str, dict] = {}
        self._load(protocol)
        self.batch_id = next((r["batch_id"] for r in self.rows.values()), None) or uuid.uuid4().hex
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.partial, "a", encoding="utf-8")

    def _load(self, protocol: str) -> None:
        found: list[dict] = []
        if self.out_path.exists():
            found += read_results(self.out_path)
        if self.partial.exists():
            with open(self.partial, encoding="utf-8") as f:
                for line in f:
                    try:
                        found.append(_from_jsonable(json.loads(line)))
                    except json.JSONDecodeError:
                        log.warning("skipping a torn line in %s (the run was killed mid-write)", self.partial)
        for row in found:  # later rows win
            self.rows[row["kernel_id"]] = row
        protocols = {r["protocol"] for r in self.rows.values()}
        if protocols and protocols != {protocol}:
            raise ValueError(
                f"{self.out_path} holds {', '.join(sorted(protocols))} results; resume with that --protocol or use another --out"
            )
        retried = [k for k, r in self.rows.items() if r.get("failure_kind") in RETRIED_KINDS]
        for k in retried:
            del self.rows[k]
        if self.rows or retried:
            log.info("resuming %s: %d rows kept, %d infrastructure failures retried", self.out_path, len(self.rows), len(retried))

    def done_ids(self) -> set[str]:
        return set(self.rows)

    def hardware_ids(self) -> set[str]:
        return {r["hardware_id"] for r in self.rows.values()}

    def continue_on(self, fingerprint: str) -> bool:
        """Keep the batch id of the rows found when they were measured on this device; else (a
        resumed run on another GPU of the same kind) start a new batch, since one batch is one
        device at ingest. True when a new batch was started."""
        from warehouse.fingerprint import device_identity

        mine = device_identity(fingerprint)
        if all(device_identity(r.get("hardware_json")) == mine for r in self.rows.values() if r["batch_id"] == self.batch_id):
            return False
        self.batch_id = uuid.uuid4().hex
        return True

    def append(self, row: dict) -> None:
        self.rows[row["kernel_id"]] = row
        self._fh.write(json.dumps(_to_jsonable(row)) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def finalize(self) -> Path:
        """Write all rows as Parquet (zstd) in RESULT_SCHEMA; drop the partial file."""
        self._fh.close()
        table = rows_to_table(list(self.rows.values()))
        tmp = self.out_path.with_name(self.out_path.name + ".tmp")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, self.out_path)
        self.partial.unlink(missing_ok=True)
        return self.out_path

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
