"""`kernelcast report`: the newest evaluation's forecaster table, both splits.

    kernelcast report                 # text, 80 columns
    kernelcast report --json          # {"dataset_version", "held_out_task", "forecasters": [...]}
    kernelcast report --split held_out_task
"""

from __future__ import annotations

import json

import typer

from pipelines.evaluation.forecaster_table import TABLE_FILE, text_table

SPLIT_TITLES = {"in_distribution": "in distribution (eval set)", "held_out_task": "held-out task"}


def newest_table(settings) -> dict | None:
    """The forecaster table of the newest dataset version's report, or None."""
    from warehouse.datasets import current_dataset_version
    from warehouse.db import connect

    if not settings.warehouse_path.exists():
        return None
    with connect(settings.warehouse_path, read_only=True) as con:
        version = current_dataset_version(con)
    if version is None:
        return None
    path = settings.reports_dir / version / TABLE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def table_lines(table: dict) -> list[str]:
    """Both splits as text, each under a title line."""
    lines = []
    for split, title in SPLIT_TITLES.items():
        rows = [r for r in table["forecasters"] if r["split"] == split]
        if rows:
            extra = f" {table.get('held_out_task')}" if split == "held_out_task" else ""
            lines += [f"{title}{extra}:", *text_table(rows)]
    return lines


def report(
    profile: str | None = typer.Option(None, "--profile", help="smoke | default | gpu"),
    split: str | None = typer.Option(None, "--split", help="in_distribution | held_out_task (default: both)"),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Print the newest evaluation report's table: every forecaster, with 95% intervals."""
    from orchestration.cli_common import CliError, _print_json, _settings

    if split is not None and split not in SPLIT_TITLES:
        raise CliError(f"unknown split {split!r}; use in_distribution or held_out_task")
    table = newest_table(_settings(profile))
    if table is None:
        raise CliError("no evaluation report yet: run `kernelcast run` first")
    if split:
        table = {**table, "forecasters": [r for r in table["forecasters"] if r["split"] == split]}
    if as_json:
        _print_json(table)
        return
    typer.echo(f"dataset {table['dataset_version']}")
    for line in table_lines(table):
        typer.echo(line)
