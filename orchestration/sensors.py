"""measurement_inbox_sensor: new result files in $KERNELCAST_HOME/inbox -> ingest + downstream.

The cursor maps each file to its (size, mtime); a new or changed file adds its hardware
partition if needed and requests a run of that partition of kernel_measurements. Once the
measurements land, `downstream_after_measurements_sensor` requests the rest of the graph.
"""


import json

import dagster as dg

from orchestration.partitions import HARDWARE_PARTITIONS, hardware_of_file
from orchestration.settings import load_settings

measurement_ingest_job = dg.define_asset_job(
    "measurement_ingest_job",
    selection=dg.AssetSelection.assets("kernel_measurements"),
    partitions_def=HARDWARE_PARTITIONS,
    description="Ingest (and on a GPU host, measure) one hardware partition.",
)

downstream_job = dg.define_asset_job(
    "downstream_job",
    selection=dg.AssetSelection.assets("kernel_measurements").downstream() - dg.AssetSelection.assets("kernel_measurements"),
    description="Curation, forecasts and reports after new measurements.",
)


@dg.sensor(job=measurement_ingest_job, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING)
def measurement_inbox_sensor(context: dg.SensorEvaluationContext):
    """Watches $KERNELCAST_HOME/inbox for measurement result files (Parquet)."""
    inbox = load_settings().inbox
    seen: dict[str, list] = json.loads(context.cursor) if context.cursor else {}
    files = sorted(p for p in inbox.glob("*.parquet") if p.is_file()) if inbox.exists() else []
    if not files:
        return dg.SkipReason(f"no result files in {inbox}")
    new_partitions, requests = set(), []
    existing = set(context.instance.get_dynamic_partitions(HARDWARE_PARTITIONS.name))
    for f in files:
        stat = f.stat()
        version = [stat.st_size, stat.st_mtime]
        if seen.get(str(f)) == version:
            continue
        seen[str(f)] = version
        hw = hardware_of_file(f)
        if hw is None:
            context.log.warning(f"{f.name}: not a single-hardware result file; `kernelcast ingest` says why")
            continue
        if hw not in existing:
            new_partitions.add(hw)
        requests.append(dg.RunRequest(run_key=f"{f}:{stat.st_size}:{stat.st_mtime}", partition_key=hw,
                                      tags={"kernelcast/inbox_file": f.name}))
    context.update_cursor(json.dumps(seen))
    if not requests:
        return dg.SkipReason("no new or changed result files")
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[HARDWARE_PARTITIONS.build_add_request(sorted(new_partitions))] if new_partitions else [],
    )


@dg.asset_sensor(asset_key=dg.AssetKey("kernel_measurements"), job=downstream_job,
                 default_status=dg.DefaultSensorStatus.RUNNING)
def downstream_after_measurements_sensor(context: dg.SensorEvaluationContext, asset_event: dg.EventLogEntry):
    """New measurements -> rebuild curation, forecasts and reports (the downstream backfill)."""
    return dg.RunRequest(run_key=str(asset_event.storage_id))


defs = dg.Definitions(jobs=[measurement_ingest_job, downstream_job],
                      sensors=[measurement_inbox_sensor, downstream_after_measurements_sensor])
