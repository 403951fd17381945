"""What a GPU host sent back, brought into a committed run folder: one ingest for both runs.

    kernelcast train ingest OUT/results.tar OUT/adapter-*.tar --job JOB --into DIR  # kind "variants"
    kernelcast train ingest OUT --job JOB [--into DIR] [--adapter]                  # kind "code"

`ingest(results, job, into)` reads the job (models/training/gpu_host/job.py), reads the host's
output as the job's kind writes it (gpu_job: results.tar and adapter-<variant>.tar; llm_code:
forecasts.parquet, metrics.json, head files and lora-best.tar in its OUT folder), and merges its
variants into the committed run folder that `kernelcast run` reads (pipelines.surrogates.committed):

    forecasts.parquet            one row per variant, role, pair, readout and repeat, keyed by the
                                 pair's hardware, anchor and candidate (so any later dataset version
                                 holding the same pair can use it), with the job's dataset version
    training.json                the folder's dataset version and held-out task; per variant its
                                 settings, status and history, and for a "code" run the dataset
                                 version it was trained on (`kernelcast run` then registers it,
                                 pipelines.surrogates.registration)
    training_pairs.parquet       the fit pairs by role of a "variants" job (lineage once that
    code_training_pairs.parquet  dataset version has left the warehouse); those of a "code" job
    adapters/<variant>/          LoRA adapters: every finished one of a "variants" run; code-lora's
                                 only when asked (`adapter`), else an earlier one goes
    heads/embed-head-<v>.zip     the code-embed variants' head files (`embed-head`, 0.1-1 MB)

A variant already there is replaced, with its head file; the others are kept. The external
pairs' forecasts are stored in the eval role: they are pairs of the eval split of the dataset
version, told apart by their candidate's generator (pipelines.surrogates.roles). Nothing is
written unless the host's files and the job read.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from models.bins import NUM_BINS
from models.training.gpu_host.job import JobError, read_job, write_json
from warehouse.bin_edges import P_COLS

FORECASTS_FILE = "forecasts.parquet"
TRAINING_FILE = "training.json"
TRAINING_PAIRS_FILE = "training_pairs.parquet"  # the fit pairs of a "variants" job
CODE_PAIRS_FILE = "code_training_pairs.parquet"  # the fit pairs of a "code" job
HEADS_DIR = "heads"  # the code-embed variants' head files
ADAPTERS_DIR = "adapters"
LORA_VARIANT = "code-lora"  # the "code" run's LoRA variant, whose adapter is kept only when asked
FIT_ROLES = ("fit", "held_out_fit")
ROLE_IN_RUN = {"external": "eval"}  # the external pairs are eval-split pairs of the dataset version
COLUMNS = ("variant", "role", "readout", "repeat", "dataset_version", "pair_id", "task", "hardware_id",
           "anchor_kernel_id", "candidate_kernel_id", "true_bin", "parse_ok", "parse_error", *P_COLS)


@dataclass
class HostRun:
    """A host's output read and checked, in the committed form, before anything is written.

    Attributes:
        forecasts: rows of forecasts.parquet (COLUMNS).
        records: variant -> its training.json record.
        pairs_file: where the job's fit pairs go (TRAINING_PAIRS_FILE or CODE_PAIRS_FILE).
        adapters: variant -> a function writing its adapter into a folder (None: remove one there).
        heads: variant -> its head file in the host's output (None: remove one there).
    """

    forecasts: pl.DataFrame
    records: dict[str, dict[str, Any]]
    pairs_file: str
    adapters: dict[str, Any] = field(default_factory=dict)
    heads: dict[str, Path | None] = field(default_factory=dict)


# --- kind "variants": results.tar and adapter-<variant>.tar of gpu_job ----------------------------

def _members(tar_path: Path) -> dict[str, bytes]:
    try:
        with tarfile.open(tar_path) as tar:
            return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    except (OSError, tarfile.TarError) as e:
        raise JobError(f"{tar_path}: unreadable ({type(e).__name__}: {e})") from None


def result_files(results: str | Path | Iterable[str | Path]) -> list[Path]:
    """The files of gpu_job calls, in order: each path given, a folder standing for its
    results.tar and adapter-*.tar."""
    out: list[Path] = []
    for path in map(Path, [results] if isinstance(results, (str, Path)) else results):
        out += [*path.glob("results.tar"), *sorted(path.glob("adapter-*.tar"))] if path.is_dir() else [path]
    return out


def read_results(paths: Iterable[str | Path]) -> tuple[dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]], dict[str, bytes]]:
    """(status + history per variant, forecast rows per variant, adapter tar bytes per variant)
    of the results files of one job; a later file's variant replaces an earlier one's."""
    records: dict[str, dict[str, Any]] = {}
    forecasts: dict[str, list[dict[str, Any]]] = {}
    adapters: dict[str, bytes] = {}
    for path in map(Path, paths):
        if path.name.startswith("adapter-") and path.suffix == ".tar":
            adapters[path.name.removeprefix("adapter-").removesuffix(".tar")] = path.read_bytes()
            continue
        if path.name != "results.tar":
            continue
        for name, data in _members(path).items():
            variant, _, rest = name.partition("/")
            try:
                if rest == "status.json":
                    records.setdefault(variant, {})["status"] = json.loads(data)
                elif rest == "sft/history.json":
                    records.setdefault(variant, {})["history"] = json.loads(data)
                elif rest == "forecasts.jsonl.gz":
                    with gzip.open(io.BytesIO(data), "rt") as f:
                        forecasts[variant] = [json.loads(line) for line in f if line.strip()]
            except (OSError, EOFError, ValueError) as e:
                raise JobError(f"{path}: {name} is unreadable ({type(e).__name__}: {e})") from None
    if not records:
        raise JobError("no variant results in the given files (expected results.tar)")
    return records, forecasts, adapters


def forecast_frame(meta: dict[str, Any], pairs: list[dict[str, Any]],
                   forecasts: dict[str, list[dict[str, Any]]]) -> pl.DataFrame:
    """One row per (variant, role, pair, readout, repeat), with the pair's keys and true bin."""
    by_id = {p["pair_id"]: p for p in pairs}
    rows = []
    for variant, items in sorted(forecasts.items()):
        for r in items:
            pair = by_id.get(r["pair_id"])
            if pair is None:
                raise JobError(f"{variant}: forecast of pair {r['pair_id']}, which the job does not hold")
            p = r.get("p") or [None] * NUM_BINS
            if len(p) != NUM_BINS:
                raise JobError(f"{variant}: pair {r['pair_id']} has {len(p)} probabilities, not {NUM_BINS}")
            rows.append({"variant": variant, "role": ROLE_IN_RUN.get(r["role"], r["role"]),
                         "readout": r.get("readout", "logprob"),
                         "repeat": int(r.get("repeat", 0)), "dataset_version": meta["dataset_version"],
                         "pair_id": r["pair_id"], "task": pair["task"], "hardware_id": pair["hardware_id"],
                         "anchor_kernel_id": pair["anchor_kernel_id"], "candidate_kernel_id": pair["candidate_kernel_id"],
                         "true_bin": int(pair["true_bin"]), "parse_ok": bool(r.get("parse_ok", True)),
                         "parse_error": r.get("parse_error"), **dict(zip(P_COLS, p, strict=True))})
    return pl.DataFrame(rows, schema_overrides={c: pl.Float64 for c in P_COLS})


