"""Train the code-reading LLM surrogate variants of a job (kind "code") on a GPU host, within a time budget.

    python3 -m models.training.gpu_host.llm_code train --job JOB --out OUT --time-budget-s 420 \
        [--resume PREVIOUS_OUT]

The job is models/training/gpu_host/job.py's folder (`kernelcast train code build-bundle` writes
it).

In order, while the budget lasts (the clock is checked between and inside the steps, and the
outputs are written before it ends):
(b) heads: the base model reads every pair's prompt once (prefill, bf16 on a GPU) and small heads
    on its hidden states give the eight bins (models.training.head): `code-head` (hidden states
    only) and `code-head-features` (with the pair's source-derived feature vector beside them),
    each fitted on `fit` with the best epoch by calibration NLL, and their held-out-task twins
    fitted on `held_out_fit`. On a resumed run whose previous output holds them they are carried
    over, not fitted again.
(a) `code-lora`: supervised LoRA fine-tuning of the label tokens (models.training.supervised), several
    epochs across runs: its checkpoint (adapter, optimizer, schedule, position in the epoch)
    leaves in OUT and `--resume` takes it back; the best epoch by calibration NLL forecasts.
(c) `code-lora-grpo`: GRPO with the Brier reward on top of code-lora's best epoch, when the
    budget leaves room after (a) (models/training/gpu_host/code_grpo.py); not resumed across runs.

OUT receives at most 8 files of at most 16 MiB: embeddings.parquet (principal coordinates of the
hidden states per setting and pair), forecasts.parquet (variant, role, pair_id,
readout, p1..p8: raw forecasts; the temperature is fitted where they are ingested), metrics.json
(per variant its record and per-epoch history; the LoRA run's state), train.log, heads.pt, and
for the LoRA variant lora-best.tar and lora-state.pt.<i> (the resumable checkpoint, in parts).

Only the standard library, numpy, pyarrow, torch, transformers, peft and accelerate.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from models.training.gpu_host.job import (
    JobError,
    leaking_pairs,
    read_job,
    training_rows,
    with_role,
)

log = logging.getLogger("kernelcast.llm_code")

KIND = "code"  # the job kind this run reads (models/training/gpu_host/job.py)
FORECASTS_FILE = "forecasts.parquet"
METRICS_FILE = "metrics.json"
LOG_FILE = "train.log"
HEADS_FILE = "heads.pt"
EMBEDDINGS_FILE = "embeddings.parquet"
EMBED_COMPONENTS = 48  # principal coordinates of the hidden-state vector kept per pair and setting
AXES_KEY = b"kernelcast.principal_axes"  # embeddings.parquet metadata: the axes of each setting (axes_bytes)
LORA_BEST = "lora-best.tar"
LORA_STATE = "lora-state.pt"  # written in parts lora-state.pt.0, .1, ...
PART_BYTES = 15 * 1024 * 1024  # under the 16 MiB a returned file may weigh
MAX_OUT_FILES = 8
WRITE_RESERVE_S = 15.0  # the outputs are written in this last stretch of the budget
GRPO_MIN_S = 60.0  # GRPO is not started with less than this left besides its forecasts
HEAD_VARIANTS = {"code-head": False, "code-head-features": True}  # name -> reads the feature vector
LORA_VARIANT = "code-lora"


def head_grid(size: int = 3, epochs: int = 300):
    """The head settings tried per variant (the first `size`): the default, then more regularised,
    then narrower and less; seconds each on a GPU. 256 wide at most: four heads of the default
    layers weigh under 8 MB in heads.pt (float16), well under what a returned file may."""
    from models.training.head import HeadSettings

    grid = (HeadSettings(epochs=epochs), HeadSettings(dropout=0.5, weight_decay=0.1, epochs=epochs),
            HeadSettings(hidden=128, dropout=0.1, weight_decay=0.01, epochs=epochs))
    return grid[:max(1, size)]
# (setting, fit role, calibration role, roles forecast)
SETTINGS = (("in_distribution", "fit", "calibration", ("calibration", "eval", "external")),
            ("held_out_task", "held_out_fit", "held_out_calibration", ("held_out_calibration", "held_out_eval")))


@dataclasses.dataclass
class Clock:
    """The run's deadline and how long the steps took."""

    start: float
    budget_s: float
    marks: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def deadline(self) -> float:
        return self.start + self.budget_s

    def left(self) -> float:
        return self.deadline - time.time()

    def mark(self, step: str, since: float) -> None:
        self.marks[step] = round(time.time() - since, 2)



