"""Running a selection of the asset graph in process and reading what happened, for the
orchestration and surrogate-asset tests. Not a test module (no test_ prefix)."""

from __future__ import annotations

import dagster as dg


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
