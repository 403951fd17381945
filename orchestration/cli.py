"""The `kernelcast` command line. Stable contracts: see README "Command line".

Every command prints a clear one-line error and exits non-zero on bad input; reporting commands
take --json. Heavy imports happen inside commands so `--help` stays fast.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Callable, List, Optional

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="kernelcast: LLM surrogates of GPU kernel runtime (generate, profile, curate, train, evaluate, search).",
)

ProfileOpt = typer.Option(None, "--profile", help="smoke | default | gpu (default: $KERNELCAST_PROFILE or 'default').")


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


def one_line_errors(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except (CliError, ValueError, FileNotFoundError, KeyError) as exc:
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            typer.echo(f"error: {msg}", err=True)
            raise typer.Exit(2)
        except Exception as exc:  # the last line of defence: still one line, still non-zero
            name = type(exc).__name__
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            typer.echo(f"error: {name}: {msg}", err=True)
            raise typer.Exit(1)

    return wrapper


def _settings(profile: Optional[str]):
    from orchestration.settings import load_settings

    return load_settings(profile)


def _print_json(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))


# ---- run ----------------------------------------------------------------------------------
@app.command()
@one_line_errors
def run(profile: Optional[str] = ProfileOpt) -> None:
    """Materialise the whole asset graph into $KERNELCAST_HOME (the main job)."""
    from rich.console import Console

    from orchestration.runner import run_graph

    settings = _settings(profile)
    console = Console(stderr=True)
    console.print(f"kernelcast run: profile [bold]{settings.profile}[/], home {settings.home}")
    with console.status("materialising the asset graph"):
        steps = run_graph(settings)
    ok = True
    for s in steps:
        ok &= s.success and not s.checks_failed
        mark = "ok" if s.success else "FAILED"
        console.print(f"  {s.label:<24} {mark:<6} {len(s.materialized)} assets" + (f"; failed checks: {', '.join(s.checks_failed)}" if s.checks_failed else ""))
    if not ok:
        raise CliError("some assets or checks failed; open `kernelcast ui` for the run logs")
    console.print(f"done. State in {settings.home}; `kernelcast ui` opens Dagster and MLflow.")


# ---- tasks --------------------------------------------------------------------------------
@app.command()
@one_line_errors
def tasks(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """List the kernel tasks with their correctness and benchmark cases."""
    from pipelines.tasks import all_tasks

    items = [
        {
            "task": t.name,
            "source": t.source,
            "contract_version": t.contract_version,
            "description": t.description,
            "tolerances": t.tolerances,
            "correctness_cases": list(t.correctness_cases),
            "benchmark_cases": list(t.benchmark_cases),
        }
        for t in all_tasks()
    ]
    if as_json:
        _print_json(items)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(items)} kernel tasks")
    for col in ("task", "source", "correctness", "benchmark", "description"):
        table.add_column(col, overflow="fold")
    for it in items:
        table.add_row(it["task"], it["source"], str(len(it["correctness_cases"])), str(len(it["benchmark_cases"])), it["description"][:90] + "...")
    Console().print(table)


# ---- ingest -------------------------------------------------------------------------------
@app.command()
@one_line_errors
def ingest(
    files: List[Path] = typer.Argument(..., help="Result or kernel Parquet files, or folders of them."),
    profile: Optional[str] = ProfileOpt,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Load measurement result (and kernel) files into the warehouse. Idempotent."""
    from warehouse.db import connect
    from warehouse.ingest import IngestError, ingest_path

    settings = _settings(profile)
    reports, errors = [], []
    with connect(settings.warehouse_path) as con:
        for f in files:
            if not f.exists():
                errors.append(f"{f}: no such file or folder")
                continue
            try:
                for r in ingest_path(con, f):
                    reports.append(r)
            except IngestError as exc:
                errors.append(str(exc))
    out = [
        {"path": str(r.path), "kind": r.kind, "rows": r.rows, "added": r.added, "skipped": r.skipped}
        for r in reports
    ]
    if as_json:
        _print_json({"files": out, "errors": errors})
    else:
        for r in out:
            typer.echo(f"{r['path']}: {r['kind']}, {r['rows']} rows, {r['added']} added, {r['skipped']} already there")
        for e in errors:
            typer.echo(f"error: {e}", err=True)
    if errors:
        raise typer.Exit(2)


# ---- dataset ------------------------------------------------------------------------------
@app.command()
@one_line_errors
def dataset(profile: Optional[str] = ProfileOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """Counts of the measured dataset by task, hardware, bin and status, read from DuckDB."""
    from pipelines.curation.summary import dataset_summary, summary_markdown
    from warehouse.db import connect
    from warehouse.measurements import measurements_frame

    settings = _settings(profile)
    if not settings.warehouse_path.exists():
        raise CliError(f"no warehouse at {settings.warehouse_path}; run `kernelcast run` or `kernelcast ingest` first")
    with connect(settings.warehouse_path, read_only=True) as con:
        summary = dataset_summary(measurements_frame(con))
    if as_json:
        _print_json(summary)
    else:
        typer.echo(summary_markdown(summary))


# ---- ui -----------------------------------------------------------------------------------
@app.command()
@one_line_errors
def ui(
    profile: Optional[str] = ProfileOpt,
    dagster_port: int = typer.Option(3000, help="Dagster UI port on 127.0.0.1."),
    mlflow_port: int = typer.Option(5000, help="MLflow UI port on 127.0.0.1."),
) -> None:
    """Serve the Dagster UI and the MLflow UI on 127.0.0.1 until Ctrl-C or SIGTERM."""
    from orchestration.ui import serve

    serve(_settings(profile), dagster_port=dagster_port, mlflow_port=mlflow_port)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
