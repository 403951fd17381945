"""`kernelcast run`: materialise the whole graph into $KERNELCAST_HOME, in-process.

Runs are recorded in the Dagster instance under $KERNELCAST_HOME/dagster, so the UI shows them.
Partitioned assets (measurements per hardware) are materialised once per known partition.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import dagster as dg

from orchestration.settings import Settings

log = logging.getLogger(__name__)

DAGSTER_YAML = """\
# Written by kernelcast. DuckDB allows one writer per file: assets that write share one pool.
concurrency:
  pools:
    default_limit: 1
telemetry:
  enabled: false
"""


def prepare_home(settings: Settings) -> None:
    """Create $KERNELCAST_HOME and point Dagster at it (idempotent)."""
    for d in (settings.home, settings.dagster_home, settings.inbox, settings.reports_dir, settings.mlflow_artifacts):
        d.mkdir(parents=True, exist_ok=True)
    cfg = settings.dagster_home / "dagster.yaml"
    if not cfg.exists() or cfg.read_text() != DAGSTER_YAML:
        cfg.write_text(DAGSTER_YAML)
    os.environ["DAGSTER_HOME"] = str(settings.dagster_home)
    os.environ["KERNELCAST_HOME"] = str(settings.home)
    os.environ["KERNELCAST_PROFILE"] = settings.profile


@dataclass
class StepResult:
    label: str
    success: bool
    materialized: list[str]
    checks_failed: list[str]  # ERROR severity: the run fails
    checks_warned: list[str]  # WARN severity: reported, the run goes on
    # Promotion gates that failed: the challenger is held back (model_promotion does not run).
    # That is the gates doing their job, not a failure of the run.
    promotion_held: list[str] = field(default_factory=list)


def _run_selection(defs: dg.Definitions, instance: dg.DagsterInstance, selection: dg.AssetSelection,
                   partition_key: str | None, label: str) -> StepResult:
    job = dg.define_asset_job(f"kernelcast_run_{label}", selection=selection)
    resolved = dg.Definitions.merge(defs, dg.Definitions(jobs=[job])).resolve_job_def(job.name)
    # Quiet console: the UI keeps the full event log; the CLI prints one line per step.
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    result = resolved.execute_in_process(instance=instance, partition_key=partition_key, raise_on_error=False,
                                         run_config=quiet)
    mats = [
        e.asset_key.to_user_string()
        for e in result.get_asset_materialization_events()
        if e.asset_key is not None
    ] if hasattr(result, "get_asset_materialization_events") else []
    evaluations = [ev.event_specific_data for ev in result.all_events if ev.event_type_value == "ASSET_CHECK_EVALUATION"]
    from assets.promotion import PROMOTION_GATES

    failed = [e.check_name for e in evaluations if not e.passed and e.severity == dg.AssetCheckSeverity.ERROR]
    warned = [e.check_name for e in evaluations if not e.passed and e.severity != dg.AssetCheckSeverity.ERROR]
    held = [c for c in failed if c in PROMOTION_GATES]
    failed = [c for c in failed if c not in PROMOTION_GATES]
    success = result.success
    if not success and held and not failed:
        # A failed blocking check fails its step (Dagster raises DagsterAssetCheckFailedError);
        # when that is the only kind of step failure and only gates failed, the run did its job.
        failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
        success = all(
            getattr(getattr(e.event_specific_data, "error", None), "cls_name", "") == "DagsterAssetCheckFailedError"
            for e in failures
        )
    return StepResult(label, success, mats, failed, warned, held)


def run_graph(settings: Settings, defs: dg.Definitions | None = None) -> list[StepResult]:
    """Materialise every asset: unpartitioned ones, then each known partition of the rest."""
    from orchestration.definitions import build_defs
    from orchestration.partitions import HARDWARE_PARTITIONS, discover_hardware_partitions

    prepare_home(settings)
    defs = defs or build_defs(settings)
    instance = dg.DagsterInstance.get()
    repo = defs.get_repository_def()
    graph = repo.asset_graph
    partitioned = {k for k in graph.materializable_asset_keys if graph.get(k).partitions_def is not None}
    unpartitioned = set(graph.materializable_asset_keys) - partitioned

    steps: list[StepResult] = []
    if not partitioned:
        steps.append(_run_selection(defs, instance, dg.AssetSelection.assets(*unpartitioned), None, "all"))
        return steps
    # Upstream of the partitioned assets first, then each partition, then everything downstream.
    upstream = dg.AssetSelection.assets(*partitioned).upstream() - dg.AssetSelection.assets(*partitioned)
    steps.append(_run_selection(defs, instance, upstream, None, "upstream"))
    keys = discover_hardware_partitions(settings)
    existing = set(instance.get_dynamic_partitions(HARDWARE_PARTITIONS.name))
    new = [k for k in keys if k not in existing]
    if new:
        instance.add_dynamic_partitions(HARDWARE_PARTITIONS.name, new)
    for key in keys:
        steps.append(_run_selection(defs, instance, dg.AssetSelection.assets(*partitioned), key, f"hw_{key}".replace("-", "_")))
    downstream = dg.AssetSelection.assets(*partitioned).downstream() - dg.AssetSelection.assets(*partitioned)
    rest = dg.AssetSelection.assets(*unpartitioned) - upstream
    steps.append(_run_selection(defs, instance, downstream | rest, None, "downstream"))
    return steps
