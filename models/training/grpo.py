"""GRPO training of the surrogate (method.md section 5): base model, LoRA adapter, format
warm-up, TRL's GRPOTrainer with the calibration-shaped rewards, the saved adapter.

One LoRA adapter (peft) is trained twice: first the short supervised warm-up on the answer
format (models.training.warmup), then GRPO. The adapter (relative to the untouched base model)
and the tokenizer are saved to `out_dir`; `models.registry.versions` registers them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.training.rows import fitting_rows
from models.training.settings import TrainingSettings, resolve_precision
from models.training.tracking import RunTracking, TrainingRun
from models.training.warmup import WarmUp, last_checkpoint, warm_up

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingResult:
    """What a training run produced.

    Attributes:
        run_id: the MLflow run (None when no tracking was given).
        adapter_dir: the saved LoRA adapter + tokenizer.
        metrics: final metrics (parse rates before/after warm-up, mean frac_reward_zero_std,
            last loss, mean rewards, sft loss first/last).
        steps: GRPO optimizer steps run.
        log_history: the trainer's per-step logs.
        sft_losses: the format warm-up's per-step losses.
        finished: False when `stop_at` ended GRPO before max_steps (the checkpoint folder
            then holds the state a later call resumes from; no adapter saved, nothing logged).
    """

    run_id: str | None
    adapter_dir: Path
    metrics: dict[str, float]
    steps: int
    log_history: list[dict[str, Any]] = field(default_factory=list)
    sft_losses: list[float] = field(default_factory=list)
    finished: bool = True


def train_grpo(
    settings: TrainingSettings,
    rows: Sequence[dict[str, Any]],
    out_dir: str | Path,
    tracking: RunTracking | None = None,
    checkpoint_dir: str | Path | None = None,
    stop_at: float | None = None,
) -> TrainingResult:
    """Format warm-up, then GRPO, then save the adapter; logs the run to MLflow.

    With `checkpoint_dir`, every GRPO step is checkpointed there and a call that finds a
    checkpoint resumes from it (the warm-up is not repeated: its record is kept beside the
    checkpoints); with `stop_at` (a time.time() value), GRPO stops cleanly after the first
    step that ends past it and the result says `finished=False`. Together they let a run
    longer than one GPU job go on in the next (models/training/gpu_host/gpu_job.py).

    Args:
        settings: the resolved training settings.
        rows: `build_training_rows` output (training pairs only).
        out_dir: where the adapter + tokenizer are saved (created).
        tracking: where the MLflow run goes and what it is logged against; None = no MLflow.
        checkpoint_dir: a folder for GRPO checkpoints (and the warm-up record) to resume from.
        stop_at: a time.time() after which GRPO stops at the end of its step.
    Returns:
        TrainingResult(run_id, adapter_dir, metrics, steps, log_history, sft_losses, finished).
    Raises:
        ValueError: fewer rows than prompts_per_step (a step would repeat prompts).
        RuntimeError: max_nonfinite_steps steps in a row had non-finite gradients.
    """
    run = TrainingRun(tracking, settings)
    try:
        return _train_grpo(settings, rows, Path(out_dir), run, Path(checkpoint_dir) if checkpoint_dir else None,
                           stop_at)
    except BaseException:
        run.close("FAILED")  # a crashed or interrupted run shows as failed, not as running forever
        raise


def _train_grpo(settings: TrainingSettings, rows: Sequence[dict[str, Any]], out: Path, run: TrainingRun,
                ckpt: Path | None, stop_at: float | None) -> TrainingResult:
    """train_grpo's body; `run` is its MLflow run."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from models.training.callbacks import NonFiniteGradGuard, StopAt

    if len(rows) < settings.prompts_per_step:
        raise ValueError(
            f"{len(rows)} training rows, fewer than prompts_per_step={settings.prompts_per_step}"
        )
    out.mkdir(parents=True, exist_ok=True)
    base, tokenizer, precision = _load_base(settings)
    rows = _rows_that_fit(rows, settings, base, tokenizer)
    run.open(rows)
    model = _with_lora(base, settings)
    resume = last_checkpoint(ckpt) if ckpt else None
    if resume:  # the warm-up's weights are in the checkpoint; its figures beside it
        warm = WarmUp.load(ckpt)
        log.info("resuming GRPO from %s", resume)
    else:
        warm = warm_up(model, tokenizer, rows, settings, run, stop_at)
        if ckpt:
            warm.save(ckpt)

    funcs, weights = settings.reward_parts()
    guard = NonFiniteGradGuard(settings.max_nonfinite_steps)
    callbacks: list[Any] = [guard, *run.callbacks()]
    if stop_at is not None:
        callbacks.append(StopAt(stop_at))
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=funcs,
        args=_grpo_config(settings, out, weights, precision, ckpt),
        train_dataset=Dataset.from_list([dict(r) for r in rows]),
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    if guard.gave_up:
        raise RuntimeError(
            f"GRPO stopped: {guard.max_consecutive} steps in a row had non-finite gradients "
            f"(skipped steps {guard.skipped_steps}; precision {precision})"
        )
    return _finish(trainer, tokenizer, settings, warm, guard, run, out, ckpt)


