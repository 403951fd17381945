"""What every `kernelcast` command shares: the profile option, one-line errors, JSON output,
and the steps several commands take first (the task catalogue in a fresh warehouse).

A module of its own so the command modules (cli.py, cli_search.py, cli_report.py, ...) import it
without importing each other.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import warnings
from collections.abc import Callable

import typer
from typer.core import TyperGroup

ProfileOpt = typer.Option(None, "--profile", metavar="NAME",
                          help="smoke | default | gpu (default: $KERNELCAST_PROFILE or 'default').")
JSON_HELP = "Print the result as JSON (stdout) instead of text."
JsonOpt = typer.Option(False, "--json", help=JSON_HELP)

# Progress bars and advisory chatter of the libraries some commands load (MLflow's artifact
# downloads, Hugging Face hub and transformers): set before any of them is imported.
QUIET_LIBRARIES_ENV = {
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' "Loading weights" bars follow the hub's switch
    "TQDM_DISABLE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


READABLE_TYPES = {"int": "N", "int range": "N", "float": "NUM", "float range": "NUM", "str": "TEXT",
                  "path": "PATH", "Path": "PATH", "file": "FILE", "dir": "DIR", "bool": None}


def readable_type(typer_label: str) -> str | None:
    """What typer calls a parameter's type, as a metavar people read; None for a flag.

    >>> [readable_type(t) for t in ("<int range>", "<list[Path]>", "<bool>", "<dir>", "<a|b>")]
    ['N', 'PATH', None, 'DIR', 'a|b']
    """
    inner = typer_label.strip("<>")
    if inner.startswith("list[") and inner.endswith("]"):
        inner = inner[5:-1]
    return READABLE_TYPES.get(inner, inner if "|" in inner else "TEXT")


def readable_params(command) -> None:
    """Readable help for `command` and its subcommands: typer prints a parameter's Python type
    (`<bool>`, `<list[Path]>`, `<int range> [x>=1]`); here a flag shows nothing, a value its
    metavar (an explicit `metavar=` wins: N, PATH, TEXT...), and a bound is left to the help text
    and to the one-line error. Typer renders help through these per-parameter hooks, so they
    are set on the instances the command line is built from (a fresh tree every invocation)."""
    for param in getattr(command, "params", []):
        typer_type = getattr(param, "display_type", None)
        if typer_type is None:  # a plain click parameter: nothing to rename
            continue
        if param.param_type_name == "argument":
            shown = param.metavar or param.name.upper()
            shown += "..." if param.nargs != 1 and not shown.endswith("...") else ""
            param.metavar = shown
            param.display_type_rich = lambda ctx: None
            param._usage_display_name = lambda shown=shown, req=param.required: shown if req else f"[{shown}]"
        elif getattr(param, "is_flag", False):
            param.display_type_rich = lambda ctx: None
            if "--json" in param.opts and not param.help:  # every command's --json means the same
                param.help = JSON_HELP
        else:
            param.display_type_rich = (lambda ctx, p=param, f=typer_type:
                                       p.metavar if p.metavar is not None else readable_type(f(ctx)))
        param._get_number_range_help_str = lambda: None
    if hasattr(command, "get_help_option"):  # --help is made per context, outside `params`
        made = command.get_help_option

        def help_option(ctx, made=made):
            option = made(ctx)
            if option is not None:
                option.display_type_rich = lambda ctx: None
            return option

        command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        readable_params(sub)


class KernelcastGroup(TyperGroup):
    """The `kernelcast` command group: readable help, and every usage error (a missing option,
    a path that does not exist, a value out of range) as one line `error: ...` with exit code 2,
    like the errors the commands raise themselves. Library warnings are not shown."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        for key, value in QUIET_LIBRARIES_ENV.items():
            os.environ.setdefault(key, value)
        readable_params(self)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if not standalone_mode:
                return super().main(args, prog_name or "kernelcast", complete_var, standalone_mode, **extra)
            try:
                rv = super().main(args, prog_name or "kernelcast", complete_var, False, **extra)
            except typer.TyperException as exc:  # click's usage and file errors
                if type(exc).__name__ == "NoArgsIsHelpError":  # the help, already printed
                    sys.exit(0)
                message = " ".join(exc.format_message().split())
                typer.echo(f"error: {message}" + _help_hint(exc), err=True)
                sys.exit(exc.exit_code)
            except typer.Abort:
                typer.echo("error: aborted", err=True)
                sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


def _help_hint(exc) -> str:
    ctx = getattr(exc, "ctx", None)
    return f" (see `{ctx.command_path} --help`)" if ctx is not None and ctx.command_path else ""


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


TABLE_WIDTH = 100  # every table of the command line fits 100 columns


def aligned_table(headers: list[str], rows: list[list], flex: int | None = None, width: int = TABLE_WIDTH,
                  gap: int = 2) -> list[str]:
    """The command line's one table style (as `kernelcast report` prints): a header line, then
    one line per row; text left-aligned, numbers right-aligned, `gap` spaces between columns;
    column `flex` (e.g. a description) is cut with "..." so that a line fits `width`.

    >>> aligned_table(["task", "n", "what"], [["softmax", 12, "row-wise softmax of a long row"]], flex=2, width=24)
    ['task      n  what', 'softmax  12  row-wi...']
    """
    cells = [[f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v) for v in r] for r in rows]
    numeric = [all(isinstance(r[i], (int, float)) and not isinstance(r[i], bool) for r in rows) if rows else False
               for i in range(len(headers))]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    if flex is not None:
        others = sum(w for i, w in enumerate(widths) if i != flex) + gap * (len(headers) - 1)
        widths[flex] = max(len(headers[flex]), min(widths[flex], width - others))

    def line(values: list[str]) -> str:
        out = []
        for i, v in enumerate(values):
            if len(v) > widths[i]:
                v = v[: max(0, widths[i] - 3)] + "..."
            out.append(v.rjust(widths[i]) if numeric[i] else v.ljust(widths[i]))
        return (" " * gap).join(out).rstrip()

    return [line(headers)] + [line(r) for r in cells]
