"""The jobs of the code location, and the nightly schedule beside the job it runs.

    candidates_job          kernel tasks and generated candidates (nothing partitioned)
    measurement_ingest_job  kernel_measurements of one hardware partition (ingest + GPU fan-out)
    downstream_job          everything after the measurements: curation, the base model, training,
                            forecasts, reports, promotion
    full_graph_job          all of it for one hardware partition (what nightly_schedule runs)

`kernelcast run` runs the first three in turn on the same instance as `dagster dev`, so each of
its runs is one of these jobs and can be re-executed from the UI.
"""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg

from orchestration.partitions import HARDWARE_PARTITIONS

MEASUREMENTS = dg.AssetSelection.assets("kernel_measurements")
UPSTREAM = MEASUREMENTS.upstream() - MEASUREMENTS
DOWNSTREAM = dg.AssetSelection.all() - MEASUREMENTS.upstream()
NIGHTLY_CRON = "0 3 * * *"

candidates_job = dg.define_asset_job(
    "candidates_job", selection=UPSTREAM,
    description="Kernel tasks and generated candidate kernels (everything the measurements depend on).",
)
measurement_ingest_job = dg.define_asset_job(
    "measurement_ingest_job", selection=MEASUREMENTS,
    description="Ingest (and on a GPU host of this type, measure: one step per GPU) one hardware partition.",
)
downstream_job = dg.define_asset_job(
    "downstream_job", selection=DOWNSTREAM,
    description="Curation, base model, surrogate training, forecasts, reports and promotion after new measurements.",
)
full_graph_job = dg.define_asset_job(
    "full_graph_job", selection=dg.AssetSelection.all(),
    description="The whole graph for one hardware partition (nightly_schedule runs one per partition).",
)


@dg.schedule(job=full_graph_job, cron_schedule=NIGHTLY_CRON, default_status=dg.DefaultScheduleStatus.RUNNING)
def nightly_schedule(context: dg.ScheduleEvaluationContext):
    """Rebuild the whole graph every night at 03:00: one run per known hardware partition."""
    partitions = sorted(context.instance.get_dynamic_partitions(HARDWARE_PARTITIONS.name))
    if not partitions:
        return dg.SkipReason("no hardware partitions yet: run `kernelcast run` or drop results into the inbox")
    day = _tick_time(context).strftime("%Y-%m-%d")
    return [dg.RunRequest(run_key=f"nightly-{day}-{hw}", partition_key=hw) for hw in partitions]


def _tick_time(context: dg.ScheduleEvaluationContext) -> datetime:
    """The tick's scheduled time; now for a tick evaluated by hand (the UI's "test schedule")."""
    from dagster_shared.check import CheckError

    try:
        return context.scheduled_execution_time
    except CheckError:
        return datetime.now(UTC)


defs = dg.Definitions(jobs=[candidates_job, measurement_ingest_job, downstream_job, full_graph_job],
                      schedules=[nightly_schedule])
