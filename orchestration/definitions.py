"""The Dagster code location: every stage's `defs` merged with resources, jobs, schedules,
sensors and the automation conditions. `workspace.yaml` points here; `kernelcast run` and the
tests build the same thing. orchestration/k8s.py builds the same graph for a Kubernetes cluster.
"""

from __future__ import annotations

import dagster as dg

from orchestration.resources import build_resources
from orchestration.settings import Settings, load_settings


def stage_defs() -> list[dg.Definitions]:
    """Each stage module ends in a small `defs`; new stages are added here once."""
    from assets import (
        cross_hardware,
        curation,
        evaluation,
        generation,
        profiling,
        promotion,
        tasks,
        training,
    )
    from assets import search as search_stage

    return [tasks.defs, generation.defs, profiling.defs, curation.defs, training.defs, evaluation.defs,
            promotion.defs, search_stage.defs, cross_hardware.defs]


def build_defs(settings: Settings | None = None, executor: dg.ExecutorDefinition | None = None,
               pin_gpu_per_step: bool = True,
               resources: dict[str, dg.ConfigurableResource] | None = None) -> dg.Definitions:
    """The code location for one profile.

    Args:
        settings: the resolved settings (default: from $KERNELCAST_PROFILE / $KERNELCAST_HOME).
        executor: the executor of every job (default: Dagster's multiprocess-or-in-process).
        pin_gpu_per_step: measuring steps pin their GPU (one host); False where each step's
            pod holds its own GPU (Kubernetes).
        resources: resources that replace the profile's by key (a test's `recorded` profiler,
            a GPU host's LLM backend).
    Returns:
        The Definitions: assets, checks, jobs, the nightly schedule, the inbox sensor and the
        automation sensor.
    """
    from orchestration import schedules, sensors
    from orchestration.automation import with_automation

    settings = settings or load_settings()
    resources = dg.Definitions(resources={**build_resources(settings, pin_gpu_per_step=pin_gpu_per_step),
                                          **(resources or {})})
    # Conditions go on the asset specs before any job is built over them (selecting assets
    # resolves the definitions, which needs their resources).
    assets = with_automation(dg.Definitions.merge(*stage_defs(), resources))
    return dg.Definitions.merge(assets, schedules.defs, sensors.defs, dg.Definitions(executor=executor))


@dg.definitions
def defs() -> dg.Definitions:
    """Loaded lazily, so the profile and home are read from the environment of the process
    that loads the code location (`dagster dev`, a run worker, a step subprocess)."""
    return build_defs()
