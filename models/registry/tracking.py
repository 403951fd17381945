"""MLflow tracking of training and evaluation, as MLflow users expect it.

Training: the run is opened before the first step (params, tags, the dataset as an input), the
trainer's logs are streamed into it step by step (`models.training.callbacks.MlflowMetricsCallback`: live curves in the
UI while GRPO runs), and it is closed with the final metrics and the measurement ids. TRL's own
MLflow callback is not used (report_to="none"): it logs to whatever run is active in the
process, while here every call names its run and tracking URI.

Evaluation: one run per dataset version; each forecaster's scores are logged under its own name,
`<forecaster>/<metric>` on the in-distribution split (`surrogate-3/brier`, `baseline-uniform/nll`)
and `<split>/<forecaster>/<metric>` on the others, and against its model
(`mlflow.log_metrics(..., model_id=...)`): a registered version's LoggedModel, or, for the
reference forecasters (uniform, bin prior, oracle), an external LoggedModel of that name. A plain
`brier` at run level would be whichever forecaster was logged last. Every forecaster scored is a
model input of the run (its "Logged models": the registered versions and the reference
forecasters' stand-ins), as the eval pairs are its dataset.

The store moves with its home: the project's experiments keep their artifacts at
`kernelcast-home:/mlartifacts`, a location MLflow resolves through the artifact repository plugin
of models.registry.home_artifacts against the folder of the sqlite store in use, not an absolute
path written once. A copied or moved `$KERNELCAST_HOME` therefore reads and writes only its own
artifacts, and nothing here writes to MLflow's tables but MLflow itself.

This module never imports dagster; the tracking URI is a plain string.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from models.registry import HELD_OUT_MODEL, HOME_ARTIFACT_ROOT, SURROGATE_MODEL

log = logging.getLogger(__name__)

EVAL_METRICS = ("n", "brier", "crps", "nll", "accuracy", "ece", "aurc", "recovered_mean", "recovered_at_10",
                "within_20", "parse_rate")
SPLIT_METRICS = ("n", "brier", "nll", "ece", "accuracy", "recovered_mean")  # of the splits beside in_distribution
MAIN_SPLIT = "in_distribution"
_SKIP_KEYS = ("step", "epoch")


# The MLflow UI's port, set by `kernelcast ui --mlflow-port` for every process it starts; links
# to runs are built from it (run_url), so they follow the port the UI really listens on.
MLFLOW_PORT_ENV = "KERNELCAST_MLFLOW_PORT"
DEFAULT_MLFLOW_PORT = 5000


def tracking_client(tracking_uri: str):
    import mlflow
    from mlflow import MlflowClient

    open_store(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    return MlflowClient(tracking_uri)


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a `sqlite:///` tracking URI, None for any other store.

    >>> str(sqlite_path("sqlite:////tmp/home/mlflow.db"))
    '/tmp/home/mlflow.db'
    >>> sqlite_path("http://127.0.0.1:5000") is None
    True
    """
    return Path(tracking_uri[len("sqlite:///"):]) if tracking_uri.startswith("sqlite:///") else None


def artifact_root(tracking_uri: str) -> str | None:
    """The artifact location the project's experiments are created with: for a sqlite store
    `kernelcast-home:/mlartifacts`, i.e. `mlartifacts/` beside its database wherever it lies;
    None (MLflow's default) for any other store.

    >>> artifact_root("sqlite:////tmp/home/mlflow.db"), artifact_root("http://127.0.0.1:5000")
    ('kernelcast-home:/mlartifacts', None)
    """
    return HOME_ARTIFACT_ROOT if sqlite_path(tracking_uri) is not None else None


def create_store(tracking_uri: str) -> None:
    """Create the tables of a tracking store that has none: MLflow runs its schema migrations
    (some hundred of them) on a new store, 2-4 s on 2 cores. `kernelcast run` calls this in a
    child process on a new home, so they run beside its first jobs (orchestration.runner)."""
    from mlflow import MlflowClient

    open_store(tracking_uri)
    MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def open_store(tracking_uri: str) -> None:
    """Before a store is used in this process: MLflow knows the `kernelcast-home:` scheme its
    artifact locations use (models.registry.home_artifacts)."""
    from models.registry.home_artifacts import register

    register()


