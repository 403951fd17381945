"""`kernelcast search-sim`: the budgeted search simulated on the measured space.

Registered in orchestration/cli.py. Reads the warehouse of $KERNELCAST_HOME when it holds
measurements of the hardware, else the committed files under data/measurements.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from orchestration.cli_common import (
    CliError,
    JsonOpt,
    ProfileOpt,
    _print_json,
    _settings,
    one_line_errors,
)


def _table(settings, hardware_id: str, source: str):
    """(table, where it came from): the warehouse if it has measurements of `hardware_id`."""
    from pipelines.search.table import load_table_parquet, load_table_warehouse

    if source in ("auto", "warehouse") and settings.warehouse_path.exists():
        from warehouse.db import connect

        try:
            with connect(settings.warehouse_path, read_only=True) as con:
                return load_table_warehouse(con, hardware_id), str(settings.warehouse_path)
        except ValueError:
            if source == "warehouse":
                raise
    if source == "warehouse":
        raise CliError(f"no warehouse at {settings.warehouse_path}; run `kernelcast run` or use --source data")
    return load_table_parquet(settings.measurements_dir, hardware_id), str(settings.measurements_dir)


@one_line_errors
def search_sim(
    task: list[str] = typer.Option(None, "--task", help="Task to simulate (repeatable; default: every measured task)."),
    forecaster: str = typer.Option(None, "--forecaster",
                                   help="oracle | uniform | bin-prior | file:PATH | a registered reference "
                                        "(default: the profile's, search.forecaster)."),
    seeds: int = typer.Option(None, "--seeds", min=1, help="Seeds per task and mode (default: the profile's)."),
    budget: int = typer.Option(None, "--budget", min=1, help="GPU measurements per run (default: the profile's)."),
    anchor: str = typer.Option(None, "--anchor", help="Forecast anchor: reference | parent."),
    hardware: str = typer.Option(None, "--hardware", help="Hardware id of the measurements."),
    source: str = typer.Option("auto", "--source", help="auto | warehouse | data (the committed files)."),
    out: Path = typer.Option(None, "--out", help="Also write the full report (JSON, runs and curves) here."),
    png: Path = typer.Option(None, "--png", help="Also draw the curves into this PNG."),
    profile: str | None = ProfileOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Simulate PUCT search on the measured space: standard, surrogate-filtered, random-filtered
    and selective at the same GPU budget; per task, the mean best speedup over seeds."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from pipelines.search.forecasters import ForecasterContext
    from pipelines.search.report import (
        comparison_lines,
        contract_json,
        curves_figure,
        search_report,
    )
    from pipelines.search.simulate import SimulationPlan
    from pipelines.tasks import task_names

    settings = _settings(profile)
    sc = settings.search
    if source not in ("auto", "warehouse", "data"):
        raise CliError(f"--source must be auto, warehouse or data, got {source!r}")
    hw = hardware or sc.hardware_id
    table, origin = _table(settings, hw, source)
    names = task or list(sc.tasks) or [t for t in task_names() if t in table.tasks()]
    unknown = [t for t in names if t not in task_names()]
    if unknown:
        raise CliError(f"unknown task {unknown[0]!r}; known tasks: {', '.join(task_names())}")
    plan = SimulationPlan(tasks=tuple(names), seeds=seeds or sc.seeds, budget=budget or sc.budget,
                          anchor=anchor or sc.anchor, hardware_id=hw)
    name = forecaster or sc.forecaster
    from pipelines.search.registered import register_search_forecasters

    register_search_forecasters()
    ctx = ForecasterContext(tracking_uri=settings.mlflow_uri, home=settings.home)
    console = Console(stderr=True)
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        job = bar.add_task("simulating", total=len(plan.configs(name)))
        report = search_report(plan, table, name, ctx, progress=lambda done, n: bar.update(job, completed=done))
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, default=str))
    if png:
        png.parent.mkdir(parents=True, exist_ok=True)
        png.write_bytes(curves_figure(report))
    if as_json:
        _print_json({**contract_json(report), "source": origin})
    else:
        for line in comparison_lines(report):
            typer.echo(line)


@one_line_errors
def export_forecaster(
    model: str = typer.Argument("kind:cost_model", help="kind:cost_model, models:/NAME@ALIAS or models:/NAME/VERSION."),
    out: Path = typer.Option(..., "--out", help="The forecaster file to write (a pickle, without base-model weights)."),
    compile_workers: int = typer.Option(12, "--compile-workers", min=0,
                                        help="Where it runs: compile unknown candidates in this many processes (0: never)."),
    profile: str | None = ProfileOpt,
) -> None:
    """Write a registered cost model or code-embed version as a forecaster file for a GPU host
    without MLflow (`python3 -m pipelines.search.live --forecaster-file`, the autotune hook,
    benchmarks/forecast.py): a cost model needs numpy and pandas only; a code-embed version
    (its head, axes and calibrator) also torch, transformers and, for SmolLM2, the gguf package
    and $KERNELCAST_BASE_GGUF naming the GGUF it reads."""
    import pickle

    from pipelines.search.registered import portable_forecaster

    settings = _settings(profile)
    try:
        forecaster = portable_forecaster(model, settings.mlflow_uri, settings.home, compile_workers)
    except ValueError as e:
        raise CliError(str(e)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    tmp.write_bytes(pickle.dumps(forecaster))
    tmp.replace(out)
    typer.echo(f"{forecaster.name}: {len(forecaster.features)} kernels' compile features -> {out} "
               f"({out.stat().st_size / 1e6:.1f} MB)")
    if hasattr(forecaster, "host_needs"):
        typer.echo(f"where it runs it needs {forecaster.host_needs()}")


def search_headline(settings) -> list[str]:
    """The last search_simulation's comparison (for `kernelcast run`); nothing if there is none."""
    from pipelines.search.report import comparison_lines

    path = settings.reports_dir / "search" / settings.search.hardware_id / "search.json"
    if not path.is_file():
        return []
    try:
        return ["search simulation:", *comparison_lines(json.loads(path.read_text()))]
    except Exception as e:  # noqa: BLE001 - a summary never fails a finished run
        return [f"(no search summary: {type(e).__name__}: {e})".splitlines()[0]]
