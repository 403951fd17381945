"""Training settings: one frozen dataclass with the paper's defaults, per-profile overrides that
say why, and the precision a run resolves to.

This module imports nothing heavy: the settings are built (and validated) before torch loads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

RewardSpec = Literal["correctness", "correctness+brier", "correctness+crps"]
REWARDS: tuple[str, ...] = ("correctness", "correctness+brier", "correctness+crps")
PRECISIONS = ("auto", "fp32", "bf16-autocast", "bf16")
SMALL_MODEL_BYTES = 4 * 2**30  # checkpoints under this train in float32 on a GPU
PAPER_LORA_RANK = 32  # the paper's LoRA r (section 5): the default of every LoRA this project trains


@dataclass(frozen=True)
class TrainingSettings:
    """Everything that decides a training run; logged to MLflow as params, resolved.

    Defaults are the paper's (GPT-OSS-20B, LoRA rank 32, section 5); `profile` scales them
    down for CPU and tests and says why.

    Attributes:
        base_model: "smollm2", a local checkpoint directory or a cached HF id
            (`models.base_model.resolve_base_model`).
        reward: which reward: correctness alone, or plus w * (1 - Brier) / (1 - CRPS).
        reward_weight: w; honoured through GRPOConfig.reward_weights = [1, w].
        lora_rank: LoRA r (paper 32); alpha = 2r, the usual scaling.
        lora_targets: module names LoRA wraps ("all-linear" or a tuple of names).
        lora_modules_to_save: modules trained in full and saved with the adapter; only for
            randomly initialised test models (see the "smoke" profile).
        learning_rate: GRPO learning rate (paper 4e-5).
        prompts_per_step: distinct prompts per optimizer step (paper 8).
        num_generations: rollouts per prompt, the GRPO group (paper 8).
        max_steps: GRPO optimizer steps (paper 20).
        temperature: rollout sampling temperature (paper 1.0: groups need diverse answers).
        max_completion_length: new tokens per rollout (paper up to 8192).
        beta: KL coefficient; 0 as TRL's default (and no reference model to hold).
        prompt_style: "full" (paper), "diff" (shorter; small models) or "compact" (shortest;
            CPU budgets, see models/prompts.py).
        sft_steps: supervised format warm-up steps before GRPO (0 = none); with
            sft_parse_target, the steps of one round.
        sft_lr: warm-up learning rate (each round decays it linearly to 0).
        sft_parse_target: the warm-up goes on, a round of sft_steps at a time, until the
            greedy parse rate of the probe rows reaches this (0: one round). GRPO rewards
            only answers that parse: a group of unparsed rollouts teaches nothing.
        sft_max_rounds: the most warm-up rounds, reached or not.
        parse_probe_rows: rows whose greedy parse rate is measured before/after warm-up.
        seed: seeds the warm-up order, LoRA init and the trainer.
        micro_batch_size: completions per forward/backward pass; an optimizer step still
            takes prompts_per_step x num_generations completions (gradient accumulation),
            so this bounds activation memory only (64 full-prompt completions of ~3k
            tokens would need ~90 GB of activations in one pass).
        gradient_checkpointing: trade compute for activation memory; None = on with CUDA
            (a 20B model needs it), off on CPU. It also turns the KV cache off during
            rollouts, so a small model on a big GPU runs faster with it False.
        precision: "auto", "fp32" (float32 weights and compute; TF32 matmuls on a GPU),
            "bf16-autocast" (float32 weights, bfloat16 compute) or "bf16" (bfloat16 weights
            and compute). auto: fp32 on CPU and for checkpoints under 4 GiB on a GPU, bf16
            for big ones (a 20B model, as the paper runs). See `resolve_precision`.
        max_prompt_tokens: training rows whose prompt is longer are left out (counted in
            the metrics); None = the base model's context minus max_completion_length, so
            prompt and rollout always fit the positions the model was built for.
        max_nonfinite_steps: GRPO stops (with an error) after this many optimizer steps in a
            row had non-finite gradients; single ones are skipped (models/training/callbacks.py).
    """

    base_model: str = "smollm2"
    reward: RewardSpec = "correctness+brier"
    reward_weight: float = 1.0
    lora_rank: int = PAPER_LORA_RANK
    lora_targets: tuple[str, ...] | str = ("q_proj", "k_proj", "v_proj", "o_proj")
    lora_modules_to_save: tuple[str, ...] = ()
    learning_rate: float = 4e-5
    prompts_per_step: int = 8
    num_generations: int = 8
    max_steps: int = 20
    temperature: float = 1.0
    max_completion_length: int = 8192
    beta: float = 0.0
    prompt_style: str = "full"
    sft_steps: int = 0
    sft_lr: float = 1e-4
    sft_parse_target: float = 0.0
    sft_max_rounds: int = 1
    parse_probe_rows: int = 8
    seed: int = 0
    micro_batch_size: int = 16
    gradient_checkpointing: bool | None = None
    precision: str = "auto"
    max_prompt_tokens: int | None = None
    max_nonfinite_steps: int = 3
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {self.reward!r}")
        if not math.isfinite(self.reward_weight) or self.reward_weight < 0:
            raise ValueError(f"reward_weight must be finite and >= 0, got {self.reward_weight}")
        if self.num_generations < 2:
            raise ValueError("num_generations must be >= 2: GRPO compares rollouts within a group")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")

    @classmethod
    def profile(cls, name: str, **overrides: Any) -> TrainingSettings:
        """Settings of a named profile ("smoke", "default", "gpu"), then overrides.

        >>> TrainingSettings.profile("gpu").lora_rank, TrainingSettings.profile("smoke").max_steps
        (32, 2)
        """
        if name not in PROFILES:
            raise ValueError(f"unknown training profile {name!r}; use one of {sorted(PROFILES)}")
        return dataclasses.replace(cls(), **{**PROFILES[name], **overrides})

    def reward_parts(self) -> tuple[list[Any], list[float]]:
        """(reward functions, weights) for GRPOTrainer: one curve per part in TRL's logs."""
        from models.training.rewards import brier_reward, correctness_reward, crps_reward

        if self.reward == "correctness":
            return [correctness_reward], [1.0]
        second = brier_reward if self.reward == "correctness+brier" else crps_reward
        return [correctness_reward, second], [1.0, float(self.reward_weight)]

    def as_params(self) -> dict[str, str]:
        """Flat string params for MLflow (the resolved config)."""
        out = {}
        for key, value in dataclasses.asdict(self).items():
            if key == "tags":
                continue
            out[key] = ",".join(value) if isinstance(value, (tuple, list)) else str(value)
        return out