def mlflow_port() -> int:
    """The MLflow UI's port: $KERNELCAST_MLFLOW_PORT (set by `kernelcast ui`), else 5000."""
    value = os.environ.get(MLFLOW_PORT_ENV, "")
    return int(value) if value.isdigit() and 0 < int(value) < 65536 else DEFAULT_MLFLOW_PORT


def ui_base_url(port: int | None = None) -> str:
    return f"http://127.0.0.1:{port or mlflow_port()}"


ML_VIEW = "?workflowType=machine_learning"


def experiments_url(port: int | None = None) -> str:
    """The MLflow UI's experiment list in its classic-ML view (not the GenAI home page: the UI
    reads the view from the link's `workflowType`; a page opened without it shows the GenAI view
    unless the user switched views by hand, which the browser then remembers)."""
    return f"{ui_base_url(port)}/#/experiments{ML_VIEW}"


def experiment_url(experiment_id: str, port: int | None = None) -> str:
    """An experiment's runs in the MLflow UI, in the classic-ML view: the page `kernelcast ui`
    opens on (MLflow has no setting for its first page, which is a GenAI welcome page).

    >>> experiment_url("1", port=5123)
    'http://127.0.0.1:5123/#/experiments/1?workflowType=machine_learning'
    """
    return f"{ui_base_url(port)}/#/experiments/{experiment_id}{ML_VIEW}"


def run_url(run_id: str, experiment_id: str | None = None, port: int | None = None) -> str:
    """A link to a run in the MLflow UI on the port it serves on, in the classic-ML view (the UI
    reads the view from the link's `workflowType` on every page, else shows the GenAI one).

    >>> run_url("abc", "3", port=5123)
    'http://127.0.0.1:5123/#/experiments/3/runs/abc?workflowType=machine_learning'
    """
    if experiment_id is None:
        return f"{ui_base_url(port)}/#/runs/{run_id}{ML_VIEW}"
    return f"{ui_base_url(port)}/#/experiments/{experiment_id}/runs/{run_id}{ML_VIEW}"


def model_url(name: str, port: int | None = None) -> str:
    """A link to a registered model (its versions and aliases) in the classic-ML view.

    >>> model_url("kernelcast-surrogate", port=5123)
    'http://127.0.0.1:5123/#/models/kernelcast-surrogate?workflowType=machine_learning'
    """
    return f"{ui_base_url(port)}/#/models/{name}{ML_VIEW}"


def step_metrics(logs: Mapping[str, Any], step: int) -> list[Any]:
    """MLflow Metric entities of one trainer log line (finite numbers only).

    >>> [(m.key, m.value, m.step) for m in step_metrics({"loss": 0.5, "epoch": 1.0, "x": float("nan")}, 3)]
    [('loss', 0.5, 3)]
    """
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    return [Metric(k, float(v), now, int(step)) for k, v in logs.items()
            if k not in _SKIP_KEYS and isinstance(v, (int, float)) and math.isfinite(float(v))]


def mlflow_experiment(client: Any, tracking_uri: str, name: str) -> str:
    """The experiment id of `name`, created if missing. For a sqlite store its artifacts go
    beside the database file (not ./mlruns in whatever directory the process runs from); the
    store's empty "Default" experiment is retired once ours exists."""
    import mlflow

    open_store(tracking_uri)
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    mlflow.set_tracking_uri(tracking_uri)  # MLflow checks the new location without naming its store
    created = client.create_experiment(name, artifact_location=artifact_root(tracking_uri))
    retire_default_experiment(client)
    return created


PROJECT_EXPERIMENTS = ("kernelcast-training", "kernelcast-evaluation")


def prepare_store(tracking_uri: str, experiments: Sequence[str] = PROJECT_EXPERIMENTS) -> list[str]:
    """The store as the UI should first show it: the project's experiments exist (created
    beside the store when missing), artifact locations point into this home, no empty Default.

    Returns:
        The experiments' ids, in order.
    """
    client = tracking_client(tracking_uri)
    ids = [mlflow_experiment(client, tracking_uri, name) for name in experiments]
    retire_default_experiment(client)
    return ids


