"""Declarative automation: what reacts to new measurements, evaluated by one sensor.

Every asset downstream of `kernel_measurements` carries `after_upstream_updates()`: it is
requested when one of its dependencies was materialised by a run that did not also plan it (an
ingest run requested by the inbox sensor, a measurement run from the UI), once none of its
dependencies is missing or in progress. The assets of one tick go into one run, so a new
hardware partition's measurements bring curation, training, forecasts, reports and promotion
in a single downstream run. A run that materialises the whole graph (nightly_schedule, `kernelcast
run`) triggers nothing more.

Unlike `AutomationCondition.eager()` nothing is requested merely because it was never
materialised: on an empty instance (no hardware partition yet) eager would run curation over an
empty warehouse. `base_model`, which has no upstream, is built when found missing.
"""

from __future__ import annotations

import warnings

import dagster as dg

from orchestration.schedules import DOWNSTREAM, MEASUREMENTS

SENSOR_NAME = "downstream_automation_sensor"


def after_upstream_updates() -> dg.AutomationCondition:
    """A dependency updated (outside this asset's own run) and nothing upstream is missing or running."""
    return (
        dg.AutomationCondition.any_deps_updated().since_last_handled()
        & ~dg.AutomationCondition.any_deps_missing()
        & ~dg.AutomationCondition.any_deps_in_progress()
        & ~dg.AutomationCondition.in_progress()
    ).with_label("after_upstream_updates")


def built_when_missing() -> dg.AutomationCondition:
    """Requested on the tick it is found missing (the first tick included), once: a failed
    build is not retried every tick. (`on_missing` ignores what was missing before the first
    tick, so on a fresh instance the base model, and all that needs it, would wait forever.)"""
    return (dg.AutomationCondition.missing().newly_true() & ~dg.AutomationCondition.in_progress()).with_label(
        "built_when_missing")


AUTOMATED = DOWNSTREAM
REACTING = MEASUREMENTS.downstream() - MEASUREMENTS
BUILT_WHEN_MISSING = DOWNSTREAM - REACTING  # base_model: no upstream of its own


def with_automation(defs: dg.Definitions) -> dg.Definitions:
    """`defs` with the conditions above on the downstream assets and the sensor evaluating them."""
    with warnings.catch_warnings():  # map_resolved_asset_specs is marked preview in Dagster 1.13
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return _with_automation(defs)


def _with_automation(defs: dg.Definitions) -> dg.Definitions:
    defs = defs.map_resolved_asset_specs(
        func=lambda spec: spec.replace_attributes(automation_condition=after_upstream_updates()),
        selection=REACTING,
    ).map_resolved_asset_specs(
        func=lambda spec: spec.replace_attributes(automation_condition=built_when_missing()),
        selection=BUILT_WHEN_MISSING,
    )
    sensor = dg.AutomationConditionSensorDefinition(
        SENSOR_NAME, target=AUTOMATED, default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=30,
        description="Requests the assets downstream of kernel_measurements after new measurements land.",
    )
    return dg.Definitions.merge(defs, dg.Definitions(sensors=[sensor]))