def _rows_that_fit(rows: Sequence[dict[str, Any]], settings: TrainingSettings, base: Any,
                   tokenizer: Any) -> list[dict[str, Any]]:
    """The rows whose prompt leaves room for a rollout in the model's context (or under
    max_prompt_tokens); at least prompts_per_step of them."""
    limit = settings.max_prompt_tokens
    context = getattr(base.config, "max_position_embeddings", None)
    if limit is None and context:
        limit = int(context) - settings.max_completion_length
    kept = fitting_rows(rows, tokenizer, limit)
    if len(kept) < len(rows):
        log.info("%d of %d training rows left out: prompt over %s tokens", len(rows) - len(kept), len(rows), limit)
    if len(kept) < settings.prompts_per_step:
        raise ValueError(
            f"{len(kept)} training rows have prompts of at most {limit} tokens, fewer than "
            f"prompts_per_step={settings.prompts_per_step}"
        )
    return kept


def _finish(trainer: Any, tokenizer: Any, settings: TrainingSettings, warm: WarmUp, guard: Any, run: TrainingRun,
            out: Path, ckpt: Path | None) -> TrainingResult:
    """The result of a trained (or clock-stopped) run: adapter saved and run closed when done."""
    steps = int(trainer.state.global_step)
    history = [dict(h) for h in trainer.state.log_history]
    metrics = warm.metrics
    if steps < settings.max_steps:
        log.info("GRPO stopped at step %d of %d (stop_at); resume from %s", steps, settings.max_steps, ckpt)
        run.close("KILLED", metrics)
        return TrainingResult(None, out, metrics, steps, history, warm.sft_losses, finished=False)
    metrics.update(_summary(history))
    # Steps whose update was skipped, in this process (a resumed run counts its own part).
    metrics["nonfinite_grad_steps"] = float(len(guard.skipped_steps))
    trainer.model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    log.info("GRPO: %d steps, adapter saved to %s", steps, out)
    run.close("FINISHED", metrics)
    return TrainingResult(run.closed_run_id, out, metrics, steps, history, warm.sft_losses)


def _checkpoint_bytes(path: Path) -> int:
    """Bytes of a checkpoint's weight files (safetensors or bin)."""
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.suffix in (".safetensors", ".bin"))


def _load_base(settings: TrainingSettings):
    """(model, tokenizer, precision) of the base model, on CPU/CUDA as available, in the
    weight dtype of `resolve_precision`."""
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from models.base_model import resolve_base_model

    path = resolve_base_model(settings.base_model)
    cuda = torch.cuda.is_available()
    if cuda:
        # cuDNN's SDPA backward (a default backend on Hopper for bf16/fp16 with a mask in torch
        # 2.11) returns NaN in grad_q when the sequence length is 64 mod 128 and a query row is
        # fully masked, which left-padded GRPO batches hold (pytorch/pytorch#196678,
        # huggingface/trl#7181). Seen on our H200 host: `python3 -m models.training.gpu_host.sdpa_check`
        # finds NaN in grad_q at every length 64 mod 128 (704 ... 6,592) with cuDNN and none
        # with the memory-efficient or math backends, which compute the same attention. Our
        # GRPO runs there logged NaN gradient norms (step 12 of one run, step 1 of three others).
        torch.backends.cuda.enable_cudnn_sdp(False)
    precision = resolve_precision(settings.precision, cuda, _checkpoint_bytes(path))
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.bfloat16 if precision == "bf16" else torch.float32
    )
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to("cuda" if cuda else "cpu"), tokenizer, precision