def retire_default_experiment(client: Any) -> bool:
    """Delete MLflow's "Default" experiment (id 0) while it holds no run: every run here names
    its experiment, and an empty Default is the first thing the UI would list. True if deleted."""
    from mlflow.entities import ViewType
    from mlflow.exceptions import MlflowException

    try:
        default = client.get_experiment("0")
        if default is None or default.lifecycle_stage != "active":
            return False
        if client.search_runs(["0"], max_results=1, run_view_type=ViewType.ALL):
            return False
        client.delete_experiment("0")
    except MlflowException as exc:
        log.info("Default experiment kept: %s", str(exc).splitlines()[0])
        return False
    return True


def _dataset_source_class():
    from mlflow.data.dataset_source import DatasetSource

    class _DuckDBSource(DatasetSource):
        """One table's rows of one dataset version in the kernelcast warehouse
        (`duckdb:pairs@<version>`, `duckdb:dataset_measurements@<version>`)."""

        def __init__(self, dataset_version: str, table: str = "pairs") -> None:
            self.dataset_version = dataset_version
            self.table = table

        @staticmethod
        def _get_source_type() -> str:
            return "duckdb"

        def load(self, **kwargs: Any) -> str:
            return self.uri

        @property
        def uri(self) -> str:
            return f"duckdb:{self.table}@{self.dataset_version}"

        @staticmethod
        def _can_resolve(raw_source: Any) -> bool:
            return isinstance(raw_source, str) and raw_source.startswith("duckdb:") and "@" in raw_source

        @classmethod
        def _resolve(cls, raw_source: Any) -> _DuckDBSource:
            table, version = str(raw_source).removeprefix("duckdb:").split("@", 1)
            return cls(version, table)

        def to_dict(self) -> dict[str, Any]:
            return {"uri": self.uri}

        @classmethod
        def from_dict(cls, source_dict: dict[Any, Any]) -> _DuckDBSource:
            return cls._resolve(source_dict["uri"])

    return _DuckDBSource


def DuckDBPairsSource(dataset_version: str, table: str = "pairs") -> Any:  # noqa: N802 - reads as a class at call sites
    """An MLflow dataset source naming `duckdb:<table>@<dataset_version>` (default the pairs)."""
    return _dataset_source_class()(dataset_version, table)


def pairs_dataset(pair_ids: Sequence[str], true_bins: Sequence[int], dataset_version: str, split: str):
    """An MLflow dataset of the pairs of one split of a dataset version (the pairs table in DuckDB)."""
    import mlflow
    import pandas as pd

    frame = pd.DataFrame({"pair_id": list(pair_ids), "true_bin": list(true_bins)})
    name = dataset_version if split == "train" else f"{dataset_version}-{split}"
    # MLflow stores at most 36 characters of a digest.
    return mlflow.data.from_pandas(frame, source=DuckDBPairsSource(dataset_version), name=name,
                                   digest=(f"duckdb:pairs@{dataset_version}" + ("" if split == "train" else f":{split}"))[:36])


def measurements_dataset(measurement_ids: Sequence[str], dataset_version: str):
    """An MLflow dataset of the measurements behind a dataset version (DuckDB
    `dataset_measurements`): what a training run learned from when its pairs are not at hand."""
    import mlflow
    import pandas as pd

    frame = pd.DataFrame({"measurement_id": list(measurement_ids)}, dtype=str)
    return mlflow.data.from_pandas(frame, source=DuckDBPairsSource(dataset_version, "dataset_measurements"),
                                   name=dataset_version, digest=f"duckdb:dataset_measurements@{dataset_version}"[:36])


TRAINED_TAG = "trained_dataset_version"  # the dataset version a fit used (run and version tag)
HELD_TAG = "trained_dataset_held"  # "false": the warehouse that registered it does not hold it


