"""The `code-embed` variants of a host run: boosted trees fitted here on what the LLM read there.

    kernelcast train code embed-head OUT --job JOB

A host run (models/training/gpu_host/llm_code.py) brings back `embeddings.parquet`: per setting
and pair, principal coordinates of the base model's hidden states over the pair's prompt and the
eight zero-shot label logits. This step fits models.training.embed_head per setting on the fit
role (log2 S), its spreads on the calibration role, and adds its forecasts of the scored roles to
OUT/forecasts.parquet and its record to OUT/metrics.json, as the host's own variants are, so
`ingest` commits and registers it like them.

How much of the LLM's reading a head takes is chosen per setting on the calibration role alone
(lowest Brier over GRID: the first k principal coordinates, with or without the zero-shot
logits): on the H200 data all 48 coordinates let the trees overfit the few thousand fit pairs
(docs/results/surrogate.md). Two ablations are scored beside it (the features alone, the LLM's
reading alone), so what the language model adds is a measured figure, not a claim; they are
recorded, not registered.

When the host run kept each setting's principal axes (embeddings.parquet's metadata), each
variant's head file OUT/embed-head-<variant>.zip holds what a pair no run held needs: the trees
and their spreads, k and the parts, the job's feature names, task and hardware tables, the
base model, prompt style and layers, and the first k axes (models.training.embed_head). `ingest
--register` keeps it with the version, and pipelines.forecasting.embed reads new pairs with it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from models.classical.spread import laplace_brier
from models.training.gpu_host.job import JobError, read_job, with_role
from models.training.gpu_host.llm_code import (
    EMBEDDINGS_FILE,
    FORECASTS_FILE,
    METRICS_FILE,
    SETTINGS,
)
from pipelines.surrogates.embed_rows import design
from warehouse.bin_edges import P_COLS

EMBED_VARIANT = "code-embed"
# (components, parts) the variant chooses from by calibration Brier
GRID = tuple((k, parts) for k in (2, 4, 8, 16, 48) for parts in (("features", "pc"), ("features", "pc", "zero_shot")))
ABLATIONS = {"features": (0, ("features",)), "llm": (48, ("pc", "zero_shot"))}


def _brier(p: np.ndarray, y: np.ndarray) -> float:
    return laplace_brier(p, y) if len(y) else float("nan")


def read_embeddings(results: Path) -> dict[str, dict[str, dict[str, list[float]]]]:
    """setting -> pair_id -> {"pc": [...], "zero_shot": [...]}; JobError when unreadable."""
    path = Path(results) / EMBEDDINGS_FILE
    try:
        frame = pl.read_parquet(path)
    except FileNotFoundError:
        raise JobError(f"{results}: no {EMBEDDINGS_FILE} (a host run of this version writes one)") from None
    except (OSError, pl.exceptions.PolarsError) as e:
        raise JobError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
    out: dict[str, dict[str, dict[str, list[float]]]] = {}
    for setting, pid, pc, zs in frame.select("setting", "pair_id", "pc", "zero_shot").rows():
        out.setdefault(setting, {})[pid] = {"pc": pc, "zero_shot": zs}
    return out


def fit_setting(pairs: list[dict[str, Any]], embedded: dict[str, dict[str, list[float]]], fit_role: str,
                cal_role: str, scored_roles: tuple[str, ...], parts: tuple[str, ...],
                k: int = 48) -> tuple[dict[str, np.ndarray], dict[str, Any], Any]:
    """Fit one head of one setting; (role -> (n, 8) forecasts of its pairs, record, the head)."""
    from models.training.embed_head import EmbedHeadSettings, fit_embed_head

    fit = [p for p in with_role(pairs, fit_role) if p["pair_id"] in embedded and p.get("speedup")]
    cal = [p for p in with_role(pairs, cal_role) if p["pair_id"] in embedded]
    if not fit or not cal:
        raise JobError(f"{fit_role}/{cal_role}: no pairs with embeddings (fit {len(fit)}, calibration {len(cal)})")
    settings = EmbedHeadSettings()
    t0 = time.time()
    x_fit = design(fit, embedded, parts, k)
    head = fit_embed_head(x_fit, np.log2([p["speedup"] for p in fit]),
                          design(cal, embedded, parts, k), np.array([p["true_bin"] for p in cal]),
                          [p["task"] for p in cal], settings)
    probs = {}
    for role in scored_roles:
        chosen = [p for p in with_role(pairs, role) if p["pair_id"] in embedded]
        probs[role] = (chosen, head.predict_proba(design(chosen, embedded, parts, k), [p["task"] for p in chosen]))
    record = {"settings": settings.to_dict(), "parts": list(parts), "components": k if "pc" in parts else 0,
              "fit_pairs": len(fit), "calibration_pairs": len(cal),
              "pooled_scale": head.pooled_scale, "task_scales": head.task_scales, "seconds": round(time.time() - t0, 2),
              "width": int(x_fit.shape[1])}
    return probs, record, head


def embed_head_file(variant: str) -> str:
    """The file in a results folder that holds what `variant` needs to forecast a new pair."""
    return f"embed-head-{variant}.zip"


def read_principal_axes(results: Path) -> dict[str, dict[str, np.ndarray]]:
    """setting -> its principal axes, from embeddings.parquet's metadata ({} for a host run that
    wrote none)."""
    import pyarrow.parquet as pq

    from models.training.gpu_host.llm_code import AXES_KEY, read_axes

    blob = (pq.read_schema(Path(results) / EMBEDDINGS_FILE).metadata or {}).get(AXES_KEY)
    if not blob:
        return {}
    try:
        return read_axes(blob)
    except Exception as e:  # noqa: BLE001 - base64, zip and npy each raise their own kind on a damaged blob
        raise JobError(f"{results}/{EMBEDDINGS_FILE}: its principal axes are unreadable ({type(e).__name__}: {e})") from None


def head_spec(meta: dict[str, Any], metrics: dict[str, Any], variant: str, setting: str, k: int,
              parts: tuple[str, ...], base_model: str) -> dict[str, Any]:
    """What a new pair's forecast reads besides the trees and the axes: the prompt the host built
    (style, the job's task and hardware tables), the model and layers that read it, and which
    of its reading the trees take, beside which features."""
    heads = [v for v in metrics.get("variants", {}).values() if v.get("kind") == "head" and v.get("prefill")]
    if not heads:
        raise JobError("metrics.json records no prefill of the heads (which layers were read)")
    return {"variant": variant, "setting": setting, "dataset_version": meta["dataset_version"],
            "base_model": base_model, "style": heads[0].get("style") or "full",
            "layers": [int(x) for x in heads[0]["prefill"]["layers"]], "components": k, "parts": list(parts),
            "feature_names": list(meta.get("feature_names") or []), "tasks": meta["tasks"],
            "hardware": meta["hardware"]}


def add_embed_variants(results: str | Path, job: str | Path, base_model: str = "smollm2") -> dict[str, Any]:
    """Fit `code-embed` (and its held-out twin) from OUT/embeddings.parquet and add them to OUT's
    forecasts and metrics; a summary with the ablations' Brier scores per role.

    When embeddings.parquet carries the principal axes, each variant's trees, axes and what else a
    new pair needs go to OUT/embed-head-<variant>.zip (models.training.embed_head.save_embed_head),
    which registration keeps with the version: it then forecasts pairs of files, the base model
    (`base_model`, the host run's) reading their prompt on this machine. Without them the summary
    says why under "not_forecasting_new_pairs".
    """
    from models.training.embed_head import save_embed_head

    results = Path(results)
    meta, _, pairs = read_job(job, "code")
    metrics = json.loads((results / METRICS_FILE).read_text()) if (results / METRICS_FILE).is_file() else None
    if metrics is None or metrics.get("dataset_version") != meta["dataset_version"]:
        raise JobError(f"{results} is not a host run of the job's dataset version {meta['dataset_version']}")
    if not any(p.get("speedup") for p in pairs):
        raise JobError(f"{job}: the pairs carry no speedup (a job built before the embedding head; build it again)")
    if not (results / FORECASTS_FILE).is_file():
        raise JobError(f"{results}: no {FORECASTS_FILE} (not a host run's output folder)")
    embeddings = read_embeddings(results)
    axes = read_principal_axes(results)
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"variants": [], "ablation": {}, "head_files": {}, "not_forecasting_new_pairs": {}}
    for setting, fit_role, cal_role, roles in SETTINGS:
        embedded = embeddings.get(setting)
        if not embedded:
            continue
        variant = EMBED_VARIANT if setting == "in_distribution" else f"{EMBED_VARIANT}-held-out"

        def scores(probs: dict[str, Any]) -> dict[str, float]:
            return {role: round(_brier(p, np.array([x["true_bin"] for x in chosen])), 4)
                    for role, (chosen, p) in probs.items()}

        tried = []
        for k, parts in GRID:  # the calibration role alone decides
            probs, record, head = fit_setting(pairs, embedded, fit_role, cal_role, roles, parts, k)
            tried.append((scores(probs)[cal_role], k, parts, probs, record, head))
        best_cal, k, parts, probs, record, head = min(tried, key=lambda t: t[0])
        summary["ablation"][variant] = {f"chosen (k={k}, {'+'.join(parts)})": scores(probs)}
        for name, (ak, aparts) in ABLATIONS.items():
            summary["ablation"][variant][name] = scores(fit_setting(pairs, embedded, fit_role, cal_role, roles, aparts, ak)[0])
        for role, (chosen, p) in probs.items():
            rows += [{"variant": variant, "role": role, "pair_id": x["pair_id"], "readout": "embed_head", "repeat": 0,
                      **dict(zip(P_COLS, map(float, row), strict=True))} for x, row in zip(chosen, p, strict=True)]
        metrics["variants"][variant] = {"kind": "embed_head", "setting": setting, "features": True,
                                        "style": metrics.get("variants", {}).get("code-head", {}).get("style"),
                                        "best_epoch": None, "history": [], **record,
                                        "grid": [{"components": t[1], "parts": list(t[2]), "calibration_brier": t[0]}
                                                 for t in tried],
                                        "ablation_brier": summary["ablation"][variant]}
        summary["variants"].append(variant)
        target = results / embed_head_file(variant)
        target.unlink(missing_ok=True)  # an earlier fit's head would not match these forecasts
        try:
            if setting not in axes:
                raise JobError(f"{EMBEDDINGS_FILE} carries no principal axes of {setting} "
                                  "(a host run before they were written)")
            spec = head_spec(meta, metrics, variant, setting, k, parts, base_model)
        except JobError as e:
            summary["not_forecasting_new_pairs"][variant] = str(e)
        else:
            k_axes = k if "pc" in parts else 0  # the trees read the first k coordinates: the rest is not kept
            save_embed_head(target, head, {**axes[setting], "axes": axes[setting]["axes"][:, :k_axes]}, spec)
            summary["head_files"][variant] = metrics["variants"][variant]["head_file"] = target.name
    if not rows:
        raise JobError(f"{results}/{EMBEDDINGS_FILE} holds no setting of the job")
    old = pl.read_parquet(results / FORECASTS_FILE)
    new = pl.DataFrame(rows, schema=old.schema)
    merged = pl.concat([old.filter(~pl.col("variant").is_in(summary["variants"])), new])
    tmp = results / (FORECASTS_FILE + ".part")
    merged.write_parquet(tmp, compression="zstd")
    tmp.replace(results / FORECASTS_FILE)
    (results / METRICS_FILE).write_text(json.dumps(metrics, indent=1, sort_keys=True, default=str))
    return summary