def _load_base(base_model: str):
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from models.base_model import resolve_base_model

    path = resolve_base_model(base_model)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.backends.cuda.enable_cudnn_sdp(False)  # as models.training.supervised: NaN backward at some lengths
        torch.backends.cuda.matmul.allow_tf32 = True
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16 if cuda else torch.float32)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to("cuda" if cuda else "cpu").eval(), tokenizer, path


def fast_encode(tokenizer: Any, rows: list[dict[str, Any]], chunk: int = 512) -> tuple[list[list[int]], list[int]]:
    """What models.training.supervised.encode_rows gives, with one tokenization per row instead of eight.

    The label ids are read off the first row by `label_split`; every row is then tokenized with
    the first label appended, in batches the fast tokenizer spreads over the cores, and its ids
    before that label token are the feed. A row whose last token is not the label (a merge
    across the boundary) goes through `label_split` itself, so the ids are always encode_rows'.
    """
    from models.backends.transformers_backend import label_split, render_chat
    from models.prompts import ANSWER_PREFIX, BIN_LABELS

    texts = [(r["prompt"] if isinstance(r["prompt"], str) else render_chat(tokenizer, r["prompt"])) + ANSWER_PREFIX
             for r in rows]
    if not texts:
        return [], []
    _, labels = label_split(tokenizer, texts[0])
    out: list[list[int]] = []
    for start in range(0, len(texts), chunk):
        part = texts[start:start + chunk]
        for text, ids in zip(part, tokenizer([t + BIN_LABELS[0] for t in part], add_special_tokens=False)["input_ids"],
                             strict=True):
            if ids and ids[-1] == labels[0]:
                out.append(list(ids[:-1]))
            else:
                feed, own = label_split(tokenizer, text)
                if own != labels:
                    raise ValueError("the bin labels tokenize differently across rows")
                out.append(feed)
    return out, labels


def _encode_all(tokenizer: Any, rows: list[dict[str, Any]], limit: int) -> tuple[list[list[int]], list[int], int]:
    """(ids per row, label ids, rows cut to fit `limit`)."""
    from models.training.head import truncate_middle

    ids, labels = fast_encode(tokenizer, rows)
    cut = sum(len(i) > limit for i in ids)
    return [truncate_middle(i, limit) for i in ids], labels, cut


def _forecast_rows(variant: str, role: str, pair_ids: list[str], probs: Any, readout: str) -> list[dict[str, Any]]:
    return [{"variant": variant, "role": role, "pair_id": pid, "readout": readout, "repeat": 0,
             **{f"p{j + 1}": float(x) for j, x in enumerate(row)}} for pid, row in zip(pair_ids, probs, strict=True)]


