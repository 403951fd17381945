"""What `kernelcast run` shows: one line per asset, a live line with a bar on the step running,
the promotion decision and the final table; everything else goes to the run's log file.

Third-party output (pip and library warnings, Hugging Face and tqdm bars, MLflow's INFO lines,
the trainer's dicts, Dagster's own console log) is silenced at the entry point: while the graph
runs, this process's stdout and stderr (file descriptors 1 and 2, so child processes too) point
at $KERNELCAST_HOME/logs/run-<time>.log, and the display writes to the terminal it saved first.

The live line must not take sys.stdout / sys.stderr back: rich's Progress replaces them by
default with proxies that print onto its console, which is the terminal. Dagster's console
handler, created after the display starts, would then write every DEBUG event to the screen
(in a terminal only: rich redirects only when its console is one, so a pipe looked clean).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestration.runner import PROGRESS

QUIET_ENV = {
    "TQDM_DISABLE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "PYTHONWARNINGS": "ignore",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
NAME_WIDTH = 24
SCREEN_WIDTH = 100  # the run's screen: the CLI caps its console there
DETAIL_WIDTH = 80 - 16 - NAME_WIDTH  # "  ok NAME  12.3 s  detail" fits 80 columns
# The live line: spinner, text, a 16-wide bar, "12/15" and "0:01:23" fit 80 columns with 46 of text.
DESCRIPTION_WIDTH = 46


def quiet_third_parties() -> None:
    """Environment and logger levels that keep library chatter out (set before they import)."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    warnings.simplefilter("ignore")
    for name in ("mlflow", "alembic", "transformers", "datasets", "peft", "trl", "accelerate", "dagster",
                 "httpx", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)