def _unpack_adapter(data: bytes):
    """A writer of a gpu_job adapter tar's files (adapter/<file>) into a folder."""
    def write(target: Path) -> None:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar.getmembers():
                if m.isfile() and m.name.startswith("adapter/") and "/" not in m.name[len("adapter/"):]:
                    (target / Path(m.name).name).write_bytes(tar.extractfile(m).read())
    return write


def read_variants_run(results: Any, meta: dict[str, Any], pairs: list[dict[str, Any]], adapter: bool) -> HostRun:
    """A gpu_job run's output; every finished LoRA variant's adapter travels (`adapter` is moot)."""
    records, forecasts, adapters = read_results(result_files(results))
    frame = forecast_frame(meta, pairs, forecasts)
    kept = {v["name"]: {"settings": v, **records[v["name"]]} for v in meta["variants"] if v["name"] in records}
    return HostRun(frame, kept, TRAINING_PAIRS_FILE,
                   adapters={name: _unpack_adapter(data) for name, data in adapters.items()})


# --- kind "code": the OUT folder of llm_code ------------------------------------------------------

def read_run(results: str | Path) -> tuple[pl.DataFrame, dict[str, Any]]:
    """(forecasts, metrics.json) of an llm_code output folder; JobError when unreadable."""
    root = Path(results)
    missing = [name for name in ("forecasts.parquet", "metrics.json") if not (root / name).is_file()]
    if missing:
        raise JobError(f"{root}: not a host run's output ({' and '.join(missing)} missing)")
    try:
        frame = pl.read_parquet(root / "forecasts.parquet")
        metrics = json.loads((root / "metrics.json").read_text())
    except (OSError, ValueError, pl.exceptions.PolarsError) as e:
        raise JobError(f"{root}: unreadable ({type(e).__name__}: {e})") from None
    return frame, metrics


