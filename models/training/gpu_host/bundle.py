"""The code-reading LLM's bundle: what `build-bundle` writes here and a GPU host trains from.

    meta.json        format, dataset version, held-out task, tasks (description, benchmark
                     cases), hardware fingerprints, feature names, counts per role
    pairs.parquet    pair_id, task, hardware_id, anchor/candidate kernel ids, true_bin, roles
                     (list), features (list of floats: the pair's source-derived vector),
                     speedup (S, for heads fitted here as regressions; the host run reads only
                     the bin)
    kernels.parquet  kernel_id, task, parent_kernel_id, prompt_source, features_json (the
                     compile features the "+features" prompt styles show, or null)

A pair's roles are those of pipelines.surrogates.roles: `fit` and `calibration` (the training pool
and the calibration split carved from its lineages), `eval` (the in-distribution report split),
`external` (kernels the template generator did not write), and `held_out_fit`,
`held_out_calibration`, `held_out_eval` (the held-out-task setting: no pair of that task in the
first two). Nothing about a measured runtime travels but the label (the true bin, and S for the
boosted head fitted back here, models.training.embed_head). The prompts
are built on the host with models/prompts.py, so the bundle stays a few MB.

Only the standard library and pyarrow: the GPU host reads this without the rest of the stack.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

META_FILE = "meta.json"
PAIRS_FILE = "pairs.parquet"
KERNELS_FILE = "kernels.parquet"
BUNDLE_FORMAT = 1
ROLES = ("fit", "calibration", "eval", "external", "held_out_fit", "held_out_calibration", "held_out_eval")
SCORED_ROLES = ("eval", "external", "held_out_eval")


class BundleError(ValueError):
    """A bundle is missing, corrupt or of another format (one line)."""


def write_parquet(path: Path, rows: list[dict[str, Any]], schema: Any) -> None:
    """Rows as a zstd Parquet file of `schema` (pyarrow), written whole (tmp, then rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = path.with_name(path.name + ".part")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp, compression="zstd")
    tmp.replace(path)


def pair_schema():
    import pyarrow as pa

    return pa.schema([("pair_id", pa.string()), ("task", pa.string()), ("hardware_id", pa.string()),
                      ("anchor_kernel_id", pa.string()), ("candidate_kernel_id", pa.string()),
                      ("true_bin", pa.int64()), ("roles", pa.list_(pa.string())), ("features", pa.list_(pa.float32())),
                      ("speedup", pa.float64())])


def kernel_schema():
    import pyarrow as pa

    return pa.schema([("kernel_id", pa.string()), ("task", pa.string()), ("parent_kernel_id", pa.string()),
                      ("prompt_source", pa.string()), ("features_json", pa.string())])


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except FileNotFoundError:
        raise BundleError(f"{path}: no such file") from None
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds on a damaged file
        raise BundleError(f"{path}: unreadable ({type(e).__name__}: {e})") from None


def read_bundle(folder: str | Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """(meta.json, kernel_id -> kernel row with `features` parsed, pairs) of a bundle folder.

    Raises:
        BundleError: a file is missing or unreadable, of another format, or a pair names a
            kernel or role the bundle lacks.
    """
    root = Path(folder)
    try:
        meta = json.loads((root / META_FILE).read_text())
    except FileNotFoundError:
        raise BundleError(f"{root}: not a bundle (no {META_FILE})") from None
    except json.JSONDecodeError as e:
        raise BundleError(f"{root / META_FILE}: unreadable ({e})") from None
    if meta.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{root}: bundle format {meta.get('format')!r}, this code reads {BUNDLE_FORMAT}")
    kernels = {}
    for k in _read_parquet(root / KERNELS_FILE):
        k["features"] = json.loads(k["features_json"]) if k.get("features_json") else None
        kernels[k["kernel_id"]] = k
    pairs = _read_parquet(root / PAIRS_FILE)
    missing = {p[k] for p in pairs for k in ("anchor_kernel_id", "candidate_kernel_id")} - set(kernels)
    if missing:
        raise BundleError(f"{root}: {len(missing)} kernels of its pairs are missing, e.g. {sorted(missing)[0]}")
    unknown = {r for p in pairs for r in p["roles"]} - set(ROLES)
    if unknown:
        raise BundleError(f"{root}: unknown role(s) {', '.join(sorted(unknown))}")
    return meta, kernels, pairs


def with_role(pairs: Iterable[Mapping[str, Any]], role: str) -> list[dict[str, Any]]:
    """The pairs serving `role`, in pair id order."""
    if role not in ROLES:
        raise BundleError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
    return sorted((dict(p) for p in pairs if role in p["roles"]), key=lambda p: p["pair_id"])


def leaking_pairs(pairs: Iterable[Mapping[str, Any]], kernels: Mapping[str, Mapping[str, Any]],
                  held_out_task: str | None) -> list[str]:
    """Pair ids of the bundle's training roles that touch a scored role's lineage; must be empty.

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


def code_rows(meta: dict[str, Any], kernels: dict[str, dict[str, Any]], pairs: list[dict[str, Any]],
              style: str) -> list[dict[str, Any]]:
    """The training rows (prompt, label) of `pairs`, from the bundle's kernels and tables."""
    from models.training.rows import build_training_rows

    sources = {k: v["prompt_source"] for k, v in kernels.items()}
    feats = {k: v["features"] for k, v in kernels.items() if v.get("features")}
    return build_training_rows(pairs, sources, meta["tasks"], meta["hardware"], style=style, features=feats)
