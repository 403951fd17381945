"""`kernelcast report`: the newest evaluation's forecaster table, every split.

    kernelcast report                 # text, 80 columns
    kernelcast report --json          # {"dataset_version", "held_out_task", "report", "pages",
                                      #  "evaluation_run_id", "evaluation_run_url", "empty_splits",
                                      #  "selective_external", "forecasters": [...]}
    kernelcast report --split external
"""

from __future__ import annotations

import json

import typer

from pipelines.evaluation.forecaster_table import TABLE_FILE, text_table

SPLIT_TITLES = {"in_distribution": "in distribution (eval set)",
                "source_only": "source only (eval set, generator metadata withheld)",
                "held_out_task": "held-out task",
                "external": "external (kernels the template generator did not write)"}


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
    """Every split as text under a title line (an empty split: its reason); then the report's
    paths and the MLflow runs of the registered forecasters."""
    lines = []
    empty = table.get("empty_splits") or {}
    for split, title in SPLIT_TITLES.items():
        rows = [r for r in table["forecasters"] if r["split"] == split]
        extra = f" {table.get('held_out_task')}" if split == "held_out_task" and table.get("held_out_task") else ""
        if rows:
            lines += [f"{title}{extra}:", *text_table(rows)]
            sel = table.get("selective_external") or {}
            if split == "external" and sel.get("best"):
                lines.append(f"  cover: coverage at which max-prob-selected forecasts reach the best Brier "
                             f"({sel['target_brier']:.3f}, {sel['best']})")
        elif split in empty:
            lines.append(f"{title}{extra}: empty ({empty[split]})")
    if table.get("report"):
        lines.append(f"report: {table['report']}")
    if table.get("evaluation_run_id"):
        lines.append(f"evaluation run: {table['evaluation_run_id']} {table.get('evaluation_run_url') or ''}".rstrip())
    runs = sorted({(r["name"], r["run_id"], r.get("mlflow_url") or "") for r in table["forecasters"] if r.get("run_id")})
    lines += [f"run {name}: {run_id} {url}".rstrip() for name, run_id, url in runs]
    return lines


def report(
    profile: str | None = typer.Option(None, "--profile", help="smoke | default | gpu"),
    split: str | None = typer.Option(None, "--split", help="in_distribution | source_only | held_out_task | external "
                                                           "(default: all)"),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Print the newest evaluation report's table: every forecaster, with 95% intervals."""
    from orchestration.cli_common import CliError, _print_json, _settings

    if split is not None and split not in SPLIT_TITLES:
        raise CliError(f"unknown split {split!r}; use one of {', '.join(SPLIT_TITLES)}")
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
