"""`kernelcast train`: the LLM surrogate's trip to a GPU host and back.

    kernelcast train export --out .gpu-job            # the job of the newest dataset version
    # on the GPU host (torch, transformers, peft; trl + datasets for GRPO variants):
    python3 -m models.training.gpu_host.gpu_job run --job .gpu-job --run run --out OUT --deadline-s 540
    #   --gpus-per-variant N: each supervised variant data-parallel on N GPUs (accelerate launch)
    kernelcast train collect <files>... --job .gpu-job --out data/training/h200/<date>
    kernelcast run                                    # registers the committed adapter, scores it

`collect` merges the run's variants into the committed form (forecasts.parquet, training.json,
training_pairs.parquet, adapters/; pipelines/surrogates/remote_results.py, the one ingest of both
host runs); the `surrogate.committed_run` setting names the folder `kernelcast run` reads, and
the version it registers records the job's dataset version as the one it was trained on.

`kernelcast train code build-bundle | embed-head | ingest` is the same trip for the code-reading
LLM's job (kind "code", orchestration/cli_code.py, docs/llm-surrogate.md).
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
def collect(
    files: list[Path] = typer.Argument(..., exists=True, help="results.tar and adapter-*.tar of the calls (or their folder)."),
    job: Path = typer.Option(..., "--job", exists=True, file_okay=False, help="The job folder the host ran."),
    out: Path = typer.Option(..., "--out", help="Committed run folder, e.g. data/training/h200/2026-12-01."),
) -> None:
    """Merge what the GPU host sent back into the committed run folder (its other variants stay)."""
    from orchestration.cli_common import CliError
    from pipelines.surrogates.remote_results import JobError, ingest

    try:
        summary = ingest(files, job, out)
    except JobError as e:
        raise CliError(str(e)) from e
    typer.echo(f"{summary['forecasts']} forecasts of {', '.join(summary['variants'])}; "
               f"adapters: {', '.join(summary['adapters']) or 'none'}; "
               f"{summary['training_pairs']} training pairs of {summary['dataset_version']} -> {out}")