@contextlib.contextmanager
def output_to(logfile: io.TextIOBase) -> Iterator[tuple[io.TextIOBase, io.TextIOBase]]:
    """Point fds 1 and 2 at `logfile` for the block; yields (terminal stdout, terminal stderr)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    out = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    err = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    os.dup2(logfile.fileno(), 1)
    os.dup2(logfile.fileno(), 2)
    try:
        yield out, err
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        err.flush()
        out.flush()


def step_activity(message: str) -> str:
    """What a step's log line says it is doing, for the live line: "[i/n]" first, then its words.

    >>> step_activity("[3/9] layer_norm: 4 kernels")
    '3/9 layer_norm: 4 kernels'
    >>> step_activity("fitting cost_model on 1500 pairs\\nmore")
    'fitting cost_model on 1500 pairs'
    """
    first = message.strip().splitlines()[0] if message.strip() else ""
    m = PROGRESS.search(first)
    if m:
        rest = (first[: m.start()] + first[m.end():]).strip(" :-")
        return f"{m.group(1)}/{m.group(2)}" + (f" {rest}" if rest else "")
    return first


def check_reason(evaluation) -> str:
    """Why a check did not pass, in one line: its description (what it found), else nothing."""
    text = (getattr(evaluation, "description", None) or "").strip()
    first = text.splitlines()[0] if text else ""
    return first if len(first) <= 2 * DETAIL_WIDTH else first[: 2 * DETAIL_WIDTH - 3] + "..."


def asset_detail(meta: dict[str, Any]) -> str:
    """A few words from an asset's metadata: its rows, what changed, a decision.

    >>> asset_detail({"rows": 12, "rows_added": 3, "table": "pairs"})
    '12 rows (3 added)'
    >>> asset_detail({"outcome": "kept", "reason": "version 2 does not beat 1"})
    'kept: version 2 does not beat 1'
    """
    if "outcome" in meta:
        text = f"{meta['outcome']}: {meta.get('reason', '')}"
    elif "rows" in meta:
        text = f"{meta['rows']} rows" + (f" ({meta['rows_added']} added)" if "rows_added" in meta else "")
        if meta.get("measuring_steps"):
            text += f", {meta['measuring_steps']} measuring step(s)"
    elif "versions" in meta and "registered_model" in meta:
        text = f"{meta['registered_model']} versions {meta['versions']}"
    elif "base_model" in meta:
        text = f"{meta['base_model']}, {meta.get('parameters', '?')} parameters"
    elif "dataset_version" in meta:
        text = f"dataset {meta['dataset_version']}"
    else:
        text = ""
    return text if len(text) <= DETAIL_WIDTH else text[: DETAIL_WIDTH - 3] + "..."


class RunDisplay:
    """Turns the event stream of the runs into lines and one live progress line (rich): the bar
    counts the run's assets materialised of those planned, the text names the step running and,
    when the step logs "[i/n]" (kernel_candidates does, per task), how far it is."""

    def __init__(self, console) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self.console = console
        # redirect_*=False: see the module docstring (library output stays in the log file).
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=16),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True,
                                 redirect_stdout=False, redirect_stderr=False)
        self.task = None
        self.mark = time.time()
        self.job, self.step, self.inner = "", "", ""

    def __enter__(self) -> RunDisplay:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def _describe(self) -> None:
        if self.task is not None:
            from rich.markup import escape

            text = f"{self.step}" + (f" {self.inner}" if self.inner else "")
            self.progress.update(self.task, description=escape(text[:DESCRIPTION_WIDTH]))

    def run_started(self, job: str, partition: str | None) -> None:
        from rich.markup import escape

        self.console.print(f"[bold]{job}[/]" + (escape(f" [{partition}]") if partition else ""), highlight=False)
        self.mark = time.time()
        self.job, self.step, self.inner = job, "starting", ""
        if self.task is None:
            self.task = self.progress.add_task(job, total=None)
        else:
            self.progress.reset(self.task, total=None)
        self._describe()

    def __call__(self, entry) -> None:
        ev = entry.dagster_event
        if ev is None:  # a step's own log line: what it is doing now, "[i/n]" how far
            if entry.level >= logging.INFO and entry.user_message:
                self.inner = step_activity(entry.user_message)
                self._describe()
            return
        kind = ev.event_type_value
        if kind == "ASSET_MATERIALIZATION_PLANNED" and self.task is not None:
            total = self.progress.tasks[self.task].total or 0
            self.progress.update(self.task, total=total + 1)
        elif kind == "STEP_START":
            self.step, self.inner = (ev.step_key or "").split(".")[0].split("[")[0], ""
            self._describe()
        elif kind == "ASSET_MATERIALIZATION":
            m = ev.step_materialization_data.materialization
            meta = {k: getattr(v, "value", v) for k, v in m.metadata.items()}
            seconds = entry.timestamp - self.mark
            self.mark = entry.timestamp
            name = m.asset_key.to_user_string()
            if self.task is not None:
                self.progress.advance(self.task)
            self.console.print(f"  [green]ok[/] {name:<{NAME_WIDTH}} {seconds:6.1f} s  {asset_detail(meta)}",
                               highlight=False)
        elif kind == "ASSET_CHECK_EVALUATION":
            c = ev.event_specific_data
            if not c.passed:
                from rich.markup import escape

                error = c.severity.value == "ERROR"
                word = "[red]FAILED check[/]" if error else "[yellow]warning[/]"
                why = check_reason(c)
                head = f"     {word} {c.check_name}"
                plain = len(f"     {'FAILED check' if error else 'warning'} {c.check_name}: {why}")
                if why and plain > SCREEN_WIDTH:  # the reason on a line of its own, never wrapped mid-word
                    self.console.print(head + ":", highlight=False)
                    self.console.print(f"       {escape(why[:SCREEN_WIDTH - 7])}", highlight=False)
                else:
                    self.console.print(head + (f": {escape(why)}" if why else ""), highlight=False)
        elif kind == "STEP_FAILURE":
            self.console.print(f"  [red]FAILED[/] {ev.step_key}", highlight=False)


def summary_json(settings, summaries, log_path: Path, headline: dict[str, Any]) -> dict[str, Any]:
    """What `kernelcast run --json` prints."""
    return {
        "profile": settings.profile, "home": str(settings.home), "log": str(log_path),
        "success": all(s.success for s in summaries),
        "runs": [{"job": s.job, "partition": s.partition, "run_id": s.run_id, "success": s.success,
                  "seconds": round(s.seconds, 1), "materialized": s.materialized, "checks_failed": s.checks_failed,
                  "checks_warned": s.checks_warned, "error": s.error} for s in summaries],
        "promotion": next((s.promotion for s in summaries if s.promotion), {}),
        **headline,
    }
