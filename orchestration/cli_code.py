"""`kernelcast train code`: the code-reading LLM's job, built here and brought back from a GPU host
(docs/llm-surrogate.md).

    kernelcast train code build-bundle --out .gpu-batches/llm-bundle [--warehouse P] [--version V]
    # on the GPU host: python3 -m models.training.gpu_host.llm_code train --job JOB --out OUT ...
    kernelcast train code embed-head OUT --job JOB [--base-model smollm2]
    kernelcast train ingest OUT --job JOB [--into RUN_DIR] [--register] [--adapter]

The job is models/training/gpu_host/job.py's folder of kind "code". The domain code is
pipelines.surrogates.code_bundle (the job) and code_embed (the boosted heads on the host's
embeddings); the run comes back through `kernelcast train ingest` (cli_train.py, the one ingest of
both kinds of host run). This module adds the settings' defaults (warehouse, data folder), which
live on the orchestration floor. Attached under `kernelcast train` by cli_train.py; errors
are one line with exit code 2 like every command's (cli_common.one_line_errors, applied in cli.py).
"""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode="markdown",
    help="The code-reading LLM's job (kind \"code\"): build it from the warehouse, fit its embedding "
         "heads on what a GPU host sent back (`kernelcast train ingest` brings the run home).",
)

JOB_HELP = "The job folder the host ran (`build-bundle`'s --out)."


@app.command("build-bundle")
def build_bundle(
    out: Path = typer.Option(..., "--out", help="Job folder to write (e.g. .gpu-batches/llm-bundle)."),
    warehouse: Path | None = typer.Option(None, "--warehouse", help="DuckDB file (default: the settings' warehouse)."),
    version: str | None = typer.Option(None, "--version", help="Dataset version (default: the newest)."),
    held_out_task: str | None = typer.Option(None, "--held-out-task",
                                             help="Task of the held-out-task roles (default: gdn_chunk_fwd_o)."),
) -> None:
    """Write the code-reading LLM's job of a dataset version: its pairs by role, kernel sources
    and source-derived feature vectors, a few MB of gzipped JSON lines to copy to a GPU host.

    The build refuses a job in which a fit or calibration pair touches an eval, external or
    held-out lineage."""
    from orchestration.settings import load_settings
    from pipelines.surrogates.code_bundle import build_bundle as write_bundle
    from pipelines.surrogates.roles import DEFAULT_HELD_OUT_TASK
    from warehouse.db import connect

    path = warehouse or load_settings(None).warehouse_path
    if not path.exists():
        raise ValueError(f"no warehouse at {path}: run `kernelcast run` first (or pass --warehouse)")
    with connect(path, read_only=True) as con:
        meta = write_bundle(con, out, version, held_out_task or DEFAULT_HELD_OUT_TASK)
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20  # MiB
    typer.echo(f"bundle of {meta['dataset_version']} in {out} ({size:.1f} MiB): "
               + ", ".join(f"{k} {v}" for k, v in meta["counts"].items()))


@app.command("embed-head")
def embed_head(
    results: Path = typer.Argument(..., exists=True, file_okay=False,
                                   help="The OUT folder the host run wrote (its forecasts and metrics grow)."),
    job: Path = typer.Option(..., "--job", help=JOB_HELP),
    base_model: str | None = typer.Option(None, "--base-model",
                                          help="The base model the host run read with "
                                               "(default: the settings' surrogate.base_model)."),
) -> None:
    """Fit the boosted code-embed variants on a host run's embeddings.parquet and add their
    forecasts to its OUT folder.

    With the principal axes in the embeddings, each variant's head file (trees, axes) is written
    beside them, so its registered version forecasts new pairs; the ablation's Brier scores per
    role are printed."""
    from orchestration.settings import load_settings
    from pipelines.surrogates.code_embed import add_embed_variants

    summary = add_embed_variants(results, job, base_model or load_settings(None).surrogate.base_model)
    typer.echo("added: " + ", ".join(summary["variants"]))
    for variant, name in summary["head_files"].items():
        typer.echo(f"  {variant}: forecasts new pairs (its head: {name})")
    for variant, why in summary["not_forecasting_new_pairs"].items():
        typer.echo(f"  {variant}: answers only the pairs of its run: {why}")
    for variant, scores in summary["ablation"].items():
        for inputs, by_role in scores.items():
            typer.echo(f"  {variant:22s} {inputs:38s} " + "  ".join(f"{r} {b:.4f}" for r, b in by_role.items()))
