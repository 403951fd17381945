"""base_model -> surrogate_model: the base checkpoint, then GRPO-trained versions in the MLflow registry."""

import shutil

import dagster as dg

from assets._metadata import markdown_table
from orchestration.resources import MlflowResource, SettingsResource, WarehouseResource

GROUP = "training"
BASE_MODEL_LOADS = "base_model_loads"
TOKENIZER_ROUND_TRIPS = "tokenizer_round_trips"
SURROGATE_REGISTERED_WITH_LINEAGE = "surrogate_registered_with_lineage"


@dg.asset(
    group_name=GROUP,
    kinds={"torch"},
    check_specs=[
        dg.AssetCheckSpec(BASE_MODEL_LOADS, asset="base_model", blocking=True,
                          description="The checkpoint loads and a forward pass gives finite logits."),
        dg.AssetCheckSpec(TOKENIZER_ROUND_TRIPS, asset="base_model", blocking=True,
                          description="A real prompt encodes and decodes back to itself; bin labels 1..8 are single tokens."),
    ],
)
def base_model(settings: SettingsResource) -> dg.MaterializeResult:
    """The base language model as a plain HF checkpoint under $KERNELCAST_HOME/models/ (the
    embedded SmolLM2 GGUF converted once; the tiny test model in the smoke profile)."""
    from models.base_model import resolve_base_model, verify_base_model

    cfg = settings.get()
    spec = cfg.surrogate.base_model
    path = resolve_base_model(spec, cfg.home)  # idempotent: converted once, then found
    report = verify_base_model(path)
    return dg.MaterializeResult(
        metadata={"base_model": spec, "path": dg.MetadataValue.path(str(path)),
                  "parameters": report["parameters"], "dtype": report["dtype"]},
        check_results=[
            dg.AssetCheckResult(check_name=BASE_MODEL_LOADS, passed=bool(report["loads"]),
                                severity=dg.AssetCheckSeverity.ERROR,
                                metadata={"parameters": report["parameters"], "error": report["load_error"] or "none"}),
            dg.AssetCheckResult(check_name=TOKENIZER_ROUND_TRIPS,
                                passed=bool(report["round_trip"] and report["labels_single_tokens"]),
                                severity=dg.AssetCheckSeverity.ERROR,
                                metadata={"round_trip": report["round_trip"], "prompt_tokens": report["prompt_tokens"],
                                          "labels_single_tokens": report["labels_single_tokens"]}),
        ],
    )


def _training_inputs(con, version: str):
    """(training pairs, kernel id -> prompt source, task -> description) of `version`."""
    from pipelines.evaluation.lm_forecasts import prompt_source
    from pipelines.tasks import get_task
    from warehouse.datasets import read_pairs
    from warehouse.kernels import read_kernels

    train = read_pairs(con, version, "train")
    ids = sorted(set(train["anchor_kernel_id"]) | set(train["candidate_kernel_id"]))
    kernels = read_kernels(con, kernel_ids=ids)
    sources = {r["kernel_id"]: prompt_source(r["task"], r["source"], r["generator"]) for r in kernels.iter_rows(named=True)}
    tasks = {t: get_task(t).description for t in train["task"].unique().to_list()}
    return train, sources, tasks


