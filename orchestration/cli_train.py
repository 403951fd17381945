"""`kernelcast train`: the LLM surrogate's trip to a GPU host and back.

    kernelcast train export --out .gpu-job            # the job of the newest dataset version
    # on the GPU host (torch, transformers, peft; trl + datasets for GRPO variants):
    python3 -m models.training.gpu_host.gpu_job run --job .gpu-job --run run --out OUT --deadline-s 540
    #   --gpus-per-variant N: each supervised variant data-parallel on N GPUs (accelerate launch)
    kernelcast train ingest OUT/results.tar OUT/adapter-*.tar --job .gpu-job --into data/training/h200/<date>
    kernelcast run                                    # registers the committed adapter, scores it

`ingest` merges the run's variants into the committed form (forecasts.parquet, training.json,
training_pairs.parquet, adapters/; pipelines/surrogates/remote_results.py, the one ingest of both
host runs); the `surrogate.committed_run` setting names the folder `kernelcast run` reads, and
the version it registers records the job's dataset version as the one it was trained on.

`kernelcast train code build-bundle | embed-head` is the same trip for the code-reading LLM's job
(kind "code", orchestration/cli_code.py, docs/llm-surrogate.md); `ingest` brings either kind home:
the job's kind says how the host's output reads.
"""

from __future__ import annotations

from pathlib import Path

import typer

from orchestration.cli_code import app as code_app  # imports only typer: `--help` stays fast

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])
app.add_typer(code_app, name="code")


@app.command()
def export(
    out: Path = typer.Option(Path(".gpu-job"), help="Job folder to write."),
    version: str | None = typer.Option(None, help="Dataset version (default: the newest)."),
    held_out_task: str = typer.Option("gdn_chunk_fwd_o", help="Task of the held-out-task variants."),
    profile: str | None = typer.Option(None, "--profile", help="smoke | default | gpu"),
) -> None:
    """Write the training job (pairs by role, kernel sources and compile features, variants)."""
    from orchestration.cli_common import CliError, _settings
    from pipelines.surrogates.export import export_job
    from warehouse.db import connect

    settings = _settings(profile)
    if not settings.warehouse_path.exists():
        raise CliError("no warehouse yet: run `kernelcast run` first")
    try:
        with connect(settings.warehouse_path) as con:
            meta = export_job(con, out, version=version, held_out_task=held_out_task)
    except ValueError as e:
        raise CliError(str(e)) from e
    typer.echo(f"job of {meta['dataset_version']} in {out}: " +
               ", ".join(f"{k} {v}" for k, v in meta["counts"].items()))
    typer.echo("variants: " + ", ".join(v["name"] for v in meta["variants"]))


@app.command()
def ingest(
    results: list[Path] = typer.Argument(..., exists=True,
                                         help="What the host sent back: a `gpu_job` run's results.tar and adapter-*.tar "
                                              "(or their folder), or an `llm_code` run's OUT folder."),
    job: Path = typer.Option(..., "--job", exists=True, file_okay=False, help="The job folder the host ran."),
    into: Path | None = typer.Option(None, "--into", help="Committed run folder (default: the settings' "
                                                           "surrogate.committed_run under the data folder)."),
    register: bool = typer.Option(False, "--register", help="Also register the run's variants in MLflow now "
                                                            "(a code run's; else `kernelcast run` registers them)."),
    adapter: bool = typer.Option(False, "--adapter", help="Keep a code run's code-lora adapter (~5 MB) in the run "
                                                          "folder (default: its forecasts only)."),
) -> None:
    """Bring what a GPU host sent back into the committed run folder that `kernelcast run` reads.

    One ingest for both kinds of job (the job's kind says how the host's files read). Its
    variants replace those of the same name, with their head files; the others stay. Nothing is
    written unless the host's files and the job read."""
    from orchestration.settings import load_settings
    from pipelines.surrogates.remote_results import ingest as ingest_run

    settings = load_settings(None)
    into = into or settings.data_dir / settings.surrogate.committed_run
    if register:
        _registrable(results, job)  # before anything is written
    summary = ingest_run(results, job, into, adapter=adapter)  # JobError: a ValueError, one line
    typer.echo(f"{summary['forecasts']} forecasts of {', '.join(summary['variants'])} of {summary['dataset_version']} "
               f"-> {summary['into']}" + "".join(f"; adapter adapters/{name}" for name in summary["adapters"]))
    typer.echo(f"  {summary['training_pairs']} fit pairs kept beside them")
    for variant, name in summary["head_files"].items():
        typer.echo(f"  {variant}: head file {name}")
    if register:
        _register(settings, into, results[0], summary["variants"])


def _registrable(results: list[Path], job: Path) -> None:
    """`--register` takes a code run's OUT folder alone (a gpu_job run's variants are registered
    by `kernelcast run`, which reads the committed run folder)."""
    from models.training.gpu_host.job import read_meta

    if read_meta(job).get("kind") != "code" or len(results) != 1 or not results[0].is_dir():
        raise ValueError("--register: give a code run's OUT folder alone (a gpu_job run's variants are "
                         "registered by `kernelcast run`)")


def _register(settings, into: Path, out: Path, variants: list[str]) -> None:
    """Register a code run's variants in the settings' MLflow store now."""
    from models.registry.tracking import prepare_store
    from pipelines.forecasting.embed import log_embed_head_model
    from pipelines.surrogates.registration import register_variants
    from warehouse.db import connect

    prepare_store(settings.mlflow_uri)
    with connect(settings.warehouse_path) as con:
        versions = register_variants(con, settings.mlflow_uri, settings.data_dir, into, out,
                                     variants, settings.surrogate.base_model, head_logger=log_embed_head_model)
    typer.echo("registered: " + ", ".join(f"{k} v{v}" for k, v in versions.items()))
