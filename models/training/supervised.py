"""Supervised distributional training of a causal LM surrogate (method.md section 5b).

At the logprob-readout position (chat prompt + `ANSWER_PREFIX`, models/prompts.py) the model's
next-token distribution over the eight bin labels "1".."8", renormalised over the eight, is the
forecast. This trains it with cross-entropy against the true bin, optionally smoothed onto the
neighbouring bins (ordinal label smoothing: a pair just over an edge is not a different world
from one just under it). Cross-entropy is a proper scoring rule, so the model is trained towards
calibrated distributions; a temperature fitted afterwards on the calibration split
(models.calibration) corrects what is left, and GRPO with the Brier/CRPS rewards
(models.training) may follow.

    settings = SupervisedSettings(base_model="smollm2", finetune="full", epochs=6)
    result = train_supervised(settings, train_rows, calibration_rows, out_dir="run/sft",
                              checkpoint_dir="run/sft-ckpt", stop_at=time.time() + 500)

Rows are `models.training.build_training_rows` output: {"prompt": messages, "true_bin", "pair_id"}.

How it runs:
- Length-bucketed batches: rows sorted by length are cut into batches of at most
  `tokens_per_batch` padded tokens, and the batch order is shuffled each epoch (seeded), so
  padding stays small and every epoch sees every row once.
- Only the readout position is projected onto the vocabulary, and only onto the eight label
  rows of the output embedding: the logits of a 49k-token vocabulary at every position would
  cost more memory than the rest of the forward pass.
- Full fine-tuning for small models, LoRA (peft) for large ones (`finetune`).
- After every epoch the calibration rows are scored (NLL, Brier, accuracy); the weights of the
  best epoch by calibration NLL are kept, and training stops early after `patience` epochs
  without improvement.
- `checkpoint_dir` holds the whole state (weights, optimizer, scheduler, epoch, position in the
  epoch, history) and is rewritten when `stop_at` is reached and at every epoch end; a later call
  with the same settings and rows resumes from it and ends exactly as one uninterrupted run
  would (the batch order of an epoch depends only on the seed and the epoch).
- Data-parallel through accelerate (models.training.data_parallel): the same call runs as one process or
  as each of N processes of
  `accelerate launch --config_file deploy/accelerate/multi_gpu.yaml --num_processes N -m ...`.
  Each batch is split over the processes and the gradients are averaged, so N processes train
  the model one process would, N times faster per step; calibration rows are scored in shares
  and gathered. The main process alone writes the weights, the history and the checkpoint.

Only torch, transformers, peft and accelerate: this runs on a GPU host without the rest of the stack.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from models.backends.transformers_backend import left_pad
from models.bins import NUM_BINS
from models.prompts import ANSWER_PREFIX
from models.training.data_parallel import (
    any_process,
    gather_rows,
    make_accelerator,
    row_share,
    share_weight,
    sum_over_processes,
)
from models.training.settings import PAPER_LORA_RANK

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"
HISTORY_FILE = "history.json"
BEST_DIR = "best"
FINETUNES = ("full", "lora")


@dataclass(frozen=True)
class SupervisedSettings:
    """Everything that decides a supervised run; logged with the model version.

    Attributes:
        base_model: "smollm2", "tiny", a checkpoint directory or a cached HF id
            (models.base_model.resolve_base_model).
        finetune: "full" (every weight; small models) or "lora" (an adapter; large models).
        lora_rank: LoRA r when finetune="lora" (alpha = 2r, all linear layers).
        learning_rate: peak rate (full: 1e-4 suits a 135M model; LoRA wants ~1e-3).
        epochs: most epochs (the rate decays to 10% over them, cosine).
        patience: stop after this many epochs without a lower calibration NLL (0 = never).
        warmup_steps: linear warm-up of the rate.
        tokens_per_batch: padded tokens per optimizer step (length-bucketed batches), over all
            processes of a data-parallel run (each trains on its share of the batch's rows).
        label_smoothing: mass moved from the true bin to its neighbours (ordinal), e.g. 0.1.
        weight_decay: AdamW decay.
        grad_clip: gradient norm clip.
        gradient_checkpointing: recompute activations in the backward pass (memory for time).
        precision: "auto" (bf16 autocast on a GPU, fp32 on CPU), "fp32" or "bf16-autocast".
        max_prompt_tokens: rows with longer prompts are left out; None = the model's context.
        seed: batch order, LoRA init.
    """

    base_model: str = "smollm2"
    finetune: str = "full"
    lora_rank: int = PAPER_LORA_RANK
    learning_rate: float = 1e-4
    epochs: int = 6
    patience: int = 1
    warmup_steps: int = 20
    tokens_per_batch: int = 65536
    label_smoothing: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    gradient_checkpointing: bool = False
    precision: str = "auto"
    max_prompt_tokens: int | None = None
    seed: int = 0
    tags: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.finetune not in FINETUNES:
            raise ValueError(f"finetune must be one of {FINETUNES}, got {self.finetune!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.epochs < 1 or self.tokens_per_batch < 1:
            raise ValueError("epochs and tokens_per_batch must be >= 1")
        if self.precision not in ("auto", "fp32", "bf16-autocast"):
            raise ValueError(f"precision must be auto, fp32 or bf16-autocast, got {self.precision!r}")

    def as_params(self) -> dict[str, str]:
        return {k: str(v) for k, v in dataclasses.asdict(self).items() if k != "tags"}


@dataclass
class SupervisedResult:
    """What a supervised run produced.

    Attributes:
        model_dir: the best epoch's weights (a full checkpoint, or a LoRA adapter) + tokenizer.
        history: one dict per finished epoch (train_loss, calibration nll/brier/accuracy, seconds).
        best_epoch: 1-based epoch whose weights are in model_dir (0: none finished yet).
        finished: False when `stop_at` ended the call first (resume from checkpoint_dir).
        rows_used: training rows that fit the context.
    """

    model_dir: Path
    history: list[dict[str, Any]]
    best_epoch: int
    finished: bool
    rows_used: int


def ordinal_targets(true_bin: torch.Tensor, smoothing: float) -> torch.Tensor:
    """(n, 8) soft targets: 1 - smoothing on the true bin, the rest split over its neighbours.

    >>> ordinal_targets(torch.tensor([1, 4]), 0.2).tolist()
    [[0.800000011920929, 0.20000000298023224, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.10000000149011612, 0.800000011920929, 0.10000000149011612, 0.0, 0.0, 0.0]]
    """
    n = true_bin.shape[0]
    out = torch.zeros(n, NUM_BINS)
    idx = true_bin.long() - 1
    out[torch.arange(n), idx] = 1.0 - smoothing
    if smoothing:
        lower, upper = idx - 1, idx + 1
        has_lower, has_upper = lower >= 0, upper < NUM_BINS
        share = smoothing / (has_lower.float() + has_upper.float())
        rows = torch.arange(n)
        out[rows[has_lower], lower[has_lower]] += share[has_lower]
        out[rows[has_upper], upper[has_upper]] += share[has_upper]
    return out


def encode_rows(tokenizer: Any, rows: Sequence[dict[str, Any]]) -> tuple[list[list[int]], list[int]]:
    """(prompt ids up to the answer prefix, the eight label token ids) of each row.

    Exactly what the logprob readout feeds (models.backends.transformers_backend.label_split),
    so a trained model is read the way it was trained.
    """
    from models.backends.transformers_backend import label_split, render_chat

    ids, labels = [], None
    for r in rows:
        prompt = r["prompt"] if isinstance(r["prompt"], str) else render_chat(tokenizer, r["prompt"])
        feed, lab = label_split(tokenizer, prompt + ANSWER_PREFIX)
        if labels is None:
            labels = lab
        elif lab != labels:
            raise ValueError("the bin labels tokenize differently across rows")
        ids.append(feed)
    return ids, labels or []


def length_batches(lengths: Sequence[int], tokens_per_batch: int) -> list[list[int]]:
    """Row indices cut into batches of at most `tokens_per_batch` padded tokens, by length.

    >>> length_batches([5, 1, 4, 2], 8)
    [[1, 3], [2], [0]]
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        longest_if = max(longest, lengths[i])
        if current and longest_if * (len(current) + 1) > tokens_per_batch:
            batches.append(current)
            current, longest_if = [], lengths[i]
        current.append(i)
        longest = longest_if
    if current:
        batches.append(current)
    return batches


def _backbone_and_head(model: Any) -> tuple[Any, torch.Tensor]:
    """(the decoder stack returning hidden states, the output embedding matrix)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model, base.get_output_embeddings().weight


def label_logits(model: Any, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 label_ids: torch.Tensor) -> torch.Tensor:
    """(batch, 8) logits of the eight labels at the last position, without full-vocab logits."""
    backbone, head = _backbone_and_head(model)
    hidden = backbone(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).last_hidden_state
    last = hidden[:, -1, :]  # (batch, hidden)
    return last.float() @ head[label_ids].float().T  # (batch, 8)


@torch.no_grad()
def readout_probs(model: Any, tokenizer: Any, encoded: Sequence[Sequence[int]], label_ids: Sequence[int],
                  tokens_per_batch: int = 65536, autocast: bool = False) -> torch.Tensor:
    """(n, 8) renormalised label probabilities of each encoded prompt, in input order."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    labels = torch.tensor(list(label_ids), device=device)
    out = torch.zeros(len(encoded), NUM_BINS)
    for batch in length_batches([len(e) for e in encoded], tokens_per_batch):
        ids, mask, pos = left_pad([encoded[i] for i in batch], pad, device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits = label_logits(model, ids, mask, pos, labels)
        out[batch] = torch.softmax(logits.float(), dim=-1).cpu()
    if was_training:
        model.train()
    return out


def calibration_scores(probs: torch.Tensor, true_bin: torch.Tensor) -> dict[str, float]:
    """NLL, halved Brier and accuracy of (n, 8) probabilities against bins 1..8."""
    if probs.shape[0] == 0:
        return {"nll": float("nan"), "brier": float("nan"), "accuracy": float("nan")}
    idx = true_bin.long() - 1
    onehot = torch.nn.functional.one_hot(idx, NUM_BINS).float()
    return {
        "nll": float(-torch.log(probs[torch.arange(len(idx)), idx].clamp_min(1e-12)).mean()),
        "brier": float(0.5 * ((probs - onehot) ** 2).sum(dim=1).mean()),
        "accuracy": float((probs.argmax(dim=1) == idx).float().mean()),
    }


class LabelReadout(torch.nn.Module):
    """The eight label logits at the readout position as one module: on N processes accelerate
    wraps it (DistributedDataParallel), which averages gradients only through a module's forward."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                label_ids: torch.Tensor) -> torch.Tensor:
        return label_logits(self.model, ids, mask, positions, label_ids)  # (batch, 8)


def _load(settings: SupervisedSettings, accelerator: Any) -> tuple[Any, Any, bool]:
    """(model on the process's device, tokenizer, autocast) for the settings; LoRA wrapped if asked."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from models.base_model import resolve_base_model

    with accelerator.main_process_first():  # the main process converts the base model once; the others read it
        path = resolve_base_model(settings.base_model)
    cuda = accelerator.device.type == "cuda"
    if cuda:
        # cuDNN's attention backward returns NaN gradients at some padded lengths on torch 2.11
        # (see models.training.grpo._load_base); the memory-efficient kernels compute the same thing.
        torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cuda.matmul.allow_tf32 = True
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if settings.finetune == "lora":
        from peft import LoraConfig, get_peft_model

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(settings.seed)  # the same adapter initialisation on every process
            model = get_peft_model(model, LoraConfig(r=settings.lora_rank, lora_alpha=2 * settings.lora_rank,
                                                     lora_dropout=0.0, target_modules="all-linear",
                                                     task_type="CAUSAL_LM"))
    if settings.gradient_checkpointing:
        # Reentrant checkpointing trips DDP's gradient hooks (a weight marked ready twice); this kind does not.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if settings.finetune == "lora":
            model.enable_input_require_grads()
    autocast = cuda and settings.precision in ("auto", "bf16-autocast")
    return model.to(accelerator.device), tokenizer, autocast


def _schedule(optimizer: Any, settings: SupervisedSettings, total_steps: int) -> Any:
    """Linear warm-up, then cosine decay to 10% of the peak over all epochs."""
    warm = max(1, settings.warmup_steps)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        t = min(1.0, (step - warm) / max(1, total_steps - warm))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _save_weights(model: Any, tokenizer: Any, folder: Path) -> None:
    """Weights (full checkpoint or adapter) + tokenizer, written whole (tmp, then rename)."""
    tmp = folder.with_name(folder.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.replace(folder)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(obj, indent=1))
    tmp.replace(path)


@dataclass
class _Data:
    """The encoded rows of a run (the same on every process)."""

    enc_train: list[list[int]]
    targets: torch.Tensor  # (train rows, 8) soft targets
    batches: list[list[int]]  # length-bucketed row indices; one optimizer step each
    enc_cal: list[list[int]]
    y_cal: torch.Tensor  # (calibration rows,) bins 1..8
    label_ids: list[int]


@dataclass
class _Run:
    """One train_supervised call on this process: model, optimizer, data, resumable state."""

    settings: SupervisedSettings
    accelerator: Any
    model: Any  # the language model itself: saved and scored
    tokenizer: Any
    autocast: bool
    optimizer: Any
    scheduler: Any
    data: _Data
    out: Path
    ckpt: Path | None
    state: dict[str, Any]
    readout: Any = None  # LabelReadout around `model`, prepared by accelerate; trained through

    @property
    def is_main(self) -> bool:
        return bool(self.accelerator.is_main_process)


def _encode(settings: SupervisedSettings, model: Any, tokenizer: Any, train_rows: Sequence[dict[str, Any]],
            calibration_rows: Sequence[dict[str, Any]]) -> _Data:
    """Tokenised rows that fit the context, their targets and the length-bucketed batches."""
    limit = settings.max_prompt_tokens or int(getattr(model.config, "max_position_embeddings", 0) or 10**9) - 1
    enc_train, label_ids = encode_rows(tokenizer, train_rows)
    keep = [i for i, e in enumerate(enc_train) if len(e) <= limit]
    if not keep:
        raise ValueError(f"no training row fits the model's context of {limit} tokens")
    enc_train = [enc_train[i] for i in keep]
    y_train = torch.tensor([int(train_rows[i]["true_bin"]) for i in keep])
    enc_cal, _ = encode_rows(tokenizer, calibration_rows) if calibration_rows else ([], label_ids)
    cal_keep = [i for i, e in enumerate(enc_cal) if len(e) <= limit]
    y_cal = torch.tensor([int(calibration_rows[i]["true_bin"]) for i in cal_keep], dtype=torch.long)
    return _Data(enc_train, ordinal_targets(y_train, settings.label_smoothing),
                 length_batches([len(e) for e in enc_train], settings.tokens_per_batch),
                 [enc_cal[i] for i in cal_keep], y_cal, label_ids)


def _fresh_state() -> dict[str, Any]:
    return {"epoch": 0, "batch": 0, "step": 0, "history": [], "best_nll": float("inf"), "best_epoch": 0,
            "since_best": 0, "epoch_loss": 0.0, "epoch_rows": 0, "epoch_seconds": 0.0, "epoch_tokens": 0}


def _start(settings: SupervisedSettings, train_rows: Sequence[dict[str, Any]],
           calibration_rows: Sequence[dict[str, Any]], out_dir: str | Path,
           checkpoint_dir: str | Path | None) -> _Run:
    """Model, data, optimizer and schedule of a call, resumed from the checkpoint if there is
    one, then prepared by accelerate (moved to the device, wrapped for gradient sync)."""
    accelerator = make_accelerator()
    out = Path(out_dir)
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
    model, tokenizer, autocast = _load(settings, accelerator)
    data = _encode(settings, model, tokenizer, train_rows, calibration_rows)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.learning_rate, weight_decay=settings.weight_decay)
    scheduler = _schedule(optimizer, settings, settings.epochs * len(data.batches))
    run = _Run(settings, accelerator, model, tokenizer, autocast, optimizer, scheduler, data, out,
               Path(checkpoint_dir) if checkpoint_dir else None, _fresh_state())
    if run.ckpt and (run.ckpt / STATE_FILE).is_file():
        _resume(run)
    run.readout, run.optimizer = accelerator.prepare(LabelReadout(model), optimizer)
    run.readout.train()
    return run


def _resume(run: _Run) -> None:
    """Weights, optimizer, schedule and position of the checkpoint (every process reads it)."""
    saved = torch.load(run.ckpt / STATE_FILE, map_location="cpu", weights_only=False)
    if saved.get("settings") != run.settings.as_params() or saved.get("rows") != len(run.data.enc_train):
        raise ValueError(f"{run.ckpt} holds a run of other settings or rows; use a fresh checkpoint folder")
    run.model.load_state_dict(saved["model"], strict=False)
    run.optimizer.load_state_dict(saved["optimizer"])
    run.scheduler.load_state_dict(saved["scheduler"])
    run.state = saved["state"]
    if run.is_main:
        log.info("resuming supervised training at epoch %d, batch %d", run.state["epoch"] + 1, run.state["batch"])


def _save_state(run: _Run) -> None:
    """The main process writes the checkpoint; every process waits until it is on disk."""
    if run.ckpt and run.is_main:
        run.ckpt.mkdir(parents=True, exist_ok=True)
        trainable = {k: v for k, v in run.model.state_dict().items()
                     if run.settings.finetune == "full" or "lora_" in k}
        tmp = run.ckpt / (STATE_FILE + ".part")
        torch.save({"settings": run.settings.as_params(), "rows": len(run.data.enc_train), "model": trainable,
                    "optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(),
                    "state": run.state}, tmp)
        tmp.replace(run.ckpt / STATE_FILE)
    run.accelerator.wait_for_everyone()


def _train_step(run: _Run, batch: list[int]) -> tuple[float, float, float]:
    """One optimizer step on one batch: this process's share forward and backward (gradients
    averaged over the processes), clipped, applied. This share's (loss sum, rows, padded tokens)."""
    acc, data = run.accelerator, run.data
    share = row_share(acc, batch)
    rows = share or batch[:1]  # a process without rows still joins the gradient all-reduce, at weight 0
    ids, mask, pos = left_pad([data.enc_train[i] for i in rows], run.tokenizer.pad_token_id, acc.device)
    labels = torch.tensor(data.label_ids, device=acc.device)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=run.autocast):
        logits = run.readout(ids, mask, pos, labels)  # (rows, 8)
    logp = torch.log_softmax(logits.float(), dim=-1)
    mean = -(data.targets[rows].to(acc.device) * logp).sum(dim=1).mean()
    acc.backward(mean * share_weight(acc, len(share), len(batch)))
    acc.clip_grad_norm_([p for p in run.model.parameters() if p.requires_grad], run.settings.grad_clip)
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return float(mean.detach()) * len(share), float(len(share)), float(ids.numel() if share else 0)


def _train_epoch(run: _Run, stop_at: float | None, on_step: Callable[[int, float], None] | None) -> bool:
    """The rest of the current epoch; True when `stop_at` ended it first (on every process)."""
    state, acc = run.state, run.accelerator
    # The batch order depends only on the seed and the epoch: a resumed epoch goes on where it stopped.
    order = list(range(len(run.data.batches)))
    random.Random(run.settings.seed * 1000 + state["epoch"]).shuffle(order)
    t0 = time.time()

    def late() -> bool:
        return stop_at is not None and time.time() > stop_at

    # Whether any process is past `stop_at`: agreed before the first step, then in the same
    # reduction as each step's sums (one collective per step beside the gradients', not two).
    stopped = stop_at is not None and state["batch"] < len(order) and any_process(acc, late())
    while state["batch"] < len(order) and not stopped:
        loss_sum, rows, tokens, past = sum_over_processes(
            acc, (*_train_step(run, run.data.batches[order[state["batch"]]]), float(late())))
        stopped = past > 0 and state["batch"] + 1 < len(order)  # the epoch's last step ends it anyway
        state["batch"] += 1
        state["step"] += 1
        state["epoch_loss"] += loss_sum
        state["epoch_rows"] += int(rows)
        state["epoch_tokens"] = state.get("epoch_tokens", 0) + int(tokens)
        if on_step and run.is_main:
            on_step(state["step"], loss_sum / rows)
    state["epoch_seconds"] += time.time() - t0
    return stopped


def _score_calibration(run: _Run) -> dict[str, float]:
    """NLL, Brier, accuracy on the calibration rows; each process scores its share, every
    process gets all of them."""
    acc, data = run.accelerator, run.data
    mine = row_share(acc, list(range(len(data.enc_cal))))
    probs = readout_probs(run.model, run.tokenizer, [data.enc_cal[i] for i in mine], data.label_ids,
                          run.settings.tokens_per_batch, run.autocast)
    return calibration_scores(gather_rows(acc, mine, probs, len(data.enc_cal)), data.y_cal)


def _epoch_record(run: _Run) -> dict[str, Any]:
    state = run.state
    return {"epoch": state["epoch"] + 1, "train_loss": state["epoch_loss"] / max(1, state["epoch_rows"]),
            "seconds": round(state["epoch_seconds"], 1), "steps": state["step"],
            "padded_tokens": state.get("epoch_tokens", 0),
            **{f"calibration_{k}": v for k, v in _score_calibration(run).items()}}


def _end_epoch(run: _Run, on_epoch: Callable[[dict[str, Any]], None] | None) -> None:
    """Score the epoch, keep its weights if best, write history and checkpoint (main process)."""
    state, settings = run.state, run.settings
    record = _epoch_record(run)
    state["history"].append(record)
    if run.is_main:
        log.info("epoch %d: train loss %.4f, calibration nll %.4f brier %.4f accuracy %.3f (%.0f s)",
                 record["epoch"], record["train_loss"], record["calibration_nll"], record["calibration_brier"],
                 record["calibration_accuracy"], record["seconds"])
    nll = record["calibration_nll"] if run.data.enc_cal else 0.0
    if not run.data.enc_cal or nll < state["best_nll"]:
        state["best_nll"], state["best_epoch"], state["since_best"] = nll, record["epoch"], 0
        if run.is_main:
            _save_weights(run.model, run.tokenizer, run.out / BEST_DIR)
    else:
        state["since_best"] += 1
    state.update(epoch=record["epoch"], batch=0, epoch_loss=0.0, epoch_rows=0, epoch_seconds=0.0, epoch_tokens=0)
    if run.is_main:
        _write_json(run.out / HISTORY_FILE, {"settings": settings.as_params(), "history": state["history"],
                                              "best_epoch": state["best_epoch"], "rows_used": len(run.data.enc_train),
                                              "processes": run.accelerator.num_processes})
        if on_epoch:
            on_epoch(record)
    if settings.patience and state["since_best"] >= settings.patience:
        if run.is_main:
            log.info("calibration NLL did not improve for %d epoch(s): stopping", state["since_best"])
        state["epoch"] = settings.epochs
    _save_state(run)


def _budget_spent(run: _Run, finish_by: float | None) -> bool:
    """True (on every process) when the last epoch's duration says the next would end after finish_by."""
    state = run.state
    if finish_by is None or state["batch"] != 0 or not state["history"]:
        return False
    return any_process(run.accelerator, time.time() + state["history"][-1]["seconds"] > finish_by)


def train_supervised(
    settings: SupervisedSettings,
    train_rows: Sequence[dict[str, Any]],
    calibration_rows: Sequence[dict[str, Any]],
    out_dir: str | Path,
    checkpoint_dir: str | Path | None = None,
    stop_at: float | None = None,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
    on_step: Callable[[int, float], None] | None = None,
    finish_by: float | None = None,
) -> SupervisedResult:
    """Train the eight-label readout with (smoothed) cross-entropy; keep the best epoch.

    Runs as one process or as every process of an `accelerate launch` (models.training.data_parallel):
    each call in each process, with the same arguments; the main process alone writes.

    Args:
        settings: the run's settings.
        train_rows: training rows (fit split only: never eval or calibration pairs).
        calibration_rows: calibration rows, scored after every epoch (early stopping, best epoch).
        out_dir: the best epoch's weights go to out_dir/best, the history to out_dir/history.json.
        checkpoint_dir: where the resumable state lives (None: no resume).
        stop_at: a time.time() after which the call saves its state and returns unfinished.
        on_epoch: called with each finished epoch's record (e.g. to stream metrics); main process only.
        on_step: called with (global step, loss of the step's batch) after every optimizer step;
            main process only.
        finish_by: a time.time() by which the run should be over: no epoch starts that the
            last epoch's duration says would end after it, and the run counts as finished
            (a wall-clock budget in epochs; unlike stop_at, nothing is left to resume).
    Returns:
        SupervisedResult (the same on every process).
    Raises:
        ValueError: no training row fits the model's context.
    """
    run = _start(settings, train_rows, calibration_rows, out_dir, checkpoint_dir)
    stopped = False
    while run.state["epoch"] < settings.epochs:
        if _budget_spent(run, finish_by):
            if run.is_main:
                log.info("wall-clock budget reached after %d epoch(s)", run.state["epoch"])
            run.state["epoch"] = settings.epochs
            _save_state(run)
            break
        stopped = _train_epoch(run, stop_at, on_step)
        if stopped:
            break
        _end_epoch(run, on_epoch)
    if stopped:
        _save_state(run)
    state = run.state
    return SupervisedResult(run.out / BEST_DIR, state["history"], state["best_epoch"],
                            state["epoch"] >= settings.epochs, len(run.data.enc_train))
