"""What every `kernelcast` command shares: the profile option, one-line errors, JSON output,
and the steps several commands take first (the task catalogue in a fresh warehouse).

A module of its own so the command modules (cli.py, cli_search.py, cli_report.py, ...) import it
without importing each other.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable

import typer

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
            raise typer.Exit(2) from exc
        except Exception as exc:  # the last line of defence: still one line, still non-zero
            name = type(exc).__name__
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            typer.echo(f"error: {name}: {msg}", err=True)
            raise typer.Exit(1) from exc

    return wrapper


def _settings(profile: str | None):
    from orchestration.settings import load_settings

    return load_settings(profile)


def _print_json(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))


def ensure_tasks(con) -> None:
    """Register the task catalogue in a warehouse that has none yet: measurement rows are checked
    against the tasks they measure (their benchmark cases), so a fresh home that only ingests or
    measures must have them."""
    from warehouse.kernels import read_tasks, upsert_tasks

    if read_tasks(con).is_empty():
        from pipelines.tasks.catalog import task_rows

        upsert_tasks(con, task_rows())