def _with_lora(model: Any, settings: TrainingSettings):
    """The model wrapped in a fresh LoRA adapter (the only trainable weights)."""
    import torch
    from peft import LoraConfig, get_peft_model

    targets = settings.lora_targets
    config = LoraConfig(
        r=settings.lora_rank,
        lora_alpha=2 * settings.lora_rank,
        lora_dropout=0.0,  # few steps: dropout only adds noise to the GRPO ratios
        target_modules=targets if isinstance(targets, str) else list(targets),
        modules_to_save=list(settings.lora_modules_to_save) or None,
        # Tied embeddings (tiny model, SmolLM2) stay tied when the embedding is trained.
        ensure_weight_tying=bool(settings.lora_modules_to_save),
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        return get_peft_model(model, config)


def _grpo_config(settings: TrainingSettings, out_dir: Path, weights: list[float], precision: str = "fp32",
                 checkpoint_dir: Path | None = None):
    import torch
    from trl import GRPOConfig

    cuda = torch.cuda.is_available()
    # With a checkpoint folder every optimizer step is saved (LoRA weights, optimizer, RNG and
    # trainer state: a few MB for SmolLM2's adapter), two kept, so a run cut at any moment
    # resumes from a whole step.
    saving = (
        dict(output_dir=str(checkpoint_dir), save_strategy="steps", save_steps=1, save_total_limit=2)
        if checkpoint_dir
        else dict(output_dir=str(out_dir / "trainer"), save_strategy="no")
    )
    completions = settings.prompts_per_step * settings.num_generations
    micro = max(1, min(settings.micro_batch_size, completions))
    while completions % micro:  # accumulation needs a whole number of micro-batches
        micro -= 1
    return GRPOConfig(
        **saving,
        use_cpu=not cuda,
        bf16=precision in ("bf16", "bf16-autocast"),  # never on CPU: resolve_precision
        # float32 weights (fp32, and bf16-autocast outside autocast: rollouts) use TF32 matmuls
        tf32=True if cuda and precision in ("fp32", "bf16-autocast") else None,
        use_vllm=False,
        # TRL defaults to gradient checkpointing, which also turns the KV cache off while the
        # rollouts are generated: every new token re-reads the whole prompt. On a CPU (small
        # model, no memory pressure) that made one GRPO step of 4 rollouts ~330 s, not ~150 s.
        gradient_checkpointing=cuda if settings.gradient_checkpointing is None else settings.gradient_checkpointing,
        learning_rate=settings.learning_rate,
        max_steps=settings.max_steps,
        # One optimizer step = prompts_per_step prompts x num_generations rollouts, generated
        # together (generation batch) and back-propagated in micro-batches.
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=completions // micro,
        num_generations=settings.num_generations,
        temperature=settings.temperature,
        max_completion_length=settings.max_completion_length,
        beta=settings.beta,
        reward_weights=weights,
        logging_steps=1,
        report_to="none",
        seed=settings.seed,
        disable_tqdm=True,
    )


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")


def _summary(history: list[dict[str, Any]]) -> dict[str, float]:
    """Final metrics from the trainer's per-step logs."""
    steps = [h for h in history if "loss" in h or any(k.startswith("reward") for k in h)]
    out: dict[str, float] = {}
    keys = {k for h in steps for k in h if k.startswith("reward") or k == "frac_reward_zero_std"}
    for key in sorted(keys):
        out[f"{key.replace('/', '_')}_avg"] = _mean([h[key] for h in steps if key in h])
    losses = [h["loss"] for h in steps if "loss" in h]
    if losses:
        out["loss_last"] = float(losses[-1])
    return out
