"""The GPU host's job: the one folder format both host runs read, written here.

A job holds everything a GPU host needs to train and evaluate LLM surrogates of one dataset
version, and nothing it does not (no warehouse, no MLflow). Two runs read it; the job's `kind`
says which, so a job given to the other one is refused in one line:

    kind "variants"  `kernelcast train export` -> models/training/gpu_host/gpu_job.py: the
                     supervised and GRPO variants listed in job.json (variants.py)
    kind "code"      `kernelcast train code build-bundle` -> models/training/gpu_host/llm_code.py:
                     the code-reading heads, code-lora and its GRPO stage

    job.json          format, kind, dataset version, held-out task, tasks (description,
                      benchmark cases), hardware fingerprints, counts per role; "variants" for
                      kind "variants", "feature_names" for kind "code"
    kernels.jsonl.gz  kernel_id, task, parent_kernel_id, prompt_source, features (the compile
                      features the "+features" prompt styles show, or null)
    pairs.jsonl.gz    pair_id, task, hardware_id, anchor/candidate kernel ids, true_bin, speedup,
                      roles (list); kind "code" adds features (the pair's source-derived vector,
                      float32 values: what the heads and the boosted trees were fitted on)

A pair's roles are those of pipelines.surrogates.roles: `fit` and `calibration` (the training pool
and the calibration split carved from its lineages), `eval` (the in-distribution report split),
`external` (kernels the template generator did not write) and `held_out_fit`,
`held_out_calibration`, `held_out_eval` (the held-out-task setting: no pair of that task in the
first two). Nothing about a measured runtime travels but the label (the true bin, and S for the
heads fitted back here as regressions). Prompts are built on the host with models/prompts.py, so a
job is a few MB compressed whatever the prompt style.

Only the standard library: the GPU host reads this without the rest of the stack.
"""

from __future__ import annotations

import gzip
import json
from array import array
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

JOB_FILE = "job.json"
KERNELS_FILE = "kernels.jsonl.gz"
PAIRS_FILE = "pairs.jsonl.gz"
JOB_FORMAT = 2  # 2: one format for both runs, with `kind` (1: job.json of gpu_job alone)
RUNNERS = {"variants": "models.training.gpu_host.gpu_job", "code": "models.training.gpu_host.llm_code"}  # kind -> run
ROLES = ("fit", "calibration", "eval", "external", "held_out_fit", "held_out_calibration", "held_out_eval")
SCORED_ROLES = ("eval", "external", "held_out_eval")
# the compile features a kernel row's `features` holds: what the "+features" prompt styles show
PROMPT_FEATURES = ("n_regs", "n_spills", "shared_bytes", "n_kernels", "n_launches")


class JobError(ValueError):
    """A job or a host's output is missing, corrupt, of another format or kind (one line)."""


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


def float32s(values: Iterable[float]) -> list[float]:
    """The values rounded to float32, as Python floats (JSON keeps them exactly; NaN stays NaN).

    >>> float32s([0.1, 1.0])
    [0.10000000149011612, 1.0]
    """
    return array("f", values).tolist()


