"""measurement_inbox_sensor: new result files in $KERNELCAST_HOME/inbox -> one ingest run each.

A file is new when its content (sha256) is neither in the cursor nor in the warehouse's
`ingested_files`, so a batch is ingested once whatever its name, and copying it in again (or
ingesting it with `kernelcast ingest` first) requests nothing. A new hardware type adds its
partition (`dynamic_partitions_requests`) in the same tick. What comes after the measurements
is not this sensor's business: the downstream assets carry an automation condition
(orchestration/automation.py) that requests them once the ingest run has materialised.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg

from orchestration.partitions import HARDWARE_PARTITIONS, hardware_of_file
from orchestration.resources import SettingsResource, WarehouseResource
from orchestration.schedules import measurement_ingest_job


def _inbox_files(inbox: Path) -> list[Path]:
    return sorted(p for p in inbox.rglob("*.parquet") if p.is_file()) if inbox.exists() else []


def _digests(files: list[Path], seen: dict[str, list]) -> dict[str, str]:
    """path -> sha256, hashing only files whose (size, mtime) changed since the cursor."""
    from warehouse.inbox import file_sha256

    out = {}
    for f in files:
        stat = f.stat()
        known = seen.get(str(f))
        if known and known[:2] == [stat.st_size, stat.st_mtime_ns]:
            out[str(f)] = known[2]
        else:
            out[str(f)] = file_sha256(f)
    return out


@dg.sensor(job=measurement_ingest_job, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING)
def measurement_inbox_sensor(context: dg.SensorEvaluationContext, settings: SettingsResource,
                             warehouse: WarehouseResource):
    """Watches $KERNELCAST_HOME/inbox for measurement result files (Parquet): one ingest run per
    hardware type with new content, its partition added first when the type is new."""
    from warehouse.errors import WarehouseError, WarehouseLockedError
    from warehouse.inbox import already_ingested

    cfg = settings.get()
    seen: dict[str, list] = json.loads(context.cursor) if context.cursor else {}
    files = _inbox_files(cfg.inbox)
    if not files:
        return dg.SkipReason(f"no result files in {cfg.inbox}")
    digests = _digests(files, seen)
    known = {entry[2] for entry in seen.values()}
    fresh = {path: sha for path, sha in digests.items() if sha not in known}
    if fresh and Path(warehouse.path).exists():
        try:
            with warehouse.connect(read_only=True) as con:
                done = already_ingested(con, fresh.values())
        except WarehouseLockedError:
            return dg.SkipReason("the warehouse is being written; looking again next tick")
        except WarehouseError as exc:  # e.g. a schema that needs a migration: the ingest run applies it
            context.log.info(f"ingested files not readable ({exc}); treating every file as new")
            done = set()
        fresh = {path: sha for path, sha in fresh.items() if sha not in done}
    by_hardware: dict[str, list[tuple[str, str]]] = {}
    for path, sha in sorted(fresh.items()):
        hw = hardware_of_file(Path(path))
        if hw is None:  # a kernels file: every partition's ingest picks it up with its results
            context.log.info(f"{Path(path).name}: kernels (or unreadable), ingested with the next results file")
            continue
        by_hardware.setdefault(hw, []).append((path, sha))
    # Every file seen goes into the cursor: requested now, ingested before, or a kernels file
    # (which the ingest of any partition reads from the inbox with its results).
    stats = {str(f): f.stat() for f in files}
    cursor = {p: [stats[p].st_size, stats[p].st_mtime_ns, sha] for p, sha in digests.items()}
    context.update_cursor(json.dumps(cursor, sort_keys=True))
    if not by_hardware:
        return dg.SkipReason("no new measurement content in the inbox")
    existing = set(context.instance.get_dynamic_partitions(HARDWARE_PARTITIONS.name))
    new_partitions = sorted(set(by_hardware) - existing)
    requests = [
        dg.RunRequest(
            run_key=f"inbox-{hw}-" + "-".join(sha[:12] for _, sha in entries),
            partition_key=hw,
            tags={"kernelcast/inbox_files": ",".join(Path(p).name for p, _ in entries)[:200]},
        )
        for hw, entries in sorted(by_hardware.items())
    ]
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[HARDWARE_PARTITIONS.build_add_request(new_partitions)] if new_partitions else [],
    )


defs = dg.Definitions(sensors=[measurement_inbox_sensor])
