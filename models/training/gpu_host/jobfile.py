"""The training job's files: what `kernelcast train export` writes and a GPU host reads.

A job folder holds everything a GPU host needs to train and evaluate LLM surrogates of one
dataset version, and nothing it does not (no warehouse, no MLflow):

    job.json            dataset version, held-out task, tasks (description, benchmark cases),
                        hardware fingerprints, variants (what to train, models/training/gpu_host/variants.py)
    kernels.jsonl.gz    kernel_id, task, prompt source, compile features (or null)
    pairs.jsonl.gz      pair_id, task, hardware_id, anchor/candidate kernel ids, true_bin, roles

A pair's roles say where it serves: "fit" (in-distribution training), "calibration" (the
calibration split carved from training lineages), "eval" (the eval set), "held_out_fit",
"held_out_calibration" (the same without the held-out task) and "held_out_eval" (every
reference pair of the held-out task). Prompts are built on the host with models/prompts.py,
so a job is ~1 MB compressed whatever the prompt style.

Only the standard library: the GPU host reads this without the rest of the stack.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

JOB_FILE = "job.json"
KERNELS_FILE = "kernels.jsonl.gz"
PAIRS_FILE = "pairs.jsonl.gz"
ROLES = ("fit", "calibration", "eval", "held_out_fit", "held_out_calibration", "held_out_eval")
JOB_FORMAT = 1


class JobError(ValueError):
    """A job or results folder is missing, corrupt or of another format (one line)."""


def write_jsonl_gz(path: Path, rows: Iterable[Mapping[str, Any]]) -> int:
    """Rows as gzipped JSON lines, written whole (tmp, then rename); the row count."""
    tmp = path.with_name(path.name + ".part")
    n = 0
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")
            n += 1
    tmp.replace(path)
    return n


def read_jsonl_gz(path: Path) -> list[dict[str, Any]]:
    """The rows of a gzipped JSON-lines file; JobError on a missing or truncated one."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        raise JobError(f"{path}: no such file") from None
    except (OSError, EOFError, json.JSONDecodeError) as e:
        raise JobError(f"{path}: unreadable ({type(e).__name__}: {e})") from None


def write_json(path: Path, obj: Any) -> None:
    """JSON written whole (tmp, then rename)."""
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    tmp.replace(path)


def read_job(folder: str | Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """(job.json, kernel_id -> kernel row, pairs) of a job folder.

    Raises:
        JobError: a file is missing or unreadable, or the job is of another format.
    """
    root = Path(folder)
    try:
        meta = json.loads((root / JOB_FILE).read_text())
    except FileNotFoundError:
        raise JobError(f"{root}: not a training job (no {JOB_FILE})") from None
    except json.JSONDecodeError as e:
        raise JobError(f"{root / JOB_FILE}: unreadable ({e})") from None
    if meta.get("format") != JOB_FORMAT:
        raise JobError(f"{root}: job format {meta.get('format')!r}, this code reads {JOB_FORMAT}")
    kernels = {k["kernel_id"]: k for k in read_jsonl_gz(root / KERNELS_FILE)}
    pairs = read_jsonl_gz(root / PAIRS_FILE)
    missing = {p[k] for p in pairs for k in ("anchor_kernel_id", "candidate_kernel_id")} - set(kernels)
    if missing:
        raise JobError(f"{root}: {len(missing)} kernels of its pairs are missing, e.g. {sorted(missing)[0]}")
    return meta, kernels, pairs


def pairs_with_role(pairs: Iterable[Mapping[str, Any]], role: str) -> list[dict[str, Any]]:
    """The pairs serving `role`, in pair id order."""
    if role not in ROLES:
        raise JobError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
    return sorted((dict(p) for p in pairs if role in p["roles"]), key=lambda p: p["pair_id"])
