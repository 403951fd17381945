"""`kernelcast report`: the newest evaluation's forecaster table, every split.

    kernelcast report                 # text, 80 columns
    kernelcast report --json          # {"dataset_version", "held_out_task", "report", "pages",
                                      #  "evaluation_run_id", "evaluation_run_url",
                                      #  "evaluation_dagster_run_id", "evaluation_dagster_run_url",
                                      #  "empty_splits", "same_as", "selective_external",
                                      #  "forecasters": [...], "promotion", "aliases"}
    kernelcast report --split external

Each forecaster row of a registered version carries its MLflow run (run_id, mlflow_url) and the
Dagster run that made it (dagster_run_id, dagster_url). Links are printed on the ports the UIs
serve this home on now (`kernelcast ui` running: its ports, orchestration.links.live_ports; else
the ports the home was last served on, else 3000 and 5000), whatever ports served when the
report was written; the report's pages are paths under the home it is read from (a moved home
prints its own). A split whose numbers equal another's for every forecaster (`same_as`: source
only, when no forecaster reads generator metadata) is one line.
"""

from __future__ import annotations

import json

import typer

from pipelines.evaluation.forecaster_table import TABLE_FILE, short_name, text_table


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


def cross_hardware_lines(settings, version: str) -> tuple[list[str], list[dict]]:
    """Three lines per card other than the reference (pipelines.evaluation.cross_hardware.headline),
    within 100 columns: the card and the share of kernels in the same bin on both cards; the best
    zero-shot and calibrated (at most 300 of the card's pairs) Brier with the gap to the reference
    card's in-distribution Brier; the best fitted on all of the card's pairs. Then the page, under
    the home the report is read from; and the headlines themselves. Nothing when the version's
    report has no such page."""
    from pipelines.evaluation.cross_hardware import FOLDER, SUMMARY_FILE, headline

    path = settings.reports_dir / version / FOLDER / SUMMARY_FILE
    if not path.is_file():
        return [], []
    try:
        summary = json.loads(path.read_text())
        heads = [headline(card) for card in summary.get("cards", [])]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:  # a cut or hand-edited file
        return [f"cross-hardware: {path} unreadable ({type(exc).__name__}); the page beside it may hold the figures"], []

    def best(h) -> str:
        return f"{h[0]} {h[1]:.3f}" + (f" on {h[2]} pairs" if len(h) > 2 else "") if h else "-"

    lines = []
    for h in heads:
        gap = f" ({h['calibrated_gap']:+.3f} from in distribution)" if h["calibrated_gap"] is not None else ""
        same = f" (same bin on both cards: {h['same_bin']:.1%} of kernels)" if h["same_bin"] is not None else ""
        lines += [f"cross-hardware {h['hardware_id']}{same}:",
                  f"  zero shot {best(h['zero_shot'])}; calibrated {best(h['calibrated'])}{gap}",
                  f"  fitted on all its pairs {best(h['fitted'])}"]
    if lines:
        lines.append(f"  page: {path.parent / 'index.html'}")
    return lines, heads


URL_KEYS = {"mlflow_url": "mlflow", "dagster_url": "dagster", "evaluation_run_url": "mlflow",
            "evaluation_dagster_run_url": "dagster"}


def relinked(table: dict, ports: dict[str, int]) -> dict:
    """The table with every UI link on `ports` ({"dagster": N, "mlflow": M})."""
    from orchestration.links import relink

    def move(d: dict) -> dict:
        return {k: relink(v, ports[URL_KEYS[k]]) if k in URL_KEYS else v for k, v in d.items()}

    return {**move(table), "forecasters": [move(r) for r in table.get("forecasters", [])]}


def located(table: dict, home) -> dict:
    """The table with its report pages as paths under `home`, the home it is read from (the
    table stores them relative to the home it was written in)."""
    from pipelines.evaluation.version_report import page_path

    out = dict(table)
    if table.get("report"):
        out["report"] = str(page_path(home, table["report"]))
    out["pages"] = {s: str(page_path(home, p)) for s, p in (table.get("pages") or {}).items()}
    return out


def promotion_lines(settings) -> tuple[list[str], dict[str, list[str]]]:
    """The newest promotion decision of each champion alias as one line (the version, its kind,
    its Brier on how many pairs of which split, the outcome), and model ref -> the aliases each
    decision left on it (champions and challengers), read from the warehouse; nothing when no
    decision was recorded yet (pipelines.promotion.summary)."""
    from pipelines.promotion.summary import read_summary

    summary = read_summary(settings.warehouse_path)
    return summary.lines(), summary.aliases