def run_heads(meta, kernels, pairs, model, tokenizer, clock: Clock, layers, tokens_per_batch: int,
              style: str, device: str, grid: Any = None, axes_out: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any],
                                                                  list[dict[str, Any]]]:
    """(b): embed every pair's prompt once, fit the heads of both settings, forecast.

    Returns:
        (forecast rows, metrics per variant, saved heads per variant, embedding rows per setting).
    """
    import numpy as np
    import torch

    from models.training.head import embed_prompts, head_probs, head_state, train_head

    grid = grid or head_grid()


    t0 = time.time()
    ordered = sorted(pairs, key=lambda p: p["pair_id"])
    index = {p["pair_id"]: i for i, p in enumerate(ordered)}
    rows = training_rows(meta, kernels, ordered, style)
    limit = int(getattr(model.config, "max_position_embeddings", 8192) or 8192) - 1
    ids, labels, cut = _encode_all(tokenizer, rows, limit)
    clock.mark("head_tokenize_s", t0)
    t1 = time.time()
    emb = embed_prompts(model, tokenizer, ids, labels, layers, tokens_per_batch,
                        autocast=device == "cuda", stop_at=clock.deadline - WRITE_RESERVE_S)
    if emb is None:
        raise TimeoutError("the prefill of the prompts did not finish within the budget")
    clock.mark("head_prefill_s", t1)
    tokens = sum(len(i) for i in ids)
    prefill = {"prompts": len(ids), "tokens": tokens, "truncated": cut,
               "tokens_per_s": round(tokens / max(1e-6, clock.marks["head_prefill_s"]), 1), "layers": list(layers)}
    log.info("prefill: %d prompts, %d tokens (%d cut to %d), %.0f tok/s", len(ids), tokens, cut, limit,
             prefill["tokens_per_s"])
    feats = np.array([p.get("features") or [] for p in ordered], dtype=np.float32)
    if feats.ndim != 2 or feats.shape[0] != len(ordered):
        feats = np.zeros((len(ordered), 0), dtype=np.float32)
    out_rows: list[dict[str, Any]] = []
    metrics: dict[str, Any] = {}
    saved: dict[str, Any] = {}
    embedded = embedding_rows(emb, ordered, pairs, EMBED_COMPONENTS, axes_out)
    for name, with_features in HEAD_VARIANTS.items():
        x_all = np.concatenate([emb, feats], axis=1) if with_features and feats.shape[1] else emb
        for setting, fit_role, cal_role, roles in SETTINGS:
            fit, cal = with_role(pairs, fit_role), with_role(pairs, cal_role)
            if not fit or not cal:
                continue
            variant = name if setting == "in_distribution" else f"{name}-held-out"
            if clock.left() < WRITE_RESERVE_S:
                log.info("no time left for %s", variant)
                continue

            def x_of(ps, x=x_all):
                return x[[index[p["pair_id"]] for p in ps]]

            head, record = None, None
            for settings in grid:  # the one of lowest calibration NLL is kept
                if record is not None and clock.left() < 2 * WRITE_RESERVE_S:
                    break
                h, r = train_head(x_of(fit), np.array([p["true_bin"] for p in fit]), x_of(cal),
                                  np.array([p["true_bin"] for p in cal]), settings,
                                  device=device, stop_at=clock.deadline - WRITE_RESERVE_S)
                r["grid"] = (record or {}).get("grid", []) + [{**settings.to_dict(), **r["best_calibration"]}]
                if record is None or r["best_calibration"]["nll"] < record["best_calibration"]["nll"]:
                    head, record = h, r
                else:
                    record["grid"] = r["grid"]
            for role in roles:
                chosen = with_role(pairs, role)
                if chosen:
                    out_rows += _forecast_rows(variant, role, [p["pair_id"] for p in chosen],
                                               head_probs(head, x_of(chosen)), "head")
            metrics[variant] = {"kind": "head", "setting": setting, "features": with_features, "style": style,
                                "fit_pairs": len(fit), "calibration_pairs": len(cal), "prefill": prefill, **record}
            saved[variant] = head_state(head, record)
            log.info("%s: best epoch %d of %d, calibration nll %.4f brier %.4f (%.1f s)", variant,
                     record["best_epoch"], len(record["history"]), record["best_calibration"]["nll"],
                     record["best_calibration"]["brier"], record["seconds"])
    del emb
    if device == "cuda":
        torch.cuda.empty_cache()
    return out_rows, metrics, saved, embedded


