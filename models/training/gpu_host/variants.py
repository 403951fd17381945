"""The LLM surrogate variants a GPU job trains, as data.

A variant is one training run and its evaluation: which prompt style, which pairs it learns from
(in distribution, or without the held-out task), full fine-tuning or LoRA, the supervised
settings, and optionally a GRPO stage on top of another variant's supervised model.

    Variant("sft-full", style="full")                        # the in-distribution surrogate
    Variant("sft-lora", style="full", finetune="lora", learning_rate=1e-3)
    Variant("sft-full-held-out", style="full", held_out=True)
    Variant("grpo-brier", grpo_from="sft-lora", reward="correctness+brier")

Only the standard library and models.training.supervised's settings: the GPU host reads this.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from models.training.supervised import SupervisedSettings

_SUPERVISED = SupervisedSettings()


@dataclass(frozen=True)
class Variant:
    """One LLM surrogate to train and evaluate.

    Attributes:
        name: unique, file-name safe ([a-z0-9-]).
        style: prompt style (models/prompts.py), e.g. "full", "full+features", "compact".
        held_out: learn from held_out_fit (no held-out task) and evaluate on held_out_eval;
            else fit -> eval.
        finetune / learning_rate / epochs / patience / lora_rank / label_smoothing /
            tokens_per_batch: the supervised settings (models.training.supervised.SupervisedSettings).
        grpo_from: GRPO on top of this variant's best supervised weights ("" = supervised only;
            "base" = GRPO on the base model itself, the paper's setting).
        reward: the GRPO reward (models.training.REWARDS).
        grpo_steps: GRPO optimizer steps.
        grpo_sft_steps: format warm-up steps before GRPO (the supervised stage teaches the label
            token only, not the JSON answer GRPO rolls out).
        train_budget_s: wall seconds of supervised training over all calls (0 = no budget): no
            epoch starts that would end past it (models.training.supervised, finish_by).
    """

    name: str
    style: str = "full"
    held_out: bool = False
    # The supervised fields default to SupervisedSettings' own (one default each); the job's
    # choices that differ are JOB_SUPERVISED, given where DEFAULT_VARIANTS are built.
    finetune: str = _SUPERVISED.finetune
    learning_rate: float = _SUPERVISED.learning_rate
    epochs: int = _SUPERVISED.epochs
    patience: int = _SUPERVISED.patience
    lora_rank: int = _SUPERVISED.lora_rank
    label_smoothing: float = _SUPERVISED.label_smoothing
    tokens_per_batch: int = _SUPERVISED.tokens_per_batch
    grpo_from: str = ""
    reward: str = "correctness+brier"
    grpo_steps: int = 20
    grpo_sft_steps: int = 60
    train_budget_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c == "-" for c in self.name) or self.name != self.name.lower():
            raise ValueError(f"variant name {self.name!r}: use lower-case letters, digits and '-'")

    @property
    def train_role(self) -> str:
        return "held_out_fit" if self.held_out else "fit"

    @property
    def calibration_role(self) -> str:
        return "held_out_calibration" if self.held_out else "calibration"

    @property
    def eval_role(self) -> str:
        return "held_out_eval" if self.held_out else "eval"

    @property
    def split(self) -> str:
        """The report split its eval forecasts belong to."""
        return "held_out_task" if self.held_out else "in_distribution"

    def supervised_settings(self, base_model: str, seed: int = 0) -> SupervisedSettings:
        return SupervisedSettings(
            base_model=base_model, finetune=self.finetune, lora_rank=self.lora_rank,
            learning_rate=self.learning_rate, epochs=self.epochs, patience=self.patience,
            label_smoothing=self.label_smoothing, tokens_per_batch=self.tokens_per_batch, seed=seed,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Variant:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"variant {d.get('name')!r}: unknown field(s) {', '.join(sorted(unknown))}")
        return cls(**d)


# What `kernelcast train export` puts in a job by default: the surrogate (full fine-tune and a
# LoRA adapter small enough to commit), the prompt option and the compact style measured
# against the full style, the held-out-task run, and GRPO with the Brier reward on top of the
# LoRA surrogate.
# The job's supervised choices over SupervisedSettings' defaults: rank 16 keeps the adapter small
# enough to commit, half the default padded tokens per step; the supervised runs take 8 epochs
# with patience 2.
JOB_SUPERVISED: dict[str, Any] = dict(lora_rank=16, tokens_per_batch=32768)
JOB_EPOCHS: dict[str, Any] = dict(epochs=8, patience=2)
DEFAULT_VARIANTS: tuple[Variant, ...] = (
    Variant("sft-full", style="full", **JOB_SUPERVISED, **JOB_EPOCHS, train_budget_s=840),
    Variant("sft-lora", style="full", finetune="lora", learning_rate=1e-3, **JOB_SUPERVISED, **JOB_EPOCHS, train_budget_s=420),
    Variant("sft-full-features", style="full+features", **JOB_SUPERVISED, **JOB_EPOCHS, train_budget_s=840),
    Variant("sft-compact-features", style="compact+features", learning_rate=2e-4, **JOB_SUPERVISED,
            **JOB_EPOCHS, train_budget_s=600),
    Variant("sft-full-held-out", style="full", held_out=True, **JOB_SUPERVISED, **JOB_EPOCHS, train_budget_s=840),
    Variant("grpo-brier", style="full", grpo_from="sft-lora", reward="correctness+brier", grpo_steps=10,
            grpo_sft_steps=40, **JOB_SUPERVISED),
)
