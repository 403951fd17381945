"""What a GPU training job sent back, as frames: forecasts per variant, training records.

`kernelcast train collect RESULTS... --job JOB --out DIR` turns the files of one or more calls
(results.tar, adapter-<variant>.tar; models/training/gpu_host/gpu_job.py) into what is committed under
data/training/<hardware>/<date>/: `forecasts.parquet` (one row per variant, role, pair and
readout, keyed by the pair's hardware, anchor and candidate so any later dataset version
holding the same pair can use it), `training.json` (status and history of every variant, and
the dataset version the job was exported from), `training_pairs.parquet` (the job's fit pairs
by role, with their keys: what the variants learned from, for lineage once that dataset
version has left the warehouse), and the LoRA adapters under `adapters/<variant>/`. Nothing is
written unless every file reads.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import polars as pl

from models.bins import NUM_BINS
from models.training.gpu_host.jobfile import JobError, read_job, write_json
from warehouse.bin_edges import P_COLS

FORECASTS_FILE = "forecasts.parquet"
TRAINING_FILE = "training.json"
TRAINING_PAIRS_FILE = "training_pairs.parquet"
FIT_ROLES = ("fit", "held_out_fit")


def _members(tar_path: Path) -> dict[str, bytes]:
    try:
        with tarfile.open(tar_path) as tar:
            return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    except (OSError, tarfile.TarError) as e:
        raise JobError(f"{tar_path}: unreadable ({type(e).__name__}: {e})") from None


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


def forecast_frame(job: str | Path, forecasts: dict[str, list[dict[str, Any]]]) -> pl.DataFrame:
    """One row per (variant, role, pair, readout, repeat), with the pair's keys and true bin."""
    meta, _, pairs = read_job(job)
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
            rows.append({"variant": variant, "role": r["role"], "readout": r.get("readout", "logprob"),
                         "repeat": int(r.get("repeat", 0)), "dataset_version": meta["dataset_version"],
                         "pair_id": r["pair_id"], "task": pair["task"], "hardware_id": pair["hardware_id"],
                         "anchor_kernel_id": pair["anchor_kernel_id"], "candidate_kernel_id": pair["candidate_kernel_id"],
                         "true_bin": int(pair["true_bin"]), "parse_ok": bool(r.get("parse_ok", True)),
                         "parse_error": r.get("parse_error"), **dict(zip(P_COLS, p, strict=True))})
    return pl.DataFrame(rows, schema_overrides={c: pl.Float64 for c in P_COLS})


def training_pairs_frame(pairs: Iterable[dict[str, Any]]) -> pl.DataFrame:
    """One row per (fit role, pair) of a job: pair id, keys and true bin."""
    rows = [{"role": role, "pair_id": p["pair_id"], "task": p["task"], "hardware_id": p["hardware_id"],
             "anchor_kernel_id": p["anchor_kernel_id"], "candidate_kernel_id": p["candidate_kernel_id"],
             "true_bin": int(p["true_bin"])}
            for p in pairs for role in p.get("roles", []) if role in FIT_ROLES]
    schema = {"role": pl.String, "pair_id": pl.String, "task": pl.String, "hardware_id": pl.String,
              "anchor_kernel_id": pl.String, "candidate_kernel_id": pl.String, "true_bin": pl.Int64}
    return pl.DataFrame(rows, schema=schema).sort("role", "pair_id")


def collect(paths: Iterable[str | Path], job: str | Path, out: str | Path) -> dict[str, Any]:
    """Write forecasts.parquet, training.json, training_pairs.parquet and adapters/ of a job's
    results into `out`."""
    records, forecasts, adapters = read_results(paths)
    frame = forecast_frame(job, forecasts)
    meta, _, pairs = read_job(job)
    fit_pairs = training_pairs_frame(pairs)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for name, table in ((FORECASTS_FILE, frame), (TRAINING_PAIRS_FILE, fit_pairs)):
        tmp = folder / (name + ".part")
        table.write_parquet(tmp, compression="zstd")
        tmp.replace(folder / name)
    training = {"dataset_version": meta["dataset_version"], "held_out_task": meta.get("held_out_task"),
                "variants": {v["name"]: {"settings": v, **records.get(v["name"], {})} for v in meta["variants"]
                             if v["name"] in records}}
    write_json(folder / TRAINING_FILE, training)
    for variant, data in adapters.items():
        target = folder / "adapters" / variant
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar.getmembers():
                if m.isfile() and m.name.startswith("adapter/") and "/" not in m.name[len("adapter/"):]:
                    (target / Path(m.name).name).write_bytes(tar.extractfile(m).read())
    return {"forecasts": frame.height, "variants": sorted(records), "adapters": sorted(adapters),
            "training_pairs": fit_pairs.height, "dataset_version": meta["dataset_version"]}