# The smallest GRPO step on a CPU: 2 prompts x 2 rollouts is the smallest batch GRPO accepts,
# and 96 new tokens fit the warm-up answer (~70-75 tokens).
_SMALLEST_STEP: dict[str, Any] = dict(prompts_per_step=2, num_generations=2, max_completion_length=96)

# Per-profile overrides of the paper defaults; each says why.
PROFILES: dict[str, dict[str, Any]] = {
    # Tests and CI: a tiny random model (models/tiny.py), seconds per step, the smallest step.
    # The tiny model's embeddings are random with std 0.02, so logits stay near uniform
    # unless the (tied) embedding itself trains: it goes in modules_to_save, and LoRA wraps
    # every linear layer at a high rate, or 120 steps cannot teach the format.
    "smoke": dict(
        **_SMALLEST_STEP,
        reward="correctness+brier",
        lora_rank=16,
        lora_targets="all-linear",
        lora_modules_to_save=("embed_tokens",),
        learning_rate=1e-3,
        max_steps=2,
        prompt_style="diff",
        sft_steps=120,  # measured: greedy parse rate 0 -> 1 (seeds 0, 1, 3 checked), ~15 s on one core
        sft_lr=1e-2,
        parse_probe_rows=2,
    ),
    # SmolLM2-135M on a 2-core CPU inside `make run`, where training and evaluating the
    # surrogate may add ~6-8 minutes. A first, larger version of this profile (4 steps of
    # 4 x 4 rollouts of 256 tokens, "diff" prompts, a 40-step warm-up) was far over: on this
    # machine a forward pass over a real pair's ~3,000-token "diff" prompt takes 15-45 s.
    # Measured with "compact" prompts (~1,100 tokens, models/prompts.py): a warm-up step
    # ~14 s, one GRPO step of 2 prompts x 2 rollouts ~150 s (generation, then a forward and
    # backward pass over 4 x 1,100 tokens; ~330 s with gradient checkpointing, which is off
    # on CPU, see grpo._grpo_config), a parse probe ~15-30 s. So: one smallest GRPO step, a
    # 6-step warm-up at a high rate and one probe row: ~5 minutes. This is a plumbing-scale
    # run on real data (warm-up, GRPO, registry, evaluation, promotion), not a useful model:
    # SmolLM2 does not learn the answer format in 6 steps (probe parse rate stays 0, so GRPO
    # rewards are all 0); a model worth using comes from the "gpu" profile.
    "default": dict(
        **_SMALLEST_STEP,
        base_model="smollm2",
        lora_rank=16,
        learning_rate=1e-4,
        max_steps=1,
        prompt_style="compact",
        sft_steps=6,
        sft_lr=5e-4,
        parse_probe_rows=1,
    ),
    # The paper's settings (section 5): LoRA 32, lr 4e-5, 8 x 8 rollouts, 20 steps, T = 1.0,
    # up to 8192 new tokens, full prompts. A short warm-up still helps a small base model;
    # a 20B model that already writes the format can set sft_steps=0.
    "gpu": dict(sft_steps=20, sft_lr=1e-4),
}


def resolve_precision(precision: str, cuda: bool, checkpoint_bytes: int) -> str:
    """The precision a run uses: `precision` unless "auto".

    auto: fp32 on CPU (bf16 on CPU is slow and unsupported by some ops); on a GPU,
    fp32 for a small checkpoint and bf16 for a big one. SmolLM2's GRPO runs on the H200 logged
    NaN gradient norms in bf16 (after 11 steps with bf16 weights; at step 1 with float32 weights
    under bf16 autocast; data/training/h200/). The cause is cuDNN's attention backward (see
    models.training.grpo._load_base, which turns that backend off), not bf16 itself; float32
    with TF32 matmuls also keeps attention off cuDNN, and costs little for a 135M model.

    >>> resolve_precision("auto", False, 10**12), resolve_precision("auto", True, 10**8)
    ('fp32', 'fp32')
    >>> resolve_precision("auto", True, 40 * 2**30), resolve_precision("bf16-autocast", True, 1)
    ('bf16', 'bf16-autocast')
    >>> resolve_precision("bf16", False, 1)
    Traceback (most recent call last):
    ValueError: precision 'bf16' needs a CUDA GPU; on CPU use fp32 (or auto)
    """
    if not cuda and precision not in ("auto", "fp32"):
        raise ValueError(f"precision {precision!r} needs a CUDA GPU; on CPU use fp32 (or auto)")
    if precision != "auto":
        return precision
    if not cuda:
        return "fp32"
    return "fp32" if checkpoint_bytes < SMALL_MODEL_BYTES else "bf16"
