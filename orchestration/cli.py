"""The `kernelcast` command line. Stable contracts: see docs/architecture.md, "Command line".

Every command prints a clear one-line error and exits non-zero on bad input; reporting commands
take --json. Heavy imports happen inside commands so `--help` stays fast.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import typer

from models.registry import SURROGATE_MODEL  # a package of constants: cheap at start-up
from orchestration.cli_common import (
    CliError,
    JsonOpt,
    KernelcastGroup,
    ProfileOpt,
    _print_json,
    _settings,
    one_line_errors,
)

# Markdown help: paragraphs of a docstring are re-flowed to the terminal's width (typer's
# "rich" mode keeps the docstring's own line breaks, which cut sentences in the middle).
app = typer.Typer(
    cls=KernelcastGroup,
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode="markdown",
    help="kernelcast: LLM surrogates of GPU kernel runtime (generate, profile, curate, train, evaluate, search).",
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"kernelcast {version('kernelcast')}")
        except PackageNotFoundError:  # a checkout run without `pip install -e .`
            typer.echo("kernelcast (not installed: run `make install`)")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                       help="Print the version and exit.")) -> None:
    """kernelcast: LLM surrogates of GPU kernel runtime (generate, profile, curate, train, evaluate, search)."""


# ---- run ----------------------------------------------------------------------------------
@app.command()
@one_line_errors
def run(profile: str | None = ProfileOpt,
        as_json: bool = typer.Option(False, "--json", help="Print the runs and the final table as JSON.")) -> None:
    """Materialise the whole asset graph into $KERNELCAST_HOME (the main job).

    Runs the code location's jobs (candidates_job, measurement_ingest_job per hardware,
    downstream_job) on the Dagster instance under $KERNELCAST_HOME/dagster, which `kernelcast ui`
    (or `dg dev` with DAGSTER_HOME set to that folder) shows. The screen gets one line per
    asset, a live line, the promotion decision and the table; library output goes to the log
    file named in the second line."""
    from orchestration.run_display import quiet_third_parties

    quiet_third_parties()  # before the libraries it quiets are imported
    import time

    from rich.console import Console

    from orchestration.run_display import RunDisplay, output_to, summary_json
    from orchestration.runner import prepare_home, run_graph

    settings = _settings(profile)
    prepare_home(settings)
    log_path = settings.home / "logs" / f"run-{time.strftime('%Y%m%d-%H%M%S')}.log"
    t0 = time.perf_counter()
    with open(log_path, "a", buffering=1) as logfile, output_to(logfile) as (out, err):
        console = Console(file=err, width=min(Console(file=err).width, 100))
        if not as_json:
            console.print(f"kernelcast run: profile [bold]{settings.profile}[/], home {settings.home}", highlight=False)
            console.print(f"log: {log_path}", highlight=False)
        display = RunDisplay(Console(file=err if not as_json else open(os.devnull, "w")))  # noqa: SIM115
        with display:
            summaries = run_graph(settings, listener=display, on_run_start=display.run_started)
    failed = next((s for s in summaries if not s.success), None)
    version, counts, metrics = _newest_report(settings)
    if as_json:
        _print_json(summary_json(settings, summaries, log_path, {"dataset_version": version, "counts": counts,
                                                                   "forecasters": metrics}))
    else:
        for line in _run_headline(settings) + search_headline(settings):
            typer.echo(line, err=True)
    if failed is not None:
        raise CliError(f"{failed.error} (log: {log_path}; run {failed.run_id[:8]} in `kernelcast ui`)")
    if not as_json:
        typer.echo(f"done in {time.perf_counter() - t0:.0f} s. State in {settings.home}; "
                   "`kernelcast ui` opens Dagster and MLflow.", err=True)


HEADLINE_METRICS = ("n", "brier", "ece", "recovered_mean", "parse_rate")
HEADLINE_LABELS = ("n", "Brier", "ECE", "recovered", "parse")  # fits 80 columns


def headline_lines(version: str, counts: dict, metrics: dict[str, dict]) -> list[str]:
    """What a run produced, in numbers: the dataset version and the calibration report's
    headline metrics per forecaster (evaluation report of that version), as text lines of at
    most 80 columns."""
    lines = [f"dataset {version}: {counts.get('n_measurements', '?')} measurements, {counts.get('n_pairs', '?')} pairs"]
    if metrics:
        width = min(32, max(len(m) for m in [*metrics, "forecaster"]))
        widths = [6, 8, 8, 10, 7]
        lines.append(f"{'forecaster':<{width}}" + "".join(f"{c:>{w}}" for c, w in zip(HEADLINE_LABELS, widths)))
        for model, r in metrics.items():
            cells = [f"{r[c]:>{w}.4f}" if isinstance(r.get(c), float) else f"{r.get(c, '-')!s:>{w}}"
                     for c, w in zip(HEADLINE_METRICS, widths)]
            lines.append(f"{model[:width]:<{width}}" + "".join(cells))
    return lines


def _newest_report(settings) -> tuple[str | None, dict, dict]:
    """(newest dataset version, its counts, its calibration report's metrics); Nones when absent."""

    from warehouse.datasets import list_dataset_versions
    from warehouse.db import connect

    if not settings.warehouse_path.exists():
        return None, {}, {}
    with connect(settings.warehouse_path, read_only=True) as con:
        versions = list_dataset_versions(con)
    if versions.is_empty():
        return None, {}, {}
    newest = versions.row(0, named=True)
    counts = newest["counts"] if isinstance(newest["counts"], dict) else json.loads(newest["counts"] or "{}")
    report = settings.reports_dir / newest["dataset_version"] / "metrics.json"
    metrics = json.loads(report.read_text()) if report.is_file() else {}
    return newest["dataset_version"], counts, metrics


def _run_headline(settings) -> list[str]:
    """headline_lines of the newest dataset version; nothing when there is none yet."""
    try:
        version, counts, metrics = _newest_report(settings)
        if version is None:
            return []
        table = newest_table(settings)
        if table is None:
            return headline_lines(version, counts, metrics)
        decisions, aliases = promotion_lines(settings)
        cards, _ = cross_hardware_lines(settings, version)
        return headline_lines(version, counts, {})[:1] + decisions + table_lines(table, aliases) + cards
    except Exception as e:  # noqa: BLE001 - a summary never fails a finished run
        return [f"(no summary: {type(e).__name__}: {e})".splitlines()[0]]


# ---- tasks --------------------------------------------------------------------------------
@app.command()
@one_line_errors
def tasks(as_json: bool = JsonOpt) -> None:
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
    from orchestration.cli_common import aligned_table

    typer.echo(f"{len(items)} kernel tasks (cases: correctness checks on the CPU, benchmark shapes on the GPU)")
    rows = [[it["task"], it["source"], len(it["correctness_cases"]), len(it["benchmark_cases"]),
             " ".join(it["description"].split())] for it in items]
    for line in aligned_table(["task", "source", "correctness", "benchmark", "description"], rows, flex=4):
        typer.echo(line)


# ---- ingest -------------------------------------------------------------------------------
@app.command()
@one_line_errors
def ingest(
    files: list[Path] = typer.Argument(..., help="Result or kernel Parquet files, or folders of them."),
    profile: str | None = ProfileOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Load measurement result (and kernel) files into the warehouse, file by file: good files go
    in, each refused file gets one line and the exit code is 2. Idempotent."""
    from orchestration.cli_common import ensure_tasks
    from warehouse.db import connect
    from warehouse.ingest import ingest_all

    settings = _settings(profile)
    with connect(settings.warehouse_path) as con:
        ensure_tasks(con)
        outcome = ingest_all(con, files)
    reports, errors = outcome.reports, outcome.errors
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
def dataset(profile: str | None = ProfileOpt, as_json: bool = JsonOpt) -> None:
    """Counts of the measured dataset by task, hardware, bin and status, read from DuckDB.

    Two counts, labelled: every measurement the warehouse holds (failed ones and every protocol
    included), and the measurements the current dataset version's pairs use (what `kernelcast
    run` reports: correct measurements of the labelling protocol that make a pair)."""
    from pipelines.curation.summary import dataset_summary
    from warehouse.datasets import list_dataset_versions
    from warehouse.db import connect
    from warehouse.measurements import measurements_frame

    settings = _settings(profile)
    if not settings.warehouse_path.exists():
        raise CliError(f"no warehouse at {settings.warehouse_path}; run `kernelcast run` or `kernelcast ingest` first")
    with connect(settings.warehouse_path, read_only=True) as con:
        frame = measurements_frame(con)
        versions = list_dataset_versions(con)
    summary = dataset_summary(frame)
    summary["by_task_hardware"] = _by_task_hardware(frame)
    newest = versions.row(0, named=True) if not versions.is_empty() else None
    if newest is not None:
        counts = newest["counts"] if isinstance(newest["counts"], dict) else json.loads(newest["counts"] or "{}")
        summary["dataset_version"] = {"dataset_version": newest["dataset_version"],
                                      "n_measurements": counts.get("n_measurements"), "n_pairs": counts.get("n_pairs")}
    if as_json:
        _print_json(summary)
        return
    for line in dataset_lines(summary):
        typer.echo(line)


def _by_task_hardware(frame) -> list[dict]:
    """Per (task, hardware): measurements, failed ones, correct candidate kernels and their bins."""
    import polars as pl

    from models.bins import NUM_BINS, speedups_to_bins
    from pipelines.curation.pairs import labels

    if frame.height == 0:
        return []
    agg = frame.group_by("task", "hardware_id").agg(pl.len().alias("measurements"),
                                                    (pl.col("status") != "ok").sum().alias("failed"))
    rows = {(r["task"], r["hardware_id"]): {**r, "correct_kernels": 0, "by_bin": [0] * NUM_BINS}
            for r in agg.iter_rows(named=True)}
    lab = labels(frame)
    cand = lab.filter(pl.col("correct") & pl.col("speedup").is_not_null()
                      & (pl.col("generator").fill_null("") != "reference"))
    if cand.height:
        bins = speedups_to_bins(cand["speedup"].to_numpy())
        for task, hw, b in zip(cand["task"].to_list(), cand["hardware_id"].to_list(), bins.tolist()):
            row = rows.setdefault((task, hw), {"task": task, "hardware_id": hw, "measurements": 0, "failed": 0,
                                               "correct_kernels": 0, "by_bin": [0] * NUM_BINS})
            row["correct_kernels"] += 1
            row["by_bin"][b - 1] += 1
    return [{k: int(v) if isinstance(v, int) else v for k, v in r.items()} for _, r in sorted(rows.items())]


def dataset_lines(summary: dict) -> list[str]:
    """`kernelcast dataset` as text: the two counts, labelled, then one row per task and hardware."""
    from models.bins import BIN_NAMES, NUM_BINS
    from orchestration.cli_common import aligned_table

    status = summary.get("by_status", {})
    ok, n = status.get("ok", 0), summary.get("n_measurements", 0)
    lines = [f"warehouse: {n:,} measurements ({ok:,} ok, {n - ok:,} failed) of {summary.get('n_kernels', 0):,} kernels, "
             f"{summary.get('n_tasks', 0)} tasks, {summary.get('n_hardware', 0)} hardware"]
    ds = summary.get("dataset_version")
    if ds:
        lines += [f"dataset {ds['dataset_version']} (current): {ds['n_measurements'] or 0:,} of them make "
                  f"its {ds['n_pairs'] or 0:,} pairs", "  (correct measurements of the labelling protocol)"]
    else:
        lines.append("no dataset version yet: `kernelcast run` curates one")
    rows = [[r["task"], r["hardware_id"], r["measurements"], r["failed"], r["correct_kernels"], *r["by_bin"]]
            for r in summary.get("by_task_hardware", [])]
    # one space between columns: 13 of them, the 8 bins among them, fit 100 with any GPU type's id
    lines += ["", *aligned_table(["task", "hardware", "measured", "failed", "correct",
                                  *[f"b{b}" for b in range(1, NUM_BINS + 1)]], rows, gap=1)]
    lines += ["", "correct: correct candidate kernels (the reference not counted), b1..b8 their speedup bins:"]
    lines += ["  " + "; ".join(f"b{i + 1} {name}" for i, name in enumerate(BIN_NAMES[j:j + 4], start=j))
              for j in (0, 4)]
    failures = summary.get("by_failure_kind", {})
    if failures:
        import textwrap

        lines += textwrap.wrap("failed: " + ", ".join(f"{k} {v:,}" for k, v in failures.items()), 100,
                               subsequent_indent="  ")
    return lines


# ---- generate -----------------------------------------------------------------------------
@app.command()
@one_line_errors
def generate(
    task: str = typer.Option(..., "--task", help="Task name (see `kernelcast tasks`)."),
    count: int = typer.Option(100, "--count", min=1, help="Kernels to generate (the reference comes on top)."),
    out: Path = typer.Option(..., "--out", help="Kernel batch Parquet for the GPU worker and `kernelcast ingest`."),
    seed: int = typer.Option(0, help="Sampling seed: same seed, same kernels."),
    mode: str = typer.Option("lineage", help="lineage (mutation tree from the seed kernel) | uniform (stratified by algorithm)."),
    compile: bool = typer.Option(True, "--compile/--no-compile", help="AOT-compile for sm_90: registers, spills, shared memory."),
    check: bool = typer.Option(False, "--check/--no-check", help="Also check every kernel on CPU (Triton interpreter; slow)."),
    workers: int = typer.Option(2, help="Child processes for compiles and checks."),
) -> None:
    """Generate a batch of candidate kernels of one task, with lineage and compile features."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from pipelines.generation.candidates import build_candidates, write_batch
    from pipelines.tasks import get_task

    get_task(task)  # a one-line error naming the known tasks
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  transient=True) as bar:
        ids: dict[str, int] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in ids:
                ids[stage] = bar.add_task(f"{task}: {stage}", total=total)
            bar.update(ids[stage], completed=done, total=total)

        frame = build_candidates(task, count, seed=seed, compile=compile, check=check, progress=progress,
                                 mode=mode, n_workers=workers)
    path = write_batch(frame, out)
    compiled = int((frame["compile_status"] == "compiled").sum()) if compile else 0
    typer.echo(f"{path}: {frame.height} kernels ({frame['algorithm'].n_unique()} algorithms)"
               + (f", {compiled} compiled for sm_90" if compile else ""))


# ---- check --------------------------------------------------------------------------------
@app.command()
@one_line_errors
def check(
    task: str = typer.Option(..., "--task", help="Task name."),
    kernel: Path = typer.Option(..., "--kernel", exists=True, dir_okay=False, help="A module defining custom_kernel(data)."),
    timeout_s: float = typer.Option(120.0, help="Seconds before the kernel is killed."),
    as_json: bool = JsonOpt,
) -> None:
    """Check a kernel's correctness on the task's small cases on the CPU (Triton interpreter),
    in a sandboxed child process with a timeout, judged by a process the kernel never ran in.
    GPU MODE submissions (`from task import ...`, `from utils import ...`) run unmodified.
    Exit 0 if correct, 1 if not."""
    from pipelines.profiling.check import check_source
    from pipelines.profiling.layer_probe import probe
    from pipelines.profiling.sandbox_policy import policy_from_env
    from pipelines.tasks import get_task

    get_task(task)
    layers = probe(policy_from_env(), "cpu")  # the sandbox layers, and what this host lacks
    if not as_json:
        typer.echo(layers.line(), err=True)
    outcome = check_source(task, kernel.read_text(), timeout_s=timeout_s, device="cpu")
    report = {"task": task, "kernel": str(kernel), "ok": outcome.ok, "failure_kind": outcome.failure_kind,
              "message": outcome.message, "seconds": round(outcome.seconds, 3), "sandbox": outcome.sandbox,
              "sandbox_missing": layers.notes}
    if as_json:
        _print_json(report)
    else:
        typer.echo(f"{'ok' if outcome.ok else outcome.failure_kind}: {outcome.message} ({outcome.seconds:.1f} s)")
    if not outcome.ok:
        raise typer.Exit(1)


# ---- profile ------------------------------------------------------------------------------
@app.command()
@one_line_errors
def profile(
    batch: Path = typer.Option(..., "--batch", exists=True, dir_okay=False, help="Kernel batch Parquet (kernel_id, task, source)."),
    out: Path = typer.Option(..., "--out", help="Result Parquet; rerun with the same path to resume."),
    device: str = typer.Option("cuda", help="cuda (full protocol) | cpu (interpreter, correctness cases; for tests)."),
    time_budget_s: float | None = typer.Option(None, help="Stop cleanly before this much wall time."),
    compile_workers: int = typer.Option(8, help="Parallel compile processes."),
) -> None:
    """Measure a batch on this host's GPU (the worker runs untrusted kernels in child processes)."""
    import torch

    from pipelines.profiling.launch import run_worker

    if device == "cuda" and not torch.cuda.is_available():
        raise CliError("no CUDA GPU on this host; use --device cpu for an interpreter run, or run the worker on a GPU host")
    rc = run_worker(batch, out, device=device, time_budget_s=time_budget_s, compile_workers=compile_workers)
    if rc != 0:
        raise typer.Exit(rc)


# ---- evaluate -----------------------------------------------------------------------------
@app.command()
@one_line_errors
def evaluate(
    forecasts: Path = typer.Option(..., "--forecasts", exists=True, dir_okay=False,
                                   help="Parquet: pair_id, task, true_speedup, p1..p8 [, predicted_bin, repeat, parse_ok]."),
    n_boot: int = typer.Option(1000, help="Bootstrap replicates for the 95% intervals."),
    report: Path | None = typer.Option(None, help="Also write an HTML report into this folder."),
    as_json: bool = JsonOpt,
) -> None:
    """Score a forecasts file: Brier, CRPS, NLL, accuracy, ECE, AURC, speedup recovered (method.md)."""
    import polars as pl
    from rich.progress import Progress

    from pipelines.evaluation.evaluate import evaluate_forecasts
    from pipelines.evaluation.report import write_report
    from pipelines.evaluation.suite import HEADLINE

    try:
        frame = pl.read_parquet(forecasts)
    except Exception as exc:
        raise CliError(f"{forecasts}: not a readable Parquet file ({type(exc).__name__})") from exc
    with Progress(transient=True) as bar:
        t = bar.add_task("bootstrap", total=n_boot)
        result = evaluate_forecasts(frame, n_boot=n_boot, progress=lambda done, total: bar.update(t, completed=done, total=total))
    if report:
        typer.echo(f"report: {write_report({forecasts.stem: result}, report)}", err=True)
    if as_json:
        _print_json({k: v for k, v in result.items() if k != "curves"})
        return
    for k in HEADLINE:
        v = result.get(k)
        ci = (result.get("intervals") or {}).get(k)
        typer.echo(f"{k:<22} {v:.4f}" + (f"  [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "") if isinstance(v, float) else f"{k:<22} {v}")


# ---- forecast -----------------------------------------------------------------------------
CHAMPION_URI = f"models:/{SURROGATE_MODEL}@champion"


@app.command()
@one_line_errors
def forecast(
    task: str = typer.Option(..., "--task", help="Task name."),
    anchor: Path = typer.Option(..., "--anchor", exists=True, dir_okay=False, help="The anchor kernel module."),
    candidate: list[Path] = typer.Option(
        ..., "--candidate", exists=True,
        help="Candidate kernel modules or folders of *.py; more may follow as arguments: --candidate a.py b.py dir/."),
    more: list[Path] | None = typer.Argument(None, metavar="[CANDIDATE]...", exists=True, show_default=False,
                                             help="More candidates (files or folders)."),
    model: str | None = typer.Option(
        None, "--model",
        help="Default: models:/kernelcast-surrogate@champion-external when the registry has it, else "
             f"{CHAMPION_URI}, else 'smollm2'. Also models:/kernelcast-surrogate/N, kind:cost_model, "
             "baseline:uniform, 'smollm2' (embedded base model) or a local HF checkpoint dir."),
    hardware: str = typer.Option(
        "nvidia-h200-sm90",
        help="Hardware id of the card to forecast for: its fingerprint goes into the prompt, its stand-in device "
             "reads the files, and without --model its champion answers (@champion-<card>, e.g. champion-h100 for "
             "nvidia-h100-80gb-hbm3-sm90; else the reference card's champion, and the output says so)."),
    readout: str = typer.Option("logprob", help="logprob (next-token bin probabilities) | verbalized (JSON answer)."),
    style: str | None = typer.Option(None, help="full | diff | compact; default: the surrogate's training style, else diff."),
    endpoint: str | None = typer.Option(
        None, "--endpoint",
        help="An OpenAI-compatible server (e.g. http://host:8000/v1, vLLM serving openai/gpt-oss-20b); "
             "--model is then the served model name and the style defaults to full."),
    answer_mode: str = typer.Option("text", help="With --endpoint and verbalized: text | json_schema | tool."),
    check_kernels: bool = typer.Option(False, "--check/--no-check",
                                       help="Also run each file on the task's correctness cases under Triton's CPU "
                                            "interpreter (sandboxed) and refuse what fails there; the interpreter "
                                            "lacks parts of the GPU, so this is off by default."),
    check_timeout_s: float = typer.Option(60.0, help="Seconds per file for that check; longer is a note, not a refusal."),
    allow_incorrect: bool = typer.Option(False, "--allow-incorrect", help="Forecast files whose results are wrong."),
    profile: str | None = ProfileOpt,
    as_json: bool = typer.Option(False, "--json", help="Print a list of objects, one per candidate."),
) -> None:
    """Forecast each candidate's speedup over the anchor as a distribution over the 8 bins.

    One row per candidate: the file, the predicted bin, its probability, the expected log2
    speedup and the eight probabilities (--json: a list of objects). Files are read as the GPU
    would run them: imported, traced on each benchmark case and, for Triton, compiled for sm_90,
    on a stand-in device of --hardware, so launchers that ask the device, autotune or compile
    ahead are read like any other. A file is refused, in one line, only when it does not parse,
    defines no custom_kernel, does not import, or a Triton file does not compile for sm_90 on the
    task's benchmark input (with --check, also when it fails the CPU interpreter's check). With
    one candidate a refusal is the only line printed (exit 2); with several, a refused candidate
    is a row with its reason and the command exits 1 at the end; an answer that does not parse
    exits 1 too.

    Answers from the registered version for kernels from files (@champion-external, else
    @champion) when there is one, whatever its kind, else from the base model (the first call
    converts the embedded SmolLM2 GGUF into $KERNELCAST_HOME/models, a minute or two on a CPU).
    For a --hardware other than the reference card, the card's own champion (@champion-<card>)
    answers when it is set; when it is not, the output names the card the answering version was
    fitted on. With --endpoint, any OpenAI-compatible server answers instead."""
    from pipelines.forecasting import file_champion_uri, load_forecaster
    from pipelines.forecasting.load import card_champion_uri
    from pipelines.forecasting.snapshot import RegistrySnapshot
    from pipelines.tasks import TASK_MODULES

    settings = _settings(profile)
    if task not in TASK_MODULES:
        raise CliError(f"unknown task {task!r}; known tasks: {', '.join(TASK_MODULES)}")
    paths = _candidate_files([*candidate, *(more or [])])
    registry_uri = settings.mlflow_uri if (settings.home / "mlflow.db").is_file() else None
    auto = model is None and endpoint is None
    if endpoint is not None and not model:
        raise CliError("--endpoint needs --model: the served model name")
    if model and model.startswith("baseline:") and model != "baseline:uniform":
        raise CliError(f"{model} forecasts from measured pairs; on files only baseline:uniform applies")
    # The files are read (child processes: import, trace, compile) while the forecaster loads here.
    reading = _read_in_background(settings.home, task, [anchor, *paths], check=check_kernels,
                                  check_timeout_s=check_timeout_s, allow_incorrect=allow_incorrect,
                                  all_needed=len(paths) == 1, hardware=hardware)
    # the registry as an earlier command read it, while the store is unchanged: no MLflow to start
    snapshot = RegistrySnapshot(settings.home, registry_uri) if registry_uri else None
    ref = model or (None if endpoint else file_champion_uri(registry_uri, snapshot=snapshot))
    hardware_note = ""
    if auto and registry_uri:  # the card's own champion, else the reference card's, said so
        ref, hardware_note = card_champion_uri(registry_uri, hardware, ref, snapshot=snapshot)
    ref = ref or ("" if endpoint else "smollm2")
    try:
        forecaster = load_forecaster(ref, tracking_uri=settings.mlflow_uri, home=settings.home,
                                     warehouse_path=settings.warehouse_path, readout=readout, style=style,
                                     endpoint=endpoint, answer_mode=answer_mode, snapshot=True)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    files = reading()
    head, cands = files[0], files[1:]
    if head.refused:
        raise CliError(f"anchor {anchor}: {head.refused}")
    if len(cands) == 1 and cands[0].refused:
        raise CliError(f"{cands[0].path}: {cands[0].refused}")
    meta = {**_forecaster_meta(forecaster, ref, auto, readout), "hardware_id": hardware,
            **({"hardware_note": hardware_note} if hardware_note else {})}
    results = _forecast_files(forecaster, task, hardware, head, cands, single=len(cands) == 1)
    rows = [{**meta, "task": task, "anchor": str(anchor), **r} for r in results]
    if as_json:
        _print_json(rows)
    else:
        _print_forecast_table(rows, meta)
    if any(not r["ok"] for r in rows):
        raise typer.Exit(1)


def _read_in_background(home: Path, task: str, paths: list[Path], **options):
    """Start reading the files (pipelines.forecasting.files) in a thread; the call returned gives
    their KernelFiles (re-raising what the reading raised). Read sources are kept under
    <home>/feature-cache, so an anchor read by an earlier command is not read again."""
    import threading

    from pipelines.forecasting.files import read_kernel_files
    from pipelines.forecasting.source_features import FeatureCache

    out: dict = {}

    def read() -> None:
        try:
            out["files"] = read_kernel_files(task, paths, cache=FeatureCache(home / "feature-cache"), **options)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            out["error"] = exc

    # a daemon: a command that fails while loading its forecaster does not wait for the reading
    thread = threading.Thread(target=read, name="read-kernel-files", daemon=True)
    thread.start()

    def result():
        thread.join()
        if "error" in out:
            raise out["error"]
        return out["files"]

    return result


def _candidate_files(items: list[Path]) -> list[Path]:
    """Files as given, folders as their *.py files (sorted); a folder without one is an error."""
    out: list[Path] = []
    for p in items:
        if p.is_dir():
            found = sorted(q for q in p.glob("*.py") if q.is_file())
            if not found:
                raise CliError(f"{p}: a folder with no *.py kernel files")
            out.extend(found)
        else:
            out.append(p)
    return out


def _forecaster_meta(forecaster, ref: str, auto: bool, readout: str) -> dict:
    """What answered: model_ref, kind, source, the registered version if any, readout, style."""
    version = getattr(forecaster, "version", None)
    source = getattr(forecaster, "source", "") or forecaster.model_ref
    if auto and version is None:
        source = "base model (no registered surrogate @champion)"
    return {"model_ref": forecaster.model_ref, "kind": forecaster.kind, "source": source,
            "model_uri": getattr(forecaster, "uri", None), "model_version": version,
            "readout": readout if forecaster.kind == "llm" else "classical" if "model" in forecaster.kind else None,
            "style": getattr(forecaster, "style", None)}


def _forecast_files(forecaster, task: str, hardware: str, head, cands, single: bool) -> list[dict]:
    """One result per candidate: its forecast, or why there is none (refused, too long, unparsed)."""
    import numpy as np
    import polars as pl

    from models.bins import BIN_LOG2_VALUES

    kernels = {head.record["kernel_id"]: head.record}
    kernels.update({c.record["kernel_id"]: c.record for c in cands if c.record})
    ok = [c for c in cands if c.record]
    pairs = pl.DataFrame({"pair_id": [c.record["kernel_id"] for c in ok],
                          "anchor_kernel_id": [head.record["kernel_id"]] * len(ok),
                          "candidate_kernel_id": [c.record["kernel_id"] for c in ok],
                          "task": [task] * len(ok), "hardware_id": [hardware] * len(ok)},
                         schema={k: pl.Utf8 for k in ("pair_id", "anchor_kernel_id", "candidate_kernel_id", "task",
                                                      "hardware_id")})
    answers: dict[str, tuple] = {}  # kernel_id -> (p or None, error or None)
    if ok:
        try:
            got = forecaster.answer_pairs(pairs, kernels, strict=single)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        answers = dict(zip(pairs["pair_id"].to_list(), got, strict=True))
    out = []
    r = np.asarray(BIN_LOG2_VALUES, dtype=np.float64)
    for c in cands:
        p, error = answers.get(c.record["kernel_id"], (None, None)) if c.record else (None, c.refused)
        row = {"file": str(c.path), "ok": p is not None, "refused": c.refused, "parse_ok": p is not None,
               "error": None if c.refused else error,
               "notes": list(c.notes), "predicted_bin": None, "p_bin": None, "expected_log2": None, "p": p}
        if p is not None:
            b = int(np.argmax(p)) + 1
            row.update(predicted_bin=b, p_bin=float(p[b - 1]), expected_log2=float(np.dot(p, r)))
        out.append(row)
    return out


FORECAST_ROW = 65  # columns of a forecast row after its file: "  bin  p(bin)  E[log2 S]  p1..p8"


def _print_forecast_table(rows: list[dict], meta: dict) -> None:
    """One line per candidate (file, bin, p of it, E[log2 S], the eight probabilities)."""
    import textwrap

    from models.bins import BIN_NAMES

    columns = shutil.get_terminal_size((100, 24)).columns
    source, ref = meta["source"], meta["model_ref"]
    # "registered cost_model models:/...@champion-external (version 1)" names its version already
    lines = [f"forecaster: {source}" if ref in source or "(version " in source else f"forecaster: {source} ({ref})"]
    if meta.get("hardware_note"):
        lines.append(f"hardware: {meta['hardware_note']}")
    for line in lines:  # within the terminal, URIs unbroken
        typer.echo(textwrap.fill(line, columns, subsequent_indent="  ", break_long_words=False), err=True)
    # The row after the file: bin, p(bin), E[log2 S] and p1..p8 take 65 columns; the bin's name is
    # shown where the terminal leaves a file column of 24 beside it, else the file gets the room.
    named = columns - FORECAST_ROW - 2 - max(map(len, BIN_NAMES)) >= 24
    room = columns - FORECAST_ROW - (2 + max(map(len, BIN_NAMES)) if named else 0)
    width = max(16, min(48, room, max(len("file"), *(len(r["file"]) for r in rows))))
    typer.echo(f"{'file':<{width}}  bin  p(bin)  E[log2 S]  p1..p8" + ("  bin name" if named else ""))
    for r in rows:
        name = r["file"] if len(r["file"]) <= width else "..." + r["file"][-(width - 3):]
        if r["ok"]:
            probs = " ".join(f"{p:.2f}" for p in r["p"])
            typer.echo(f"{name:<{width}}  {r['predicted_bin']:>3}  {r['p_bin']:6.3f}  {r['expected_log2']:+9.3f}  {probs}"
                       + (f"  {BIN_NAMES[r['predicted_bin'] - 1]}" if named else "")
                       + "".join(f"  ({n})" for n in r["notes"]))
        else:
            typer.echo(f"{name:<{width}}  refused: {r['refused']}" if r["refused"] else f"{name:<{width}}  {r['error']}")


# ---- promote ------------------------------------------------------------------------------
@app.command()
@one_line_errors
def promote(
    version: int = typer.Option(..., "--version", min=1, help="Registered version of kernelcast-surrogate."),
    alias: str = typer.Option("champion", "--alias",
                              help="champion | challenger | champion-external | challenger-external | "
                                   "champion-<card> (a card other than the reference, e.g. champion-h100)."),
    profile: str | None = ProfileOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Point an alias of models:/kernelcast-surrogate at a version by hand (manual promotion).

    The automatic rule (model_promotion asset) is bypassed: use this to roll back or to
    promote a version you have evaluated yourself."""
    from models.registry.versions import (
        ALIASES,
        alias_version,
        is_card_alias,
        set_alias,
        version_info,
    )

    settings = _settings(profile)
    if alias not in ALIASES and not is_card_alias(alias):
        raise CliError(f"--alias must be one of {', '.join(ALIASES)} or champion-<card>, got {alias!r}")
    if not (settings.home / "mlflow.db").is_file():
        raise CliError(f"no MLflow registry at {settings.home / 'mlflow.db'}; run `kernelcast run` first")
    if version_info(settings.mlflow_uri, version) is None:
        raise CliError(f"{SURROGATE_MODEL} has no version {version}")
    before = alias_version(settings.mlflow_uri, alias)
    set_alias(settings.mlflow_uri, alias, version)
    report = {"model": SURROGATE_MODEL, "alias": alias, "version": version, "previous": before}
    if as_json:
        _print_json(report)
    else:
        typer.echo(f"{SURROGATE_MODEL}@{alias} -> version {version} (was {before if before is not None else 'unset'})")


# ---- ui -----------------------------------------------------------------------------------
@app.command()
@one_line_errors
def ui(
    profile: str | None = ProfileOpt,
    dagster_port: int | None = typer.Option(None, min=1, max=65535, help="Dagster UI port on 127.0.0.1 (default: the port "
                                                        "the home was last served on, else 3000)."),
    mlflow_port: int | None = typer.Option(None, min=1, max=65535, help="MLflow UI port on 127.0.0.1 (default: the port "
                                                       "the home was last served on, else 5000)."),
) -> None:
    """Serve the Dagster UI and the MLflow UI on 127.0.0.1 until Ctrl-C or SIGTERM."""
    from orchestration.ui import serve

    serve(_settings(profile), dagster_port=dagster_port, mlflow_port=mlflow_port)


from orchestration.cli_measure import measure as _measure  # noqa: E402 - its own module, registered here
from orchestration.cli_measure import serve_measure as _serve_measure  # noqa: E402
from orchestration.cli_report import (  # noqa: E402
    cross_hardware_lines,
    newest_table,
    promotion_lines,
    table_lines,
)
from orchestration.cli_report import report as _report  # noqa: E402 - its own module
from orchestration.cli_search import export_forecaster, search_headline, search_sim  # noqa: E402 - its own module
from orchestration.cli_train import app as _train_app  # noqa: E402 - its own module, with `train code`


def _with_one_line_errors(group: typer.Typer) -> None:
    """The same one-line errors as every command, for the commands of `group` and of its groups
    (`kernelcast train`, `kernelcast train code`)."""
    for command in group.registered_commands:
        command.callback = one_line_errors(command.callback)
    for sub in group.registered_groups:
        _with_one_line_errors(sub.typer_instance)


app.command("search-sim")(search_sim)
app.command("export-forecaster")(export_forecaster)
app.command("report")(one_line_errors(_report))
_with_one_line_errors(_train_app)
app.add_typer(_train_app, name="train")
app.command("measure")(one_line_errors(_measure))
app.command("serve-measure")(one_line_errors(_serve_measure))


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