def embedding_rows(emb, ordered: list[dict[str, Any]], pairs: list[dict[str, Any]], k: int,
                   axes_out: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Per setting, every pair the setting scores or fits: its first `k` principal coordinates of
    the prefill's hidden-state vector (axes fitted on the setting's fit rows alone) and the eight
    zero-shot label logits. What a head fitted elsewhere (boosted trees beside the source
    features, models.training.embed_head) reads; a few MB for all pairs. Each setting's axes go
    into `axes_out` (setting -> principal_axes output), so a new pair can be projected later."""
    import numpy as np

    from models.training.head import principal_axes, project

    index = {p["pair_id"]: i for i, p in enumerate(ordered)}
    hidden, zero_shot = emb[:, :-8], emb[:, -8:]
    rows: list[dict[str, Any]] = []
    for setting, fit_role, _cal_role, roles in SETTINGS:
        used = {p["pair_id"] for role in (fit_role, *roles) for p in with_role(pairs, role)}
        fit = [index[p["pair_id"]] for p in with_role(pairs, fit_role)]
        if len(fit) < 2 or not used:
            continue
        chosen = np.array(sorted(index[pid] for pid in used))
        axes = principal_axes(hidden[chosen], np.searchsorted(chosen, fit), k)
        proj = project(hidden[chosen], axes)
        if axes_out is not None:
            axes_out[setting] = axes
        rows += [{"setting": setting, "pair_id": ordered[i]["pair_id"], "pc": [float(v) for v in proj[j]],
                  "zero_shot": [float(v) for v in zero_shot[i]]} for j, i in enumerate(chosen)]
    return rows


def axes_bytes(axes: dict[str, dict[str, Any]]) -> bytes:
    """Each setting's principal axes (head.principal_axes) as one .npz: "<setting>/mean", ...
    float32, base64 (Parquet readers want metadata values to be text); about 1 MB a setting for
    three layers of SmolLM2-135M and 48 axes."""
    import base64
    import io

    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, **{f"{setting}/{name}": np.asarray(v, dtype=np.float32)
                     for setting, a in axes.items() for name, v in a.items()})
    return base64.b64encode(buf.getvalue())


def read_axes(blob: bytes) -> dict[str, dict[str, Any]]:
    """axes_bytes read back: setting -> {"mean", "scale", "axes"}."""
    import base64
    import io

    import numpy as np

    out: dict[str, dict[str, Any]] = {}
    with np.load(io.BytesIO(base64.b64decode(blob))) as z:
        for key in z.files:
            setting, name = key.rsplit("/", 1)
            out.setdefault(setting, {})[name] = z[key]
    return out


def _lora_settings(args: argparse.Namespace):
    from models.training.supervised import SupervisedSettings

    return SupervisedSettings(base_model=args.base_model, finetune="lora", lora_rank=args.lora_rank,
                              learning_rate=args.lora_lr, epochs=args.lora_epochs, patience=args.lora_patience,
                              tokens_per_batch=args.tokens_per_batch // 2, label_smoothing=0.1, seed=0)


def split_file(path: Path, part_bytes: int = PART_BYTES) -> list[Path]:
    """`path` cut into path.0, path.1, ... of at most part_bytes each; the original removed."""
    parts = []
    with open(path, "rb") as f:
        i = 0
        while chunk := f.read(part_bytes):
            part = path.with_name(f"{path.name}.{i}")
            part.write_bytes(chunk)
            parts.append(part)
            i += 1
    path.unlink()
    return parts


def join_parts(folder: Path, name: str, target: Path) -> bool:
    """Concatenate folder/name.0, .1, ... into target; False when there is no part 0."""
    parts = sorted(folder.glob(f"{name}.*"), key=lambda p: int(p.suffix[1:]) if p.suffix[1:].isdigit() else -1)
    parts = [p for p in parts if p.suffix[1:].isdigit()]
    if not parts or parts[0].suffix != ".0":
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as out:
        for p in parts:
            out.write(p.read_bytes())
    return True


def _restore_lora(resume: Path | None, work: Path) -> None:
    """The previous run's LoRA checkpoint and best adapter into the work folder."""
    from models.training.supervised import BEST_DIR, STATE_FILE

    if resume is None:
        return
    if join_parts(resume, LORA_STATE, work / "ckpt" / STATE_FILE):
        log.info("resuming the LoRA run from %s", resume)
    if (resume / LORA_BEST).is_file():
        shutil.rmtree(work / "sft" / BEST_DIR, ignore_errors=True)
        with tarfile.open(resume / LORA_BEST) as tar:
            for m in tar.getmembers():
                if m.isfile() and "/" not in m.name and ".." not in m.name:
                    (work / "sft" / BEST_DIR).mkdir(parents=True, exist_ok=True)
                    (work / "sft" / BEST_DIR / m.name).write_bytes(tar.extractfile(m).read())


