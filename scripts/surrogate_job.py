"""Train the surrogate on another host: export a job from the warehouse, ingest what comes back.

A GPU host without duckdb/polars/mlflow trains with `scripts/gpu_train_surrogates.py`; this
script is both ends of that trip, on the machine that holds the warehouse and MLflow:

    # 1. the job: training prompts (train split) and eval prompts of the latest dataset version
    python scripts/surrogate_job.py export --out .gpu-job [--style full]
    # 2. on the GPU host (see README "Training on the H200")
    python3 scripts/gpu_train_surrogates.py --job .gpu-job --out $OUT/train
    # 3. back here: MLflow runs, registry versions (+ model_lineage rows), forecasts, report
    python scripts/surrogate_job.py ingest RESULTS_DIR --job .gpu-job [--alias challenger]
    # 4. optional: keep the eval forecasts (Parquet, to commit) and score them again any time,
    #    without the adapters: the same table, read-only on the warehouse
    python scripts/surrogate_job.py score RESULTS_DIR --job .gpu-job --save data/training/h200/RUN/forecasts.parquet
    python scripts/surrogate_job.py score data/training/h200/RUN/forecasts.parquet

`ingest` logs each variant's training (settings, per-step history, warm-up losses, the
dataset as input, measurement ids) as an MLflow run tagged with the host it ran on, registers
its adapter as a new version of kernelcast-surrogate, writes the eval forecasts into the
warehouse under `models:/kernelcast-surrogate/<version>|<readout>` (the base model's under
`base:<spec>|<readout>|<host>`), and writes the evaluation report of those models beside the
reference forecasters (bootstrap intervals) to <home>/reports/<version>-surrogates/.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Annotated

import typer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_train_surrogates import read_jsonl, safe_name  # noqa: E402  (the GPU host's side of the trip)

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])


def _settings(profile: str, home: Path | None):
    from orchestration.settings import load_settings

    return load_settings(profile, home)


def _latest_version(con) -> str:
    from warehouse.datasets import list_dataset_versions

    versions = list_dataset_versions(con)
    if versions.is_empty():
        raise typer.BadParameter("no dataset version in the warehouse: run `kernelcast run` first")
    return str(versions.sort("created_at")["dataset_version"][-1])


def _write_jsonl(path: Path, rows: list[dict], compress: bool = False) -> None:
    """JSONL rows; gzipped to <path>.gz with `compress`."""
    with (gzip.open(path.with_name(path.name + ".gz"), "wt") if compress else open(path, "w")) as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def _job_rows(job: Path, name: str) -> list[dict]:
    """The rows of <job>/<name>.jsonl, or of <name>.jsonl.gz (the GPU host's reader)."""
    try:
        return read_jsonl(job / f"{name}.jsonl")
    except SystemExit as e:  # its one-line error, as ingest reports bad input
        raise ValueError(str(e).removeprefix("error: ")) from None


@app.command()
def export(
    out: Annotated[Path, typer.Option(help="job folder to write")] = Path(".gpu-job"),
    style: Annotated[str, typer.Option(help="prompt style: full (paper) or diff")] = "full",
    version: Annotated[str | None, typer.Option(help="dataset version (default: the newest)")] = None,
    profile: Annotated[str, typer.Option(help="settings profile naming the warehouse")] = "default",
    home: Annotated[Path | None, typer.Option(help="KERNELCAST_HOME")] = None,
    gzip_rows: Annotated[bool, typer.Option("--gzip", help="write train.jsonl.gz and eval.jsonl.gz (to travel)")] = False,
) -> None:
    """Write train.jsonl, eval.jsonl and job.json for gpu_train_surrogates.py."""
    from models.service import DEFAULT_HARDWARE, hardware_from_warehouse
    from models.training import build_training_rows
    from pipelines.evaluation.lm_forecasts import prompt_source
    from pipelines.tasks import get_task
    from warehouse.datasets import dataset_measurement_ids, read_pairs
    from warehouse.db import connect
    from warehouse.kernels import read_kernels

    cfg = _settings(profile, home)
    with connect(cfg.warehouse_path, read_only=True) as con:
        version = version or _latest_version(con)
        train, evals = read_pairs(con, version, "train"), read_pairs(con, version, "eval")
        ids = sorted(set(train["anchor_kernel_id"]) | set(train["candidate_kernel_id"])
                     | set(evals["anchor_kernel_id"]) | set(evals["candidate_kernel_id"]))
        kernels = read_kernels(con, kernel_ids=ids)
        measurement_ids = dataset_measurement_ids(con, version)
    sources = {r["kernel_id"]: prompt_source(r["task"], r["source"], r["generator"]) for r in kernels.iter_rows(named=True)}
    tasks = {t: get_task(t).description for t in set(train["task"]) | set(evals["task"])}
    hardware = {hw: hardware_from_warehouse(cfg.warehouse_path, hw) or DEFAULT_HARDWARE
                for hw in set(train["hardware_id"]) | set(evals["hardware_id"])}
    out.mkdir(parents=True, exist_ok=True)
    train_rows = build_training_rows(train, sources, tasks, hardware, style=style)
    eval_rows = build_training_rows(evals, sources, tasks, hardware, style=style)
    for name in ("train", "eval"):  # a job holds one form of each file
        for stale in (out / f"{name}.jsonl", out / f"{name}.jsonl.gz"):
            stale.unlink(missing_ok=True)
    _write_jsonl(out / "train.jsonl", train_rows, gzip_rows)
    _write_jsonl(out / "eval.jsonl", eval_rows, gzip_rows)
    (out / "measurement_ids.txt").write_text("".join(f"{m}\n" for m in measurement_ids))
    job = {"dataset_version": version, "style": style, "train_rows": len(train_rows), "eval_rows": len(eval_rows),
           "measurements": len(measurement_ids)}
    (out / "job.json").write_text(json.dumps(job, indent=1))
    typer.echo(json.dumps(job))


def _from_gpu_call(results: Path) -> Path:
    """The results folder inside what a `scripts/gpu_train_round.sh` call returned (train-rest.tar
    holding train/, and one train-<variant>.tar per adapter), unpacked beside it once; any other
    folder as it is."""
    rest = results / "train-rest.tar"
    if (results / "summary.json").is_file() or not rest.is_file():
        return results
    target = results.parent / f"{results.name}-call"
    if not (target / "train" / "summary.json").is_file():
        with tarfile.open(rest) as tar:
            tar.extractall(target, filter="data")
        for adapter in results.glob("train-*.tar"):
            if adapter != rest:
                shutil.copyfile(adapter, target / "train" / adapter.name.removeprefix("train-"))
    return target / "train"


def _unpack(results: Path) -> Path:
    """Unpack each <variant>.tar of a results folder in place (idempotent); the folder."""
    if not (results / "summary.json").is_file():
        raise typer.BadParameter(f"{results}: no summary.json (not a gpu_train_surrogates.py output)")
    unpacked = results.parent / f"{results.name}-unpacked"
    unpacked.mkdir(parents=True, exist_ok=True)
    for tar_path in sorted(results.glob("*.tar")):
        with tarfile.open(tar_path) as tar:
            tar.extractall(unpacked, filter="data")
    return unpacked


def _checked_forecasts(results: Path, frame=None):
    """The forecasts of a results folder (its forecasts-*.jsonl), or `frame`, cut to the forecast
    table's columns and put through the warehouse's own validation on a throwaway copy: a bad
    row raises here, before anything is written."""
    import polars as pl

    from warehouse.db import connect
    from warehouse.forecasts import FORECAST_COLUMNS, P_COLUMNS, write_forecasts

    if frame is None:
        paths = sorted(results.glob("forecasts-*.jsonl"))
        if not paths:
            raise FileNotFoundError(f"{results} holds no forecasts-*.jsonl")
        frame = pl.concat([pl.read_ndjson(p, infer_schema_length=None) for p in paths], how="diagonal_relaxed")
    frame = frame.select([c for c in frame.columns if c in FORECAST_COLUMNS or c in P_COLUMNS])
    with connect(":memory:") as scratch:
        write_forecasts(scratch, frame)
    return frame


def _load_results(results: Path, job: Path) -> dict:
    """Read and check everything `ingest` will write, before it writes anything: a missing or
    malformed file is one line (BadParameter) and leaves MLflow and the warehouse untouched."""
    import polars as pl

    from warehouse.errors import WarehouseError

    try:
        results = _from_gpu_call(results)
        folder = _unpack(results)
        summary = json.loads((results / "summary.json").read_text())
        version = json.loads((job / "job.json").read_text())["dataset_version"]
        train_rows = _job_rows(job, "train")
        measurement_ids = (job / "measurement_ids.txt").read_text().split()
        records = {}
        for variant in summary["variants"]:
            name = safe_name(variant)
            if not (folder / name / "adapter" / "adapter_config.json").is_file():
                raise FileNotFoundError(f"{folder / name / 'adapter'} holds no adapter_config.json")
            records[variant] = json.loads((folder / name / "training.json").read_text())
            for key in ("metrics", "log_history", "sft_losses", "train_s", "steps"):
                records[variant][key]  # noqa: B018 - a KeyError names the missing field
        frame = _checked_forecasts(results)
    except (OSError, EOFError, KeyError, ValueError, WarehouseError, tarfile.TarError, pl.exceptions.PolarsError) as e:
        raise typer.BadParameter(f"{type(e).__name__}: {e}".splitlines()[0]) from e
    return {"folder": folder, "summary": summary, "dataset_version": version, "train_rows": train_rows,
            "measurement_ids": measurement_ids, "records": records, "forecasts": frame}


def _adapter_digest(variant_dir: Path) -> str:
    """sha256 over a variant's adapter files and training record (names and bytes, sorted)."""
    h = hashlib.sha256()
    for path in sorted(p for p in variant_dir.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(variant_dir)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _version_with_digest(uri: str, digest: str) -> int | None:
    """The registered surrogate version whose adapter has this digest, if any: ingesting the
    same results twice re-uses it instead of registering a duplicate."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from models.registry import DEFAULT_NAME

    try:
        versions = MlflowClient(uri, registry_uri=uri).search_model_versions(f"name='{DEFAULT_NAME}'")
    except MlflowException:
        return None
    found = [int(v.version) for v in versions if v.tags.get("adapter_sha256") == digest]
    return min(found) if found else None


def _report(stored, n_boot: int, out_dir: Path, title: str) -> None:
    """Evaluate forecasts joined to their pairs (bootstrap intervals), write the HTML report and
    metrics.json to `out_dir`, print the headline table."""
    from pipelines.evaluation.suite import (
        evaluate_models,
        headline_markdown,
        write_evaluation_report,
    )

    report = evaluate_models(stored, n_boot=n_boot)
    html = write_evaluation_report(report, out_dir, title=title)
    (out_dir / "metrics.json").write_text(json.dumps(report, indent=1, default=str))
    typer.echo(headline_markdown(report))
    typer.echo(f"report: {html}")


@app.command()
def ingest(
    results: Annotated[Path, typer.Argument(help="the folder gpu_train_surrogates.py wrote (--out)")],
    job: Annotated[Path, typer.Option(help="the job folder that was sent")] = Path(".gpu-job"),
    host: Annotated[str, typer.Option(help="where it ran (a tag and part of the base model's ref)")] = "h200",
    alias: Annotated[str | None, typer.Option(help="alias for every new version (e.g. challenger)")] = None,
    n_boot: Annotated[int, typer.Option(help="bootstrap replicates of the report")] = 1000,
    profile: Annotated[str, typer.Option(help="settings profile naming warehouse and MLflow")] = "default",
    home: Annotated[Path | None, typer.Option(help="KERNELCAST_HOME")] = None,
) -> None:
    """Log, register and evaluate a training run done on another host."""
    import polars as pl

    from models.registry import register_surrogate
    from models.training import TrainingSettings, log_training_run
    from warehouse.db import connect
    from warehouse.forecasts import read_forecasts, write_forecasts

    cfg = _settings(profile, home)
    loaded = _load_results(results, job)
    summary, folder, version = loaded["summary"], loaded["folder"], loaded["dataset_version"]
    train_rows, measurement_ids, records = loaded["train_rows"], loaded["measurement_ids"], loaded["records"]
    refs: dict[str, str] = {}
    with connect(cfg.warehouse_path) as con:
        # Forecasts are scored against this version's pairs: in a home without them nothing
        # could be evaluated, so nothing is logged, registered or written.
        if con.execute("SELECT 1 FROM pairs WHERE dataset_version = ? LIMIT 1", [version]).fetchone() is None:
            raise typer.BadParameter(f"dataset version {version} of {job} has no pairs in {cfg.warehouse_path}; "
                                     "ingest into the KERNELCAST_HOME the job was exported from (--home)")
        for variant, info in summary["variants"].items():
            name = safe_name(variant)
            record = records[variant]
            settings = TrainingSettings.profile(summary["profile"], reward=variant, **summary["overrides"])
            metrics = {**record["metrics"], "train_s": record["train_s"]}
            if info.get("eval_s") is not None:  # absent when a deadline stopped the evaluation
                metrics["eval_s"] = info["eval_s"]
            digest = _adapter_digest(folder / name)
            if (number := _version_with_digest(cfg.mlflow_uri, digest)) is not None:
                refs[f"trained:{variant}"] = f"models:/kernelcast-surrogate/{number}"
                if alias:
                    from mlflow import MlflowClient

                    from models.registry import DEFAULT_NAME

                    MlflowClient(cfg.mlflow_uri, registry_uri=cfg.mlflow_uri).set_registered_model_alias(
                        DEFAULT_NAME, alias, str(number))
                typer.echo(f"{variant}: already registered as version {number} (same adapter), not logged again")
                continue
            run_id = log_training_run(cfg.mlflow_uri, "kernelcast-training", settings, record["log_history"],
                                      record["sft_losses"], metrics, train_rows, version, measurement_ids,
                                      {"trained_on": f"{host} ({summary['device']})", "kernelcast.trained_elsewhere": "true",
                                       "adapter_sha256": digest})
            number = register_surrogate(cfg.mlflow_uri, run_id, folder / name / "adapter", base_model=settings.base_model,
                                        dataset_version=version, alias=alias, con=con, tags={"adapter_sha256": digest})
            refs[f"trained:{variant}"] = f"models:/kernelcast-surrogate/{number}"
            typer.echo(f"{variant}: MLflow run {run_id}, registered version {number} ({info['steps']} GRPO steps)")
        frame = loaded["forecasts"]

        def rename(ref: str) -> str:
            model, _, readout = ref.partition("|")
            return f"{refs[model]}|{readout}" if model in refs else f"{model}|{readout}|{host}"

        frame = frame.with_columns(pl.col("model_ref").map_elements(rename, return_dtype=pl.String))
        write_forecasts(con, frame)
        models = set(frame["model_ref"].unique())
        stored = read_forecasts(con, dataset_version=version, with_pairs=True)
    stored = stored.rename({"speedup": "true_speedup"}) if "speedup" in stored.columns else stored
    evaluated_pairs = set(frame["pair_id"])
    stored = stored.filter(pl.col("pair_id").is_in(evaluated_pairs)
                           & (pl.col("model_ref").is_in(models) | pl.col("model_ref").str.starts_with("baseline:")))
    _report(stored, n_boot, cfg.reports_dir / f"{version}-surrogates", f"Surrogates trained on {host}, dataset {version}")


def _forecast_frame(source: Path, job: Path, host: str):
    """Forecast rows with model refs "<model>|<readout>|<host>" and their dataset version: from
    a Parquet file `score --save` wrote, or from a results folder (or a GPU call's files) and
    the job it was trained from. Checked like ingest's; a bad file is one line."""
    import polars as pl

    from warehouse.errors import WarehouseError

    try:
        if source.suffix == ".parquet":
            frame = pl.read_parquet(source)
            version = frame["dataset_version"].unique().to_list()
            frame = _checked_forecasts(source, frame)
        else:
            version = [json.loads((job / "job.json").read_text())["dataset_version"]]
            frame = _checked_forecasts(_from_gpu_call(source))
            frame = frame.with_columns(pl.col("model_ref") + f"|{host}")
        if len(version) != 1:
            raise ValueError(f"the forecasts are of {len(version)} dataset versions; score one at a time")
        return frame.with_columns(pl.lit(version[0]).alias("dataset_version"))
    except (OSError, KeyError, ValueError, WarehouseError, tarfile.TarError, pl.exceptions.PolarsError) as e:
        raise typer.BadParameter(f"{source}: {type(e).__name__}: {e}".splitlines()[0]) from e


@app.command()
def score(
    sources: Annotated[list[Path], typer.Argument(help="forecasts.parquet files (--save) or results folders")],
    job: Annotated[Path, typer.Option(help="the job folder of results folders (not needed for Parquet)")] = Path(".gpu-job"),
    host: Annotated[str, typer.Option(help="where results folders ran (the last part of their model refs)")] = "h200",
    save: Annotated[Path | None, typer.Option(help="write the forecasts read to this Parquet file (zstd)")] = None,
    n_boot: Annotated[int, typer.Option(help="bootstrap replicates")] = 1000,
    profile: Annotated[str, typer.Option(help="settings profile naming the warehouse")] = "default",
    home: Annotated[Path | None, typer.Option(help="KERNELCAST_HOME")] = None,
) -> None:
    """Score forecasts made elsewhere beside the reference forecasters, writing nothing to the
    warehouse or MLflow: the README's H200 table from the committed forecasts, without adapters.

    The warehouse supplies the true bins (the pairs of the forecasts' dataset version, which is
    deterministic from the committed measurements: `make run` builds it) and the reference
    forecasters' forecasts of the same pairs; the report goes to <home>/reports/<version>-scored/.
    """
    import polars as pl

    from warehouse.db import connect, query_frame
    from warehouse.forecasts import read_forecasts

    frame = pl.concat([_forecast_frame(s, job, host) for s in sources], how="diagonal_relaxed")
    versions = sorted(set(frame["dataset_version"]))
    if len(versions) != 1:
        raise typer.BadParameter(f"the forecasts are of {len(versions)} dataset versions ({versions}); score one at a time")
    version = versions[0]
    cfg = _settings(profile, home)
    with connect(cfg.warehouse_path, read_only=True) as con:
        pairs = query_frame(con, "SELECT pair_id, dataset_version, task, hardware_id, anchor_kernel_id, "
                            "candidate_kernel_id, speedup, true_bin, pair_type, split FROM pairs "
                            "WHERE dataset_version = ?", [version])
        baselines = read_forecasts(con, dataset_version=version, with_pairs=True)
    if pairs.is_empty():
        raise typer.BadParameter(f"dataset version {version} has no pairs in {cfg.warehouse_path}; "
                                 "build it there first (`make run` on the committed data)")
    missing = set(frame["pair_id"]) - set(pairs["pair_id"])
    if missing:
        raise typer.BadParameter(f"{len(missing)} forecast pairs are not pairs of {version}, e.g. {sorted(missing)[0]}")
    if save:  # only forecasts that were checked and match the warehouse; written whole
        save.parent.mkdir(parents=True, exist_ok=True)
        tmp = save.with_name(save.name + ".part")
        frame.sort("model_ref", "pair_id", "repeat").write_parquet(tmp, compression="zstd")
        tmp.replace(save)
        typer.echo(f"saved {frame.height} forecasts to {save}")
    evaluated = frame.drop("dataset_version").join(pairs, on="pair_id", how="inner")
    baselines = baselines.filter(pl.col("model_ref").str.starts_with("baseline:")
                                 & pl.col("pair_id").is_in(set(frame["pair_id"])))
    stored = pl.concat([evaluated, baselines.select(evaluated.columns)], how="diagonal_relaxed")
    stored = stored.rename({"speedup": "true_speedup"})
    _report(stored, n_boot, cfg.reports_dir / f"{version}-scored", f"Forecasts scored on dataset {version}")


if __name__ == "__main__":
    app()
