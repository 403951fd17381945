"""The same code location on a Kubernetes cluster: every step a pod, GPU steps one GPU each.

    dagster definitions validate -m orchestration.k8s        # what CI checks, beside -w workspace.yaml

The graph, jobs, schedules, sensors and automation are those of orchestration/definitions.py;
only where steps run differs. The k8s_job_executor starts one pod per step in the run's
namespace, from the image the run launcher started the run in (deploy/k8s/dagster.yaml holds the
instance side: K8sRunLauncher, Postgres storage, the duckdb_writer pool limited to 1):

- `kernel_measurements.measure_shard[gpu_i]` steps request one GPU each (op tags, assets/profiling.py)
  and pin nothing (`pin_gpu_per_step=False`: a pod sees its own GPU as device 0). How many run
  side by side is `KERNELCAST_GPUS`: the plan step splits the unmeasured kernels into that many
  shards, one pod each.
- `forecasts.forecast_llm_shard[gpu_i]` steps (the language models' forward passes over one
  shard of pairs) request one GPU each the same way; the plan and store steps around them need none.
- `surrogate_model` requests one GPU (`per_step_k8s_config` below); training across several
  GPUs goes through accelerate (docs/architecture.md, "Scale beyond one machine").
- $KERNELCAST_HOME (the DuckDB file, MLflow's store, reports) is a ReadWriteMany volume mounted in
  every pod; DuckDB's one-writer rule holds through the pool, as on one host.
"""

from __future__ import annotations

import dagster as dg
from dagster_k8s import k8s_job_executor

from orchestration.definitions import build_defs

HOME_MOUNT = "/kernelcast"
ONE_GPU = {"container_config": {"resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}}

EXECUTOR = k8s_job_executor.configured(
    {
        "env_vars": [f"KERNELCAST_HOME={HOME_MOUNT}", "KERNELCAST_PROFILE=gpu", "KERNELCAST_GPUS",
                     "DAGSTER_HOME=/opt/dagster/dagster_home"],
        "volumes": [{"name": "kernelcast-home", "persistentVolumeClaim": {"claimName": "kernelcast-home"}}],
        "volume_mounts": [{"name": "kernelcast-home", "mountPath": HOME_MOUNT}],
        # Steps without a GPU of their own: CPU and memory for curation, reports, ingest.
        "step_k8s_config": {"container_config": {"resources": {"requests": {"cpu": "2", "memory": "8Gi"}}}},
        "per_step_k8s_config": {"surrogate_model": ONE_GPU},
    },
    name="kernelcast_k8s_executor",
)


@dg.definitions
def defs() -> dg.Definitions:
    """The code location for a cluster (loaded in every pod, settings from its environment)."""
    return build_defs(executor=EXECUTOR, pin_gpu_per_step=False)