def write_job(folder: str | Path, kind: str, meta: Mapping[str, Any], kernels: Iterable[Mapping[str, Any]],
              pairs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Write a job folder (kernels and pairs first, job.json last, each whole); its job.json.

    Args:
        folder: created when missing.
        kind: "variants" or "code" (RUNNERS).
        meta: dataset_version, held_out_task, tasks, hardware, counts, and the kind's own fields.
        kernels: rows of KERNELS_FILE (kernel_id, task, prompt_source, features, parent_kernel_id).
        pairs: rows of PAIRS_FILE; a pair's `features` vector is stored as float32 values.
    Raises:
        JobError: an unknown kind or role.
    """
    if kind not in RUNNERS:
        raise JobError(f"unknown job kind {kind!r}; kinds are {', '.join(RUNNERS)}")
    pairs = [dict(p, features=float32s(p["features"])) if p.get("features") is not None else dict(p) for p in pairs]
    unknown = {r for p in pairs for r in p["roles"]} - set(ROLES)
    if unknown:
        raise JobError(f"unknown role(s) {', '.join(sorted(unknown))}; roles are {', '.join(ROLES)}")
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    write_jsonl_gz(root / KERNELS_FILE, kernels)
    write_jsonl_gz(root / PAIRS_FILE, pairs)
    out = {**meta, "format": JOB_FORMAT, "kind": kind}
    write_json(root / JOB_FILE, out)
    return out


def read_meta(folder: str | Path, kind: str | None = None) -> dict[str, Any]:
    """job.json of a job folder, checked for format and (when given) kind.

    Raises:
        JobError: no job.json, an unreadable one, another format, or a job for the other run.
    """
    root = Path(folder)
    try:
        meta = json.loads((root / JOB_FILE).read_text())
    except FileNotFoundError:
        raise JobError(f"{root}: not a training job (no {JOB_FILE})") from None
    except (OSError, json.JSONDecodeError) as e:
        raise JobError(f"{root / JOB_FILE}: unreadable ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != JOB_FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise JobError(f"{root}: job format {got!r}, this code reads {JOB_FORMAT} (write the job again)")
    if meta.get("kind") not in RUNNERS:
        raise JobError(f"{root}: unknown job kind {meta.get('kind')!r}; kinds are {', '.join(RUNNERS)}")
    if kind is not None and meta["kind"] != kind:
        raise JobError(f"{root}: a job of kind {meta['kind']!r}, run by {RUNNERS[meta['kind']]}, not {RUNNERS[kind]}")
    return meta


def read_job(folder: str | Path, kind: str | None = None) -> tuple[dict[str, Any], dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """(job.json, kernel_id -> kernel row, pairs) of a job folder.

    Args:
        kind: the kind the caller runs ("variants" or "code"); None reads either.
    Raises:
        JobError: a file is missing or unreadable, the job is of another format or kind, or a
            pair names a kernel or role the job lacks.
    """
    root = Path(folder)
    meta = read_meta(root, kind)
    kernels = {k["kernel_id"]: k for k in read_jsonl_gz(root / KERNELS_FILE)}
    pairs = read_jsonl_gz(root / PAIRS_FILE)
    missing = {p[k] for p in pairs for k in ("anchor_kernel_id", "candidate_kernel_id")} - set(kernels)
    if missing:
        raise JobError(f"{root}: {len(missing)} kernels of its pairs are missing, e.g. {sorted(missing)[0]}")
    unknown = {r for p in pairs for r in p["roles"]} - set(ROLES)
    if unknown:
        raise JobError(f"{root}: unknown role(s) {', '.join(sorted(unknown))}")
    return meta, kernels, pairs


def with_role(pairs: Iterable[Mapping[str, Any]], role: str) -> list[dict[str, Any]]:
    """The pairs serving `role`, in pair id order."""
    if role not in ROLES:
        raise JobError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
    return sorted((dict(p) for p in pairs if role in p["roles"]), key=lambda p: p["pair_id"])


def training_rows(meta: Mapping[str, Any], kernels: Mapping[str, Mapping[str, Any]], pairs: list[dict[str, Any]],
                  style: str) -> list[dict[str, Any]]:
    """The training rows (prompt, true_bin, pair_id) of `pairs` in prompt `style`, from the job's
    kernels and its task and hardware tables."""
    from models.training.rows import build_training_rows

    sources = {k: v["prompt_source"] for k, v in kernels.items()}
    feats = {k: v["features"] for k, v in kernels.items() if v.get("features")}
    return build_training_rows(pairs, sources, meta["tasks"], meta["hardware"], style=style, features=feats)


def leaking_pairs(pairs: Iterable[Mapping[str, Any]], kernels: Mapping[str, Mapping[str, Any]],
                  held_out_task: str | None) -> list[str]:
    """Pair ids of the job's training roles that touch a scored role's lineage; must be empty.

    A kernel is *scored* when it is the candidate of an eval, external or held-out-eval pair
    (task references anchor every split and are left out). A fit or calibration pair leaks when
    its candidate or anchor is a scored kernel of eval/external, or its parent or child (one
    generation, what the curation keeps apart); a held-out fit or calibration pair leaks when it
    is of the held-out task or touches an external kernel that way.
    """
    pairs = list(pairs)
    refs = {p["anchor_kernel_id"] for p in pairs if set(p["roles"]) & set(SCORED_ROLES)}  # the task references
    parent = {k: r.get("parent_kernel_id") for k, r in kernels.items() if r.get("parent_kernel_id")}

    def near(ids: set[str]) -> set[str]:
        out = set(ids) | {parent[k] for k in ids if k in parent}
        out |= {c for c, p in parent.items() if p in ids}
        return out - refs

    scored = {r: {p["candidate_kernel_id"] for p in pairs if r in p["roles"]} for r in SCORED_ROLES}
    in_dist_blocked = near(scored["eval"] | scored["external"])
    held_blocked = near(scored["external"])
    bad = []
    for p in pairs:
        ids = {p["anchor_kernel_id"], p["candidate_kernel_id"]}
        roles = set(p["roles"])
        if roles & {"fit", "calibration"} and (ids & in_dist_blocked or roles & {"eval", "external"}):
            bad.append(p["pair_id"])
        elif roles & {"held_out_fit", "held_out_calibration"} and (
                ids & held_blocked or roles & {"held_out_eval", "external"} or p["task"] == held_out_task):
            bad.append(p["pair_id"])
    return sorted(set(bad))