def committed_rows(frame: pl.DataFrame, meta: dict[str, Any], pairs: list[dict[str, Any]]) -> pl.DataFrame:
    """An llm_code run's forecasts in the committed form (keys, true bin, dataset version per row).

    Raises:
        JobError: a forecast of a pair the job lacks, in a role the pair does not serve, or
            whose probabilities are not a distribution.
    """
    by_id = {p["pair_id"]: p for p in pairs}
    unknown = sorted(set(frame["pair_id"].to_list()) - set(by_id))
    if unknown:
        raise JobError(f"{len(unknown)} forecasts of pairs the job does not hold (first: {unknown[0]})")
    wrong = [(r, pid) for r, pid in frame.select("role", "pair_id").rows() if r not in by_id[pid]["roles"]]
    if wrong:
        raise JobError(f"{len(wrong)} forecasts in a role their pair does not serve (first: {wrong[0]})")
    p = frame.select(P_COLS).to_numpy()
    if len(p) and (abs(p.sum(axis=1) - 1).max() > 1e-4 or p.min() < 0):
        raise JobError("forecasts whose probabilities do not sum to 1")
    keys = pl.DataFrame([{k: by_id[pid][k] for k in ("pair_id", "task", "hardware_id", "anchor_kernel_id",
                                                       "candidate_kernel_id", "true_bin")} for pid in by_id])
    out = frame.join(keys, on="pair_id", how="left").with_columns(
        pl.col("role").replace(ROLE_IN_RUN), pl.lit(meta["dataset_version"]).alias("dataset_version"),
        pl.lit(True).alias("parse_ok"), pl.lit(None, dtype=pl.Utf8).alias("parse_error"),
        pl.col("true_bin").cast(pl.Int64), pl.col("repeat").cast(pl.Int64))
    return out.select(COLUMNS)