def log_training_data(
    tracking_uri: str,
    run_id: str,
    dataset_version: str,
    measurement_ids: Sequence[str] | None,
    pairs: Any = None,
    held: bool = True,
    calibration_measurement_ids: Sequence[str] | None = None,
) -> None:
    """What a training run learned from: its dataset as an MLflow input (context "training";
    source and digest name the DuckDB table and version), the measurement ids as the artifacts
    `measurement_ids.txt` (its fit) and `calibration_measurement_ids.txt` (its calibration),
    and the tags `trained_dataset_version` (+ `trained_dataset_held`).

    Args:
        tracking_uri: MLflow tracking URI.
        run_id: the training run (any status).
        dataset_version: the dataset version its fit used.
        measurement_ids: the measurements behind its fit pairs
            (warehouse.datasets.pair_measurement_ids); None when not known here (a version
            trained elsewhere on a dataset this warehouse no longer holds): no artifact.
        pairs: its training pairs (a frame with pair_id and true_bin) when at hand; else the
            measurements are the logged dataset.
        held: whether this warehouse holds that dataset version.
        calibration_measurement_ids: the measurements behind its calibration pairs; None: no
            separate calibration (no artifact).
    """
    from mlflow.entities import DatasetInput, InputTag, RunTag

    client = tracking_client(tracking_uri)
    if pairs is not None and len(pairs):
        dataset = pairs_dataset(list(pairs["pair_id"]), [int(b) for b in pairs["true_bin"]], dataset_version, "train")
    else:
        dataset = measurements_dataset(list(measurement_ids or []), dataset_version)
    client.log_inputs(run_id, datasets=[DatasetInput(dataset._to_mlflow_entity(),
                                                     tags=[InputTag("mlflow.data.context", "training")])])
    client.log_batch(run_id, tags=[RunTag(TRAINED_TAG, dataset_version), RunTag(HELD_TAG, str(held).lower())])
    if measurement_ids is not None:
        client.log_text(run_id, "".join(f"{m}\n" for m in measurement_ids), "measurement_ids.txt")
    if calibration_measurement_ids is not None:
        client.log_text(run_id, "".join(f"{m}\n" for m in calibration_measurement_ids),
                        "calibration_measurement_ids.txt")


def start_training_run(
    tracking_uri: str,
    experiment: str,
    params: Mapping[str, str],
    tags: Mapping[str, str],
    rows: Sequence[Mapping[str, Any]],
    dataset_version: str | None,
    run_name: str = "grpo",
) -> str:
    """Open the training run (status RUNNING) with params, tags and the training pairs as input.

    Args:
        tracking_uri: MLflow tracking URI.
        experiment: experiment name (created beside the store when missing).
        params: the resolved settings, flat strings.
        tags: run tags (dataset_version, base_model, git_commit, dagster_run_id, ...).
        rows: training rows (pair_id, true_bin), logged as the dataset input.
        dataset_version: the warehouse dataset version the rows come from.
        run_name: the run's name.
    Returns:
        The run id.
    """
    from mlflow.entities import DatasetInput, InputTag, Param, RunTag

    client = tracking_client(tracking_uri)
    run = client.create_run(mlflow_experiment(client, tracking_uri, experiment), tags=dict(tags), run_name=run_name)
    run_id = run.info.run_id
    try:
        client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()],
                         tags=[RunTag("kernelcast.stage", "training"),
                               RunTag(TRAINED_TAG, dataset_version or "unversioned")])
        dataset = pairs_dataset([r["pair_id"] for r in rows], [r["true_bin"] for r in rows],
                                dataset_version or "unversioned", "train")
        # Through the client: `mlflow.start_run(run_id=...)` would end the run on leaving it,
        # and the run must stay RUNNING while the trainer streams into it.
        client.log_inputs(run_id, datasets=[DatasetInput(dataset._to_mlflow_entity(),
                                                         tags=[InputTag("mlflow.data.context", "training")])])
    except Exception:
        client.set_terminated(run_id, "FAILED")
        raise
    return run_id


def log_sft_losses(tracking_uri: str, run_id: str, sft_losses: Sequence[float]) -> None:
    """The format warm-up's per-step losses as the curve `sft/loss`."""
    from mlflow.entities import Metric

    batch = [Metric("sft/loss", float(v), 0, i) for i, v in enumerate(sft_losses) if math.isfinite(v)]
    for start in range(0, len(batch), 900):  # MLflow accepts at most 1000 metrics per batch
        tracking_client(tracking_uri).log_batch(run_id, metrics=batch[start : start + 900])


def finish_training_run(
    tracking_uri: str,
    run_id: str,
    metrics: Mapping[str, float],
    measurement_ids: Sequence[str] | None,
    status: str = "FINISHED",
) -> None:
    """Close the run: final metrics (at step 0), the measurement ids artifact, the status."""
    from mlflow.entities import Metric

    client = tracking_client(tracking_uri)
    final = [Metric(k, float(v), 0, 0) for k, v in metrics.items() if math.isfinite(float(v))]
    if final:
        client.log_batch(run_id, metrics=final)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "measurement_ids.txt"
        path.write_text("".join(f"{m}\n" for m in (measurement_ids or [])))
        client.log_artifact(run_id, str(path))
    client.set_terminated(run_id, status)