def table_lines(table: dict, aliases: dict[str, list[str]] | None = None, links: bool = False) -> list[str]:
    """Every split as text under a title line (an empty split: its reason), its champions and
    challengers marked; then where the report is. With `links`, the MLflow and Dagster runs of the
    evaluation and of every registered forecaster follow (without: one line saying how to get them)."""
    from pipelines.surrogates.roles import SPLITS, ordered_splits, split_title

    lines = []
    empty = table.get("empty_splits") or {}
    for split in ordered_splits({*SPLITS, *empty, *(r["split"] for r in table["forecasters"])}):
        title = split_title(split)
        rows = [r for r in table["forecasters"] if r["split"] == split]
        extra = f" {table.get('held_out_task')}" if split == "held_out_task" and table.get("held_out_task") else ""
        same = (table.get("same_as") or {}).get(split)
        if rows and same:
            what = " (generator metadata withheld)" if split == "source_only" else ""
            lines.append(f"{split.replace('_', ' ')}{what}: the same numbers as {same.replace('_', ' ')}, "
                         "every forecaster")
        elif rows:
            lines += [f"{title}{extra}:", *text_table(rows, aliases)]
            sel = table.get("selective_external") or {}
            if split == "external" and sel.get("best"):
                lines += ["  cover: coverage at which the most confident forecasts reach the best Brier,",
                          f"         {sel['target_brier']:.3f} ({short_name(sel['best'])})"]
        elif split in empty:
            lines.append(f"{title}{extra}: empty ({empty[split]})")
    if table.get("report"):
        line = f"report: {table['report']}"
        lines.append(line + " (one page per split)" if len(line) <= 80 else line)  # a long path alone
    if not links:
        if table.get("evaluation_run_id") or any(r.get("run_id") for r in table["forecasters"]):
            lines.append("MLflow and Dagster runs of each forecaster: kernelcast report --links (or --json)")
        return lines
    lines += [f"  {split}: {path}" for split, path in (table.get("pages") or {}).items()
              if path != table.get("report")]
    if table.get("evaluation_run_id"):
        lines.append(f"evaluation run: {table['evaluation_run_id']} {table.get('evaluation_run_url') or ''}".rstrip())
    if table.get("evaluation_dagster_run_id"):
        lines.append(f"  made by Dagster run {table['evaluation_dagster_run_id']} "
                     f"{table.get('evaluation_dagster_run_url') or ''}".rstrip())
    runs = sorted({(r["name"], r["run_id"], r.get("mlflow_url") or "", r.get("dagster_run_id") or "",
                    r.get("dagster_url") or "") for r in table["forecasters"] if r.get("run_id")})
    for name, run_id, url, dagster_run, dagster_url in runs:
        lines.append(f"run {short_name(name)}: {run_id} {url}".rstrip())
        if dagster_run:
            lines.append(f"  made by Dagster run {dagster_run} {dagster_url}".rstrip())
    return lines


def report(
    profile: str | None = typer.Option(None, "--profile", help="smoke | default | gpu"),
    split: str | None = typer.Option(None, "--split", help="in_distribution | source_only | held_out_task | "
                                                           "held_out_style:<style> | external | library (default: all)"),
    links: bool = typer.Option(False, "--links", help="Also print the MLflow and Dagster runs of the evaluation "
                                                      "and of every registered forecaster."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output (links and aliases included)."),
) -> None:
    """Print the newest evaluation report: the promotion decisions (which version each champion
    alias names, its Brier and on which split), then one table per split with 95% intervals and
    the aliases marked, then where the report is."""
    from orchestration.cli_common import CliError, _print_json, _settings
    from orchestration.links import live_ports
    from pipelines.surrogates.roles import SPLITS, ordered_splits

    settings = _settings(profile)
    table = newest_table(settings)
    if table is None:
        raise CliError("no evaluation report yet: run `kernelcast run` first")
    known = ordered_splits({*SPLITS, *(r["split"] for r in table["forecasters"])})
    if split is not None and split not in known:
        raise CliError(f"unknown split {split!r}; use one of {', '.join(known)}")
    table = relinked(located(table, settings.home), live_ports(settings.home))
    if split:
        table = {**table, "forecasters": [r for r in table["forecasters"] if r["split"] == split], "same_as": {}}
    decisions, aliases = promotion_lines(settings)
    cards, heads = cross_hardware_lines(settings, table["dataset_version"])
    if as_json:
        _print_json({**table, "promotion": decisions, "aliases": aliases, "cross_hardware": heads})
        return
    typer.echo(f"dataset {table['dataset_version']}")
    for line in decisions + table_lines(table, aliases, links=links) + ([] if split else cards):
        typer.echo(line)