def variant_records(metrics: dict[str, Any], meta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """training.json records of an llm_code run's variants: settings (name, style, held_out, kind,
    finetune), status, per-epoch history and the dataset version it was trained on."""
    out = {}
    for name, m in metrics.get("variants", {}).items():
        held = m.get("setting") == "held_out_task"
        settings = {"name": name, "style": m.get("style"), "held_out": held, "kind": m.get("kind"),
                    "finetune": {"lora": "lora", "grpo": "grpo", "embed_head": "embed_head"}.get(m.get("kind"), "head"),
                    **({"features": bool(m.get("features"))} if m.get("kind") in ("head", "embed_head") else {}),
                    **({"parts": m.get("parts"), "ablation_brier": m.get("ablation_brier")}
                       if m.get("kind") == "embed_head" else {}),
                    **{f"head_{k}": v for k, v in (m.get("settings") or {}).items() if m.get("kind") == "head"},
                    **({"trained": m.get("settings")} if m.get("kind") in ("lora", "grpo") else {})}
        status = {"name": name, "best_epoch": m.get("best_epoch"), "finished": m.get("finished", True),
                  "split": "held_out_task" if held else "in_distribution", "evaluated": True,
                  **{k: m[k] for k in ("fit_pairs", "calibration_pairs", "rows_used", "epochs_run", "seconds",
                                       "prefill", "width") if k in m}}
        out[name] = {"settings": settings, "status": status, "history": {"history": m.get("history", [])},
                     "dataset_version": meta["dataset_version"]}
    return out


def check_head_file(path: Path, variant: str, dataset_version: str) -> None:
    """JobError (one line) when a head file is not this variant's of this dataset version."""
    from models.training.embed_head import read_head_spec

    try:
        spec = read_head_spec(path)
    except ValueError as e:
        raise JobError(str(e)) from None
    if (spec.get("variant"), spec.get("dataset_version")) != (variant, dataset_version):
        raise JobError(f"{path} is the head of {spec.get('variant')} on {spec.get('dataset_version')}, "
                       f"not of {variant} on {dataset_version}: run embed-head again")


def _lora_best(results: Path):
    """A writer of code-lora's best adapter (config + weights in bfloat16) from lora-best.tar,
    read now; None when the run left none."""
    tar_path = results / "lora-best.tar"
    if not tar_path.is_file():
        return None
    try:
        with tarfile.open(tar_path) as tar:
            files = {Path(m.name).name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    except (OSError, tarfile.TarError) as e:
        raise JobError(f"{tar_path}: unreadable ({type(e).__name__}: {e})") from None
    if "adapter_model.safetensors" not in files or "adapter_config.json" not in files:
        raise JobError(f"{tar_path}: no adapter in it")

    def write(target: Path) -> None:
        import torch
        from safetensors.torch import load, save_file

        weights = load(files["adapter_model.safetensors"])
        save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()},
                  str(target / "adapter_model.safetensors"))
        (target / "adapter_config.json").write_bytes(files["adapter_config.json"])
    return write


def read_code_run(results: Any, meta: dict[str, Any], pairs: list[dict[str, Any]], adapter: bool) -> HostRun:
    """An llm_code run's OUT folder; code-lora's adapter travels only with `adapter`.

    Raises:
        JobError: the run is not of the job's dataset version, or a head file is not its variant's.
    """
    from pipelines.surrogates.code_embed import embed_head_file

    paths = [results] if isinstance(results, (str, Path)) else list(results)
    if len(paths) != 1 or not Path(paths[0]).is_dir():
        raise JobError("an llm_code run is brought back from its OUT folder (one folder)")
    root = Path(paths[0])
    frame, metrics = read_run(root)
    if metrics.get("dataset_version") != meta["dataset_version"]:
        raise JobError(f"{root} was trained on {metrics.get('dataset_version')}, the job is {meta['dataset_version']}")
    rows = committed_rows(frame, meta, pairs)
    # A variant without forecasts (a LoRA run that has not finished an epoch yet) waits for a later trip.
    records = {k: v for k, v in variant_records(metrics, meta).items() if k in set(frame["variant"].to_list())}
    heads: dict[str, Path | None] = {}
    for name, record in records.items():
        if record["settings"]["finetune"] == "embed_head":
            src = root / embed_head_file(name)
            if src.is_file():
                check_head_file(src, name, meta["dataset_version"])
            heads[name] = src if src.is_file() else None
    adapters = {LORA_VARIANT: _lora_best(root) if adapter else None} if LORA_VARIANT in records else {}
    return HostRun(rows, records, CODE_PAIRS_FILE, adapters=adapters, heads=heads)


# --- the one ingest -------------------------------------------------------------------------------

READERS = {"variants": read_variants_run, "code": read_code_run}  # job kind -> its host output's reader