UNMEASURED_TOKENS_PER_S = {"cuda": 250_000.0, "cpu": 2000.0}  # prefill rates when (b) did not run (H200: 228k measured)


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def forecast_seconds(pairs: list[dict[str, Any]], tokens_per_s: float | None, device: str = "cpu") -> float:
    """What forecasting the calibration, eval and external pairs with a LoRA model takes: the
    prefill rate of (b) when measured (else a cautious rate for the device), halved for the
    adapter's extra matmuls, 4k tokens a prompt at most, plus loading."""
    n = sum(len(with_role(pairs, r)) for r in ("calibration", "eval", "external"))
    rate = tokens_per_s or UNMEASURED_TOKENS_PER_S.get(device, UNMEASURED_TOKENS_PER_S["cpu"])
    return 10.0 + n * 4096 / (rate / 2)


def run_lora(args, meta, kernels, pairs, clock: Clock, work: Path, tokens_per_s: float | None,
             device: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(a): resume or start the LoRA run, train until its epochs or the time end, forecast with
    its best epoch. Returns (forecast rows, its metrics) ((rows, None) when nothing ran)."""
    import torch

    from models.training.supervised import BEST_DIR, encode_rows, readout_probs, train_supervised

    fit, cal = with_role(pairs, "fit"), with_role(pairs, "calibration")
    if not fit or not cal:
        return [], None
    scored = {r: with_role(pairs, r) for r in ("calibration", "eval", "external")}
    eval_s = forecast_seconds(pairs, tokens_per_s, device)
    # Only what came back from the previous run is resumed, never a stale scratch folder.
    for stale in ("ckpt", "sft", "merged", "grpo", "grpo-ckpt"):
        shutil.rmtree(work / stale, ignore_errors=True)
    _restore_lora(args.resume, work)
    settings = _lora_settings(args)
    stop_at = clock.deadline - WRITE_RESERVE_S - eval_s
    if stop_at - time.time() < 10:
        log.info("code-lora: %.0f s left, forecasting needs ~%.0f s: not training", clock.left(), eval_s)
        return [], None
    t0 = time.time()
    train_rows, cal_rows = training_rows(meta, kernels, fit, args.lora_style), training_rows(meta, kernels, cal, args.lora_style)
    result = train_supervised(settings, train_rows, cal_rows, work / "sft", work / "ckpt", stop_at=stop_at,
                              on_epoch=lambda r: log.info("code-lora %s", json.dumps(r)))
    clock.mark("lora_train_s", t0)
    record: dict[str, Any] = {"kind": "lora", "setting": "in_distribution", "style": args.lora_style,
                              "settings": settings.as_params(), "finished": result.finished,
                              "best_epoch": result.best_epoch, "epochs_run": len(result.history),
                              "history": result.history, "rows_used": result.rows_used}
    rows: list[dict[str, Any]] = []
    best = work / "sft" / BEST_DIR
    if result.best_epoch and (best / "adapter_config.json").is_file() and clock.left() > WRITE_RESERVE_S + 5:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

        from models.base_model import resolve_base_model

        t1 = time.time()
        base = AutoModelForCausalLM.from_pretrained(str(resolve_base_model(args.base_model)), dtype=torch.float32)
        model = PeftModel.from_pretrained(base, str(best)).to(device).eval()
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(best))
        for role, chosen in scored.items():
            if not chosen or clock.left() < WRITE_RESERVE_S:
                continue
            enc, labels = encode_rows(tokenizer, training_rows(meta, kernels, chosen, args.lora_style))
            probs = readout_probs(model, tokenizer, enc, labels, args.tokens_per_batch, autocast=device == "cuda")
            rows += _forecast_rows(LORA_VARIANT, role, [p["pair_id"] for p in chosen], probs.double().numpy(), "logprob")
        clock.mark("lora_forecast_s", t1)
        record["forecast_epoch"] = result.best_epoch
    return rows, record


def _maybe_grpo(args, pairs, clock: Clock, work: Path, tokens_per_s: float | None,
                rows: list[dict[str, Any]], metrics: dict[str, Any]) -> None:
    """(c) when the LoRA run has a best epoch and the budget leaves room; else why not."""
    from models.training.gpu_host.code_grpo import GRPO_VARIANT, run_grpo_bounded
    from models.training.supervised import BEST_DIR

    best = work / "sft" / BEST_DIR
    # GRPO's forecasts read the same prompts with a model of the same size as code-lora's: the
    # time those took (measured) beats the token estimate, which assumes 4k-token prompts.
    measured = clock.marks.get("lora_forecast_s")
    eval_s = 10.0 + 1.25 * measured if measured else forecast_seconds(pairs, tokens_per_s, _device())
    if args.grpo_steps <= 0:
        metrics["skipped"]["grpo"] = "not asked for (--grpo-steps 0)"
        return
    if LORA_VARIANT not in metrics["variants"] or not (best / "adapter_config.json").is_file():
        metrics["skipped"]["grpo"] = "code-lora has no best epoch yet"
        return
    if clock.left() < WRITE_RESERVE_S + eval_s + GRPO_MIN_S:
        metrics["skipped"]["grpo"] = f"{clock.left():.0f} s left; GRPO and its forecasts need ~{GRPO_MIN_S + eval_s:.0f} s"
        return
    t0 = time.time()
    grpo_rows, record = run_grpo_bounded(args.job, work, args.base_model, args.lora_style, args.grpo_steps,
                                         args.grpo_warmup_steps, clock.deadline - WRITE_RESERVE_S - eval_s,
                                         clock.deadline - WRITE_RESERVE_S)
    clock.mark("grpo_s", t0)
    if grpo_rows:
        rows += grpo_rows
        metrics["variants"][GRPO_VARIANT] = record
    else:
        metrics["skipped"]["grpo"] = record


def _carry_heads(resume: Path | None) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]] | None:
    """The heads, their forecasts and metrics of a previous run's output, when it has them all."""
    if resume is None or not (resume / HEADS_FILE).is_file() or not (resume / FORECASTS_FILE).is_file():
        return None
    import pyarrow.parquet as pq
    import torch

    saved = torch.load(resume / HEADS_FILE, map_location="cpu", weights_only=False)
    rows = [r for r in pq.read_table(resume / FORECASTS_FILE).to_pylist() if r["variant"] in saved]
    variants = json.loads((resume / METRICS_FILE).read_text()).get("variants", {}) if (resume / METRICS_FILE).is_file() else {}
    if not rows or any(v not in variants for v in saved):
        return None
    return rows, {v: variants[v] for v in saved}, saved


def _write_parquet(path: Path, rows: list[dict[str, Any]], schema: Any) -> None:
    """Rows as a zstd Parquet file of `schema` (pyarrow), written whole (tmp, then rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = path.with_name(path.name + ".part")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp, compression="zstd")
    tmp.replace(path)


def write_outputs(out: Path, rows: list[dict[str, Any]], metrics: dict[str, Any], heads: dict[str, Any],
                  work: Path, meta: dict[str, Any], embedded: list[dict[str, Any]] | None = None,
                  axes: dict[str, Any] | None = None) -> list[Path]:
    """forecasts.parquet, metrics.json, heads.pt, embeddings.parquet (with each setting's principal
    axes in its metadata, `AXES_KEY`) and the LoRA files into `out`; the files written."""
    import pyarrow as pa
    import torch

    from models.training.supervised import BEST_DIR, STATE_FILE

    out.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("variant", pa.string()), ("role", pa.string()), ("pair_id", pa.string()),
                        ("readout", pa.string()), ("repeat", pa.int64()), *[(f"p{i}", pa.float64()) for i in range(1, 9)]])
    _write_parquet(out / FORECASTS_FILE, rows, schema)
    if embedded:
        schema = pa.schema([("setting", pa.string()), ("pair_id", pa.string()),
                            ("pc", pa.list_(pa.float32())), ("zero_shot", pa.list_(pa.float32()))])
        if axes:
            schema = schema.with_metadata({AXES_KEY: axes_bytes(axes)})
        _write_parquet(out / EMBEDDINGS_FILE, embedded, schema)
    if heads:
        tmp = out / (HEADS_FILE + ".part")
        torch.save(heads, tmp)
        tmp.replace(out / HEADS_FILE)
    state = work / "ckpt" / STATE_FILE
    for old in out.glob(f"{LORA_STATE}.*"):
        old.unlink()
    if state.is_file():
        shutil.copy(state, out / LORA_STATE)
        split_file(out / LORA_STATE)
    best = work / "sft" / BEST_DIR
    if (best / "adapter_config.json").is_file():
        tmp = out / (LORA_BEST + ".part")
        with tarfile.open(tmp, "w") as tar:
            for f in sorted(best.iterdir()):
                if f.is_file():
                    tar.add(f, arcname=f.name)
        tmp.replace(out / LORA_BEST)
    metrics_path = out / METRICS_FILE
    metrics_path.write_text(json.dumps(metrics, indent=1, sort_keys=True, default=str))
    files = sorted(p for p in out.iterdir() if p.is_file() and not p.name.endswith(".part"))
    too_big = [p.name for p in files if p.stat().st_size > 16 * 1024 * 1024]
    if too_big or len(files) > MAX_OUT_FILES:
        log.warning("outputs exceed what may come back: %d files, too big: %s", len(files), ", ".join(too_big) or "none")
    return files


def train(args: argparse.Namespace) -> int:
    """The `train` command; 0 when something was forecast, 1 when nothing was."""
    clock = Clock(time.time(), float(args.time_budget_s))
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(out / LOG_FILE, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        return _train(args, clock, out, work)
    finally:
        root.removeHandler(handler)
        handler.close()


def _train(args: argparse.Namespace, clock: Clock, out: Path, work: Path) -> int:
    import torch

    meta, kernels, pairs = read_job(args.job, KIND)
    leaks = leaking_pairs(pairs, kernels, meta.get("held_out_task"))
    if leaks:
        raise JobError(f"{len(leaks)} training pairs touch a scored split's lineage (first: {leaks[0]})")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    metrics: dict[str, Any] = {"dataset_version": meta["dataset_version"], "held_out_task": meta.get("held_out_task"),
                               "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
                               "time_budget_s": args.time_budget_s, "variants": {}, "skipped": {}}
    rows: list[dict[str, Any]] = []
    heads: dict[str, Any] = {}
    embedded: list[dict[str, Any]] = []
    axes: dict[str, Any] = {}
    tokens_per_s = None
    carried = None if args.redo_heads else _carry_heads(args.resume)
    if carried is not None:
        rows, metrics["variants"], heads = carried
        log.info("heads carried over from %s: %s", args.resume, ", ".join(heads))
        tokens_per_s = next((v.get("prefill", {}).get("tokens_per_s") for v in metrics["variants"].values()), None)
    elif not args.skip_heads:
        t0 = time.time()
        model, tokenizer, _ = _load_base(args.base_model)
        clock.mark("load_s", t0)
        layers = tuple(int(x) for x in args.layers.split(","))
        try:
            head_rows, head_metrics, heads, embedded = run_heads(meta, kernels, pairs, model, tokenizer, clock, layers,
                                                       args.tokens_per_batch, args.style, device,
                                                       head_grid(args.head_grid, args.head_epochs), axes)
            rows += head_rows
            metrics["variants"].update(head_metrics)
            tokens_per_s = next((v["prefill"]["tokens_per_s"] for v in head_metrics.values()), None)
        except TimeoutError as e:
            metrics["skipped"]["heads"] = str(e)
            log.info("%s", e)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    if args.lora_epochs > 0:
        lora_rows, lora_metrics = run_lora(args, meta, kernels, pairs, clock, work, tokens_per_s, device)
        rows += lora_rows
        if lora_metrics is not None:
            metrics["variants"][LORA_VARIANT] = lora_metrics
        else:
            metrics["skipped"][LORA_VARIANT] = "too little time left or no fit/calibration pairs"
    _maybe_grpo(args, pairs, clock, work, tokens_per_s, rows, metrics)
    metrics["seconds"] = {**clock.marks, "total": round(time.time() - clock.start, 1)}
    files = write_outputs(out, rows, metrics, heads, work, meta, embedded, axes)
    log.info("wrote %s in %.1f s of a %.0f s budget", ", ".join(f.name for f in files), time.time() - clock.start,
             clock.budget_s)
    for name, v in metrics["variants"].items():
        best = v.get("best_calibration") or (v.get("history") or [{}])[-1]
        print(f"{name:30s} best_epoch={v.get('best_epoch')} calibration_nll={best.get('nll', best.get('calibration_nll'))}")
    return 0 if rows else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m models.training.gpu_host.llm_code", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="fit the heads, then LoRA epochs while the budget lasts")
    t.add_argument("--job", dest="job", required=True, type=Path, help="the job folder (kind code)")
    t.add_argument("--out", required=True, type=Path, help="what comes back (at most 8 files of 16 MiB)")
    t.add_argument("--time-budget-s", type=float, default=420.0)
    t.add_argument("--resume", type=Path, default=None, help="a previous run's OUT (heads and LoRA checkpoint)")
    t.add_argument("--work", type=Path, default=Path("/tmp/kernelcast-llm-code"), help="scratch folder")
    t.add_argument("--base-model", default="smollm2")
    t.add_argument("--style", default="full", help="prompt style (models/prompts.py)")
    t.add_argument("--layers", default="10,20,-1", help="hidden-state layers the heads read")
    t.add_argument("--tokens-per-batch", type=int, default=65536)
    t.add_argument("--skip-heads", action="store_true")
    t.add_argument("--head-grid", type=int, default=3, help="head settings tried per variant (1-3)")
    t.add_argument("--head-epochs", type=int, default=300, help="most epochs of a head")
    t.add_argument("--redo-heads", action="store_true", help="fit the heads again on a resumed run")
    t.add_argument("--lora-epochs", type=int, default=4, help="0: no LoRA run")
    t.add_argument("--lora-rank", type=int, default=8, help="8 keeps the checkpoint at two 15 MiB parts")
    # The compact prompt: an epoch of the full one takes ~2x as long (~400 s on the H200 for 6k pairs).
    t.add_argument("--lora-style", default="compact+features", help="prompt style of the LoRA variant")
    t.add_argument("--lora-lr", type=float, default=1e-3)
    t.add_argument("--lora-patience", type=int, default=2)
    t.add_argument("--grpo-steps", type=int, default=10, help="GRPO steps on code-lora when time is left (0: none)")
    t.add_argument("--grpo-warmup-steps", type=int, default=40, help="format warm-up steps per round before GRPO (on a GPU, rounds go on until 6 of 8 probe answers parse, at most 6)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        return train(args)
    except (ValueError, FileNotFoundError) as e:  # a bad job (JobError), settings or base model: one line
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