def metric_prefix(model_ref: str, split: str = MAIN_SPLIT) -> str:
    """The name a forecaster's metrics are logged under in the evaluation run (MLflow keys allow
    letters, digits, `_ - . / :` and spaces; slashes group them in the UI).

    >>> metric_prefix("models:/kernelcast-surrogate/3"), metric_prefix("baseline:uniform|held_out_task", "held_out_task")
    ('surrogate-3', 'held_out_task/baseline-uniform')
    >>> metric_prefix("models:/kernelcast-surrogate-held-out/2", "held_out_style:pytorch-programs")
    'held_out_style-pytorch-programs/held-out-2'
    """
    name = model_ref.split("|")[0].replace(f"models:/{HELD_OUT_MODEL}/", "held-out-").replace(
        f"models:/{SURROGATE_MODEL}/", "surrogate-").replace("models:/", "").replace(":", "-").replace("/", "-")
    return name if split == MAIN_SPLIT else f"{split.replace(':', '-')}/{name}"


def evaluation_metrics(results: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, float]]:
    """model_ref -> {metric key: value} of every split's finite scores, keys as `metric_prefix`.

    >>> evaluation_metrics({"in_distribution": {"baseline:uniform": {"brier": 0.4375, "n": 8}},
    ...                     "external": {"baseline:uniform": {"brier": 0.43, "crps": 0.2}}})
    {'baseline:uniform': {'baseline-uniform/n': 8.0, 'baseline-uniform/brier': 0.4375, 'external/baseline-uniform/brier': 0.43}}
    """
    out: dict[str, dict[str, float]] = {}
    for split, by_model in results.items():
        for ref, r in by_model.items():
            prefix = metric_prefix(ref, split)
            for k in (EVAL_METRICS if split == MAIN_SPLIT else SPLIT_METRICS):
                v = r.get(k)
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
                    out.setdefault(ref.split("|")[0], {})[f"{prefix}/{k}"] = float(v)
    return out


def log_evaluation(
    tracking_uri: str,
    experiment_id: str,
    results: Mapping[str, Mapping[str, Mapping[str, Any]]],
    dataset_version: str,
    eval_pairs: Sequence[str],
    eval_bins: Sequence[int],
    model_ids: Mapping[str, str],
    tags: Mapping[str, str],
    report_dir: str | Path | None = None,
) -> str:
    """One evaluation run; every forecaster's scores under its own name, logged against its model.

    Args:
        tracking_uri: MLflow tracking URI.
        experiment_id: the evaluation experiment.
        results: split -> forecaster (model_ref) -> its metrics (`pipelines.evaluation.suite.evaluate_models`).
        dataset_version: the dataset version evaluated.
        eval_pairs, eval_bins: the eval pairs (ids, true bins), logged as the run's dataset.
        model_ids: model_ref -> LoggedModel id of registered versions (each becomes an input of the
            run); any other forecaster gets an external LoggedModel named after it (created once,
            then re-used).
        tags: run tags (dagster_run_id, dataset_version, ...).
        report_dir: a folder logged as the artifact `report`.
    Returns:
        The run id.
    """
    import mlflow
    from mlflow.entities import LoggedModelInput

    client = tracking_client(tracking_uri)
    dataset = pairs_dataset(eval_pairs, eval_bins, dataset_version, "eval")
    with mlflow.start_run(experiment_id=experiment_id, run_name=f"evaluation-{dataset_version}") as run:
        mlflow.set_tags(dict(tags))
        mlflow.log_input(dataset, context="evaluation")
        scored = [mid for ref, mid in model_ids.items() if any(ref in {r.split("|")[0] for r in by_model}
                                                               for by_model in results.values())]
        if scored:
            client.log_inputs(run.info.run_id, models=[LoggedModelInput(mid) for mid in sorted(set(scored))])
        for ref, values in evaluation_metrics(results).items():
            model_id = model_ids.get(ref) or _external_model(experiment_id, ref)
            mlflow.log_metrics(values, model_id=model_id, dataset=dataset)
        if report_dir is not None:
            mlflow.log_artifacts(str(report_dir), artifact_path="report")
    return run.info.run_id


