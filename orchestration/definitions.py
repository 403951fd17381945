"""The Dagster code location: every stage's `defs` merged with resources, jobs, schedules and
sensors. `workspace.yaml` points here; `kernelcast run` and the tests build the same thing.
"""

from __future__ import annotations

import dagster as dg

from orchestration.resources import build_resources
from orchestration.settings import Settings, load_settings


def stage_defs() -> list[dg.Definitions]:
    """Each stage module ends in a small `defs`; new stages are added here once."""
    from assets import curation, evaluation, generation, profiling, promotion, tasks, training
    from assets import search as search_stage
    from orchestration import sensors

    return [tasks.defs, generation.defs, profiling.defs, curation.defs, training.defs, evaluation.defs,
            promotion.defs, sensors.defs, search_stage.defs]


def build_defs(settings: Settings | None = None) -> dg.Definitions:
    settings = settings or load_settings()
    merged = dg.Definitions.merge(*stage_defs())
    all_assets = dg.AssetSelection.all()
    full_graph_job = dg.define_asset_job(
        "full_graph_job",
        selection=all_assets,
        description="Materialise the whole graph (what `kernelcast run` does).",
        tags={"kernelcast/profile": settings.profile},
    )
    nightly = dg.ScheduleDefinition(
        name="nightly_schedule",
        job=full_graph_job,
        cron_schedule="0 3 * * *",
        description="Rebuild the whole graph every night at 03:00.",
    )
    return dg.Definitions.merge(
        merged,
        dg.Definitions(
            jobs=[full_graph_job],
            schedules=[nightly],
            resources=build_resources(settings),
        ),
    )


defs = build_defs()