@dg.asset(
    group_name=GROUP,
    kinds={"torch", "mlflow"},
    pool="duckdb_writer",
    deps=["base_model", "rl_training_pool"],
    check_specs=[dg.AssetCheckSpec(SURROGATE_REGISTERED_WITH_LINEAGE, asset="surrogate_model", blocking=True,
                                   description="Every trained variant is a registered version with a model_lineage row.")],
)
def surrogate_model(context: dg.AssetExecutionContext, settings: SettingsResource, warehouse: WarehouseResource,
                    mlflow: MlflowResource) -> dg.MaterializeResult:
    """The LLM surrogate of the current dataset version as a version of models:/kernelcast-surrogate
    (tag kind=llm): the committed H200 adapter, a supervised LoRA trained here, or GRPO variants
    (settings.surrogate.llm); lineage in DuckDB `model_lineage`."""
    cfg = settings.get()
    if cfg.surrogate.llm == "grpo":
        return _grpo_surrogates(context, cfg, warehouse, mlflow)
    from models.base_model import resolve_base_model
    from pipelines.surrogates import llm
    from pipelines.surrogates.export import row_builder
    from warehouse.lineage import lineage_of, read_model_lineage

    sur = cfg.surrogate
    base_path = resolve_base_model(sur.base_model, cfg.home)
    mlflow.client()
    tags = _run_tags(context)
    with warehouse.connect() as con:
        version, roles = _version_roles(con, sur.held_out_task)
        if sur.llm == "committed":
            out = llm.register_committed(con, mlflow.tracking_uri, cfg.data_dir, sur.committed_run, sur.committed_adapter,
                                         version, sur.base_model, base_path, roles.eval, roles.held_out_eval, tags)
        elif sur.llm == "supervised":
            out = llm.train_and_register(con, mlflow.tracking_uri, roles, row_builder(con), version, sur.base_model,
                                         base_path, sur.supervised_epochs, sur.supervised_style, sur.supervised_rows,
                                         cfg.home / "training" / context.run.run_id, tags)
        else:
            raise dg.Failure(f"unknown surrogate.llm setting {sur.llm!r}: committed, supervised or grpo")
        lineage = read_model_lineage(con, "kernelcast-surrogate")
        trained = lineage_of(con, "kernelcast-surrogate", out.version)  # the fit's dataset, held or not
    recorded = set(lineage["model_version"].to_list()) if lineage.height else set()
    missing = [] if str(out.version) in recorded else [str(out.version)]
    context.log.info(f"LLM surrogate: version {out.version} ({out.source}, {'re-used' if out.reused else 'registered'})")
    return dg.MaterializeResult(
        metadata={"dataset_version": version, "registered_model": "kernelcast-surrogate", "versions": str(out.version),
                  "source": out.source, "reused": out.reused, **{k: float(v) for k, v in out.metrics.items()},
                  **({"trained_dataset_version": trained["dataset_version"], "lineage": trained["note"]} if trained else {}),
                  **({"mlflow_run_id": out.run_id, "mlflow_url": dg.MetadataValue.url(mlflow.run_url(out.run_id))} if out.run_id else {})},
        check_results=[dg.AssetCheckResult(check_name=SURROGATE_REGISTERED_WITH_LINEAGE, passed=not missing,
                                           severity=dg.AssetCheckSeverity.ERROR,
                                           metadata={"value": len(missing), "threshold": 0, "offending": ", ".join(missing) or "none"})],
    )


@dg.asset(
    group_name=GROUP,
    kinds={"scikit-learn", "mlflow"},
    pool="duckdb_writer",
    deps=["rl_training_pool", "eval_set"],
)
def classical_forecasters(context: dg.AssetExecutionContext, settings: SettingsResource, warehouse: WarehouseResource,
                          mlflow: MlflowResource) -> dg.MaterializeResult:
    """Classical forecasters (a boosted cost model of kernel features, a text model of both sources),
    trained on the current dataset version's fit pairs, calibrated on its calibration split, and
    registered as versions of models:/kernelcast-surrogate (tag kind); their held-out-task twins
    go to models:/kernelcast-surrogate-held-out."""
    from pipelines.surrogates.classical import ids_of, kernel_records, train_and_register
    from warehouse.datasets import dataset_measurement_ids

    cfg = settings.get()
    mlflow.client()
    tags = _run_tags(context)
    with warehouse.connect() as con:
        version, roles = _version_roles(con, cfg.surrogate.held_out_task)
        records = kernel_records(con, ids_of(roles.by_name().values()))
        registered = train_and_register(con, roles, records, cfg.surrogate.classical, mlflow.tracking_uri, version,
                                        context.run.run_id, "kernelcast-surrogate",
                                        measurement_ids=dataset_measurement_ids(con, version), tags=tags,
                                        params=_classical_params(cfg.surrogate.classical_params),
                                        max_fit=cfg.surrogate.classical_max_fit,
                                        workers=cfg.surrogate.classical_workers, progress=context.log.info)
    table = markdown_table(["model", "version", "kind", "split", "trained", "calibration Brier"],
                           [(r.name, r.version, r.kind, r.split, "re-used" if r.reused else "trained",
                             r.metrics.get("calibration_brier_after", "")) for r in registered])
    return dg.MaterializeResult(metadata={"dataset_version": version, "versions": dg.MetadataValue.md(table),
                                          "fit_pairs": roles.fit.height, "calibration_pairs": roles.calibration.height})


def _run_tags(context) -> dict[str, str]:
    """Tags of what this run trains or registers: the Dagster run and the code's commit."""
    from models.training.tracking import git_commit
    return {"dagster_run_id": context.run.run_id, **({"git_commit": c} if (c := git_commit()) else {})}