def log_cross_hardware(tracking_uri: str, experiment_id: str, dataset_version: str,
                       studies: Sequence[Mapping[str, Any]], report_dir: str | Path | None = None,
                       tags: Mapping[str, str] | None = None) -> str:
    """One run of the cross-hardware settings: per card, setting and forecaster its Brier (metric
    `<card>/<setting>/<forecaster>/brier`, `@` written `_at_`), per card the share of kernels in the
    same bin on both cards; the page's folder as the artifact `report`.

    Returns:
        The run id.
    """
    import mlflow

    tracking_client(tracking_uri)
    with mlflow.start_run(experiment_id=experiment_id, run_name=f"cross-hardware-{dataset_version}") as run:
        mlflow.set_tags({"dataset_version": dataset_version, "kind": "cross_hardware", **dict(tags or {})})
        values: dict[str, float] = {}
        for study in studies:
            card = str(study["hardware_id"])
            for setting, part in (study.get("settings") or {}).items():
                for forecaster, r in part.items():
                    b = r.get("brier")
                    if isinstance(b, (int, float)) and math.isfinite(float(b)):
                        key = f"{card}/{setting}/{forecaster}/brier".replace("@", "_at_").replace(":", "-")
                        values[key] = float(b)
            same = next((r["same"] for r in (study.get("agreement") or {}).get("rows", []) if r["task"] == "all"), None)
            if same is not None:
                values[f"{card}/same_bin"] = float(same)
        if values:
            mlflow.log_metrics(values)
        if report_dir is not None:
            mlflow.log_artifacts(str(report_dir), artifact_path="report")
    return run.info.run_id


def _external_model(experiment_id: str, model_ref: str) -> str:
    """The id of the external LoggedModel standing for a forecaster that is not an MLflow model."""
    import mlflow

    name = model_ref.replace(":", "-").replace("/", "-")
    found = mlflow.search_logged_models(experiment_ids=[experiment_id], filter_string=f"name = '{name}'",
                                        output_format="list", max_results=1)
    if found:
        return found[0].model_id
    # in the evaluation experiment: the default one keeps its artifacts in ./mlruns of whatever
    # directory the process runs from
    return mlflow.create_external_model(name=name, model_type="reference-forecaster", tags={"model_ref": model_ref},
                                        experiment_id=experiment_id).model_id


_SEARCH_RUN_METRICS = ("final_best_mean", "candidates_considered", "forecasts", "improved_share")


def log_search_simulation(
    tracking_uri: str,
    experiment_id: str,
    report: Mapping[str, Any],
    params: Mapping[str, Any],
    tags: Mapping[str, str],
    report_dir: str | Path,
    run_name: str,
) -> str:
    """One run of the search simulation: its plan as params, every task and mode's numbers as
    `<task>.<mode>.<metric>`, the filtered-vs-controls counts and the coverage, the report folder
    as the artifact `search`.

    Args:
        tracking_uri: MLflow tracking URI.
        experiment_id: the search experiment (kernelcast-search).
        report: `pipelines.search.report.search_report`'s answer.
        params: the plan (seeds, budget, anchor, tasks).
        tags: run tags (dagster_run_id, kind, forecaster, hardware_id).
        report_dir: the folder of search.json and curves.png.
        run_name: the run's name.
    Returns:
        The run id.
    """
    import mlflow

    tracking_client(tracking_uri)
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name) as run:
        mlflow.set_tags(dict(tags))
        mlflow.log_params(dict(params))
        for task, modes in report["tasks"].items():
            for mode, r in modes.items():
                for key in _SEARCH_RUN_METRICS:
                    if r.get(key) is not None:
                        mlflow.log_metric(f"{task}.{mode}.{key}", float(r[key]))
        for key in ("filtered_beats_standard", "filtered_beats_random", "n_tasks"):
            mlflow.log_metric(key, float(report["summary"][key]))
        mlflow.log_metric("coverage", float(report["coverage"]["coverage"]))
        mlflow.log_artifacts(str(report_dir), artifact_path="search")
    return run.info.run_id