def training_pairs_frame(pairs: Iterable[dict[str, Any]]) -> pl.DataFrame:
    """One row per (fit role, pair) of a job: pair id, keys and true bin."""
    rows = [{"role": role, "pair_id": p["pair_id"], "task": p["task"], "hardware_id": p["hardware_id"],
             "anchor_kernel_id": p["anchor_kernel_id"], "candidate_kernel_id": p["candidate_kernel_id"],
             "true_bin": int(p["true_bin"])}
            for p in pairs for role in p.get("roles", []) if role in FIT_ROLES]
    schema = {"role": pl.String, "pair_id": pl.String, "task": pl.String, "hardware_id": pl.String,
              "anchor_kernel_id": pl.String, "candidate_kernel_id": pl.String, "true_bin": pl.Int64}
    return pl.DataFrame(rows, schema=schema).sort("role", "pair_id")


def _write_parquet(frame: pl.DataFrame, path: Path) -> None:
    tmp = path.with_name(path.name + ".part")
    frame.write_parquet(tmp, compression="zstd")
    tmp.replace(path)


def ingest(results: str | Path | Iterable[str | Path], job: str | Path, into: str | Path,
           adapter: bool = False) -> dict[str, Any]:
    """Merge what a GPU host sent back for `job` into the committed run folder `into`; a summary.

    Args:
        results: a gpu_job run's files (results.tar, adapter-*.tar) or the folder holding them;
            an llm_code run's OUT folder.
        job: the job folder the host ran (its kind says how `results` reads).
        into: the committed run folder (created when missing).
        adapter: keep code-lora's adapter of an llm_code run (else any there goes).
    Returns:
        variants, forecasts (rows ingested), adapters and head_files written, training_pairs,
        dataset_version, into.
    Raises:
        JobError: the job or the host's files are unreadable or do not match (nothing written).
    """
    into = Path(into)
    meta, _, pairs = read_job(job)
    run = READERS[meta["kind"]](results, meta, pairs, adapter)
    new = set(run.records) | set(run.forecasts["variant"].to_list())
    rows = run.forecasts
    into.mkdir(parents=True, exist_ok=True)
    if (into / FORECASTS_FILE).is_file():
        old = pl.read_parquet(into / FORECASTS_FILE).filter(~pl.col("variant").is_in(list(new)))
        rows = pl.concat([old, rows], how="diagonal_relaxed")
    training = json.loads((into / TRAINING_FILE).read_text()) if (into / TRAINING_FILE).is_file() else {
        "dataset_version": meta["dataset_version"], "held_out_task": meta.get("held_out_task"), "variants": {}}
    training["variants"] = {**training.get("variants", {}), **run.records}
    fit_pairs = training_pairs_frame(pairs)
    _write_parquet(rows, into / FORECASTS_FILE)
    _write_parquet(fit_pairs, into / run.pairs_file)
    write_json(into / TRAINING_FILE, training)
    for name, src in run.heads.items():  # an earlier run's head would not match these forecasts: replaced or removed
        _place_head(into, name, src)
    written = []
    for name, write in sorted(run.adapters.items()):  # likewise an earlier adapter
        target = into / ADAPTERS_DIR / name
        shutil.rmtree(target, ignore_errors=True)
        if write is not None:
            target.mkdir(parents=True)
            write(target)
            written.append(name)
    return {"variants": sorted(new), "forecasts": int(run.forecasts.height), "adapters": written,
            "head_files": {k: f"{HEADS_DIR}/{v.name}" for k, v in sorted(run.heads.items()) if v is not None},
            "training_pairs": fit_pairs.height, "dataset_version": meta["dataset_version"], "into": str(into)}


def _place_head(into: Path, variant: str, src: Path | None) -> None:
    from pipelines.surrogates.code_embed import embed_head_file

    dst = into / HEADS_DIR / embed_head_file(variant)
    if src is None:
        dst.unlink(missing_ok=True)
        return
    dst.parent.mkdir(exist_ok=True)
    shutil.copyfile(src, dst.with_name(dst.name + ".part"))
    dst.with_name(dst.name + ".part").replace(dst)


def ingested_variants(into: str | Path) -> list[str]:
    """The variants of a committed run folder brought back from a "code" run: their record names
    the dataset version they were trained on ([] without a training.json)."""
    path = Path(into) / TRAINING_FILE
    if not path.is_file():
        return []
    return sorted(k for k, v in json.loads(path.read_text()).get("variants", {}).items() if v.get("dataset_version"))