def _version_roles(con, held_out_task: str | None):
    """(newest dataset version, its roles); a Failure naming the asset to run when there is none."""
    from pipelines.surrogates.export import latest_version, version_roles

    try:
        version = latest_version(con)
    except ValueError:
        raise dg.Failure("no dataset version yet: materialise curated_pairs first") from None
    return version, version_roles(con, version, held_out_task)


def _classical_params(entries) -> dict[str, dict]:
    """(kind, parameter, value) settings as {kind: {parameter: value}}."""
    out: dict[str, dict] = {}
    for kind, name, value in entries:
        out.setdefault(kind, {})[name] = value
    return out


def _grpo_surrogates(context, cfg, warehouse, mlflow) -> dg.MaterializeResult:
    """GRPO reward variants (format warm-up + TRL GRPO, models.training), one version each."""
    from models.base_model import resolve_base_model
    from models.registry.lifecycle import base_model_identity, train_or_reuse
    from models.service import fingerprints_or_default
    from models.training.rows import build_training_rows
    from models.training.settings import TrainingSettings
    from warehouse.datasets import current_dataset_version, dataset_measurement_ids
    from warehouse.lineage import read_model_lineage

    sur = cfg.surrogate
    with warehouse.connect(read_only=True) as con:
        version = current_dataset_version(con)
        if version is None:
            raise dg.Failure("no dataset version yet: materialise curated_pairs first")
        measurement_ids = dataset_measurement_ids(con, version)
        train, sources, tasks = _training_inputs(con, version)
        by_hw = fingerprints_or_default(con, train["hardware_id"].unique().to_list())
    base_path = resolve_base_model(sur.base_model, cfg.home)
    identity = base_model_identity(base_path)
    mlflow.client()  # sets the tracking and registry URIs of this process
    produced, rows_md = [], []
    for variant in sur.variants:
        ts = TrainingSettings.profile(sur.training_profile, **{**dict(sur.training_overrides),
                                                               "base_model": sur.base_model, "reward": variant})
        rows = build_training_rows(train, sources, tasks, by_hw, style=ts.prompt_style)
        context.log.info(f"{variant}: {len(rows)} training rows, profile {sur.training_profile}")
        work = cfg.home / "training" / context.run.run_id / variant.replace("+", "_")
        with warehouse.connect() as con:  # the lineage row is written at registration
            out = train_or_reuse(ts, rows, work, mlflow.tracking_uri, version, identity, batch=context.run.run_id,
                                 measurement_ids=measurement_ids, con=con, dagster_run_id=context.run.run_id,
                                 force=sur.force_retrain)
        shutil.rmtree(work, ignore_errors=True)  # the adapter now lives in MLflow's artifacts
        produced.append(out)
        m = out.metrics
        rows_md.append((variant, out.version, "re-used" if out.reused else "trained", f"{out.seconds:.0f}",
                        f"{m.get('parse_rate_before_sft', '')} -> {m.get('parse_rate_after_sft', '')}",
                        m.get("frac_reward_zero_std_avg", ""), out.run_id))
    with warehouse.connect(read_only=True) as con:
        lineage = read_model_lineage(con, "kernelcast-surrogate")
    recorded = set(lineage["model_version"].to_list()) if lineage.height else set()
    missing = [str(p.version) for p in produced if str(p.version) not in recorded]
    table = markdown_table(["reward", "version", "trained", "seconds", "parse rate before -> after warm-up",
                            "frac_reward_zero_std", "mlflow run"], rows_md) if rows_md else "(no variants configured)"
    first_run = next((p.run_id for p in produced if p.run_id), None)
    return dg.MaterializeResult(
        metadata={"dataset_version": version, "registered_model": "kernelcast-surrogate",
                  "versions": ", ".join(str(p.version) for p in produced) or "none",
                  "train_rows": train.height, "training_profile": sur.training_profile,
                  "variants": dg.MetadataValue.md(table),
                  **({"mlflow_run_id": first_run, "mlflow_url": dg.MetadataValue.url(mlflow.run_url(first_run))} if first_run else {})},
        check_results=[dg.AssetCheckResult(check_name=SURROGATE_REGISTERED_WITH_LINEAGE, passed=not missing,
                                           severity=dg.AssetCheckSeverity.ERROR,
                                           metadata={"value": len(missing), "threshold": 0, "offending": ", ".join(missing) or "none"})],
    )


defs = dg.Definitions(assets=[base_model, surrogate_model, classical_forecasters])
