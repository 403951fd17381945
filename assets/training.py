"""base_model -> surrogate_model: the base checkpoint, then GRPO-trained versions in the MLflow registry."""

import contextlib

import dagster as dg

from assets._metadata import markdown_table
from models.registry import SURROGATE_MODEL
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
    (settings.surrogate.llm); with the committed adapter, the other variants of its committed run
    that a GPU host's run brought back (code-embed with its head file among them) are registered
    too; lineage in DuckDB `model_lineage`."""
    from pipelines.forecasting.embed import log_embed_head_model
    from pipelines.surrogates.grpo import train_grpo_surrogates
    from pipelines.surrogates.llm import produce_llm_surrogate

    cfg = settings.get()
    mlflow.client()  # sets the tracking and registry URIs of this process
    run_id = context.run.run_id
    with _dataset_failures():
        if cfg.surrogate.llm == "grpo":
            return _grpo_result(train_grpo_surrogates(warehouse.path, mlflow.tracking_uri, cfg.home, cfg.surrogate,
                                                      run_id, log=context.log.info), cfg.surrogate, mlflow)
        llm = produce_llm_surrogate(warehouse.path, mlflow.tracking_uri, cfg.home, cfg.data_dir, cfg.surrogate,
                                    cfg.home / "training" / run_id, _run_tags(context),
                                    head_logger=log_embed_head_model)
    out, trained = llm.registered, llm.trained
    context.log.info(f"LLM surrogate: version {out.version} ({out.source}, {'re-used' if out.reused else 'registered'})")
    if llm.committed_variants:
        context.log.info("committed variants: " + ", ".join(f"{v} {m}/{n}" for v, m, n in llm.committed_variants))
    variants = ({"committed_variants": dg.MetadataValue.md(markdown_table(["variant", "registered model", "version"],
                                                                          llm.committed_variants))}
                if llm.committed_variants else {})
    return dg.MaterializeResult(
        metadata={"dataset_version": llm.dataset_version, "registered_model": SURROGATE_MODEL,
                  "versions": str(out.version), "source": out.source, "reused": out.reused, **variants,
                  **{k: float(v) for k, v in out.metrics.items()},
                  **({"trained_dataset_version": trained["dataset_version"], "lineage": trained["note"]} if trained else {}),
                  **({"mlflow_run_id": out.run_id, "mlflow_url": dg.MetadataValue.url(mlflow.run_url(out.run_id))} if out.run_id else {})},
        check_results=[_lineage_check(llm.missing_lineage)],
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
    from pipelines.forecasting.pyfunc import log_classical_sources_model
    from pipelines.surrogates.classical import train_classical_surrogates

    cfg = settings.get()
    mlflow.client()
    with _dataset_failures():
        out = train_classical_surrogates(warehouse.path, mlflow.tracking_uri, cfg.surrogate, context.run.run_id,
                                         SURROGATE_MODEL, _run_tags(context), progress=context.log.info,
                                         model_logger=log_classical_sources_model)
    table = markdown_table(["model", "version", "kind", "split", "trained", "calibration Brier"],
                           [(r.name, r.version, r.kind, r.split, "re-used" if r.reused else "trained",
                             r.metrics.get("calibration_brier_after", "")) for r in out.registered])
    return dg.MaterializeResult(metadata={"dataset_version": out.dataset_version, "versions": dg.MetadataValue.md(table),
                                          "fit_pairs": out.fit_pairs, "calibration_pairs": out.calibration_pairs})


def _run_tags(context) -> dict[str, str]:
    """Tags of what this run trains or registers: the Dagster run and the code's commit."""
    from models.training.tracking import git_commit
    return {"dagster_run_id": context.run.run_id, **({"git_commit": c} if (c := git_commit()) else {})}


@contextlib.contextmanager
def _dataset_failures():
    """The training pipelines' refusals as Dagster failures; no dataset yet names the asset to run."""
    from pipelines.surrogates.export import NoDatasetVersion
    from pipelines.surrogates.llm import UnknownLlmSource

    try:
        yield
    except NoDatasetVersion:
        raise dg.Failure("no dataset version yet: materialise curated_pairs first") from None
    except UnknownLlmSource as exc:
        raise dg.Failure(str(exc)) from None


def _lineage_check(missing: list[str]) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(check_name=SURROGATE_REGISTERED_WITH_LINEAGE, passed=not missing,
                               severity=dg.AssetCheckSeverity.ERROR,
                               metadata={"value": len(missing), "threshold": 0, "offending": ", ".join(missing) or "none"})


def _grpo_result(grpo, sur, mlflow) -> dg.MaterializeResult:
    """The GRPO variants' versions (pipelines.surrogates.grpo) as the asset's metadata."""
    rows_md = [(variant, out.version, "re-used" if out.reused else "trained", f"{out.seconds:.0f}",
                f"{out.metrics.get('parse_rate_before_sft', '')} -> {out.metrics.get('parse_rate_after_sft', '')}",
                out.metrics.get("frac_reward_zero_std_avg", ""), out.run_id) for variant, out in grpo.produced]
    table = markdown_table(["reward", "version", "trained", "seconds", "parse rate before -> after warm-up",
                            "frac_reward_zero_std", "mlflow run"], rows_md) if rows_md else "(no variants configured)"
    first_run = next((out.run_id for _, out in grpo.produced if out.run_id), None)
    return dg.MaterializeResult(
        metadata={"dataset_version": grpo.dataset_version, "registered_model": SURROGATE_MODEL,
                  "versions": ", ".join(str(out.version) for _, out in grpo.produced) or "none",
                  "train_rows": grpo.train_rows, "training_profile": sur.training_profile,
                  "variants": dg.MetadataValue.md(table),
                  **({"mlflow_run_id": first_run, "mlflow_url": dg.MetadataValue.url(mlflow.run_url(first_run))} if first_run else {})},
        check_results=[_lineage_check(grpo.missing_lineage)],
    )


defs = dg.Definitions(assets=[base_model, surrogate_model, classical_forecasters])
