"""The LLM surrogate variants a GPU job trains, as data.

A variant is one training run and its evaluation: which prompt style, which pairs it learns from
(in distribution, or without the held-out task), full fine-tuning or LoRA, the supervised
settings, and optionally a GRPO stage on top of another variant's supervised model.

    Variant("sft-full", style="full")                        # the in-distribution surrogate
    Variant("sft-lora", style="full", finetune="lora", learning_rate=1e-3)
    Variant("sft-full-held-out", style="full", held_out=True)
    Variant("grpo-brier", grpo_from="sft-lora", reward="correctness+brier")

Only the standard library and models.supervised's settings: the GPU host reads this.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from models.supervised import SupervisedSettings


@dataclass(frozen=True)
class Variant:
    """One LLM surrogate to train and evaluate.

    Attributes:
        name: unique, file-name safe ([a-z0-9-]).
        style: prompt style (models/prompts.py), e.g. "full", "full+features", "compact".
        held_out: learn from held_out_fit (no held-out task) and evaluate on held_out_eval;
            else fit -> eval.
        finetune / learning_rate / epochs / patience / lora_rank / label_smoothing /
            tokens_per_batch: the supervised settings (models.supervised.SupervisedSettings).
        grpo_from: GRPO on top of this variant's best supervised weights ("" = supervised only;
            "base" = GRPO on the base model itself, the paper's setting).
        reward: the GRPO reward (models.training.REWARDS).
        grpo_steps: GRPO optimizer steps.
        grpo_sft_steps: format warm-up steps before GRPO (the supervised stage teaches the label
            token only, not the JSON answer GRPO rolls out).
        train_budget_s: wall seconds of supervised training over all calls (0 = no budget): no
            epoch starts that would end past it (models.supervised, finish_by).
    """

    name: str
    style: str = "full"
    held_out: bool = False
    finetune: str = "full"
    learning_rate: float = 1e-4
    epochs: int = 6
    patience: int = 1
    lora_rank: int = 16
    label_smoothing: float = 0.1
    tokens_per_batch: int = 32768
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
DEFAULT_VARIANTS: tuple[Variant, ...] = (
    Variant("sft-full", style="full", epochs=8, patience=2, train_budget_s=840),
    Variant("sft-lora", style="full", finetune="lora", learning_rate=1e-3, epochs=8, patience=2, train_budget_s=420),
    Variant("sft-full-features", style="full+features", epochs=8, patience=2, train_budget_s=840),
    Variant("sft-compact-features", style="compact+features", learning_rate=2e-4, epochs=8, patience=2,
            train_budget_s=600),
    Variant("sft-full-held-out", style="full", held_out=True, epochs=8, patience=2, train_budget_s=840),
    Variant("grpo-brier", style="full", grpo_from="sft-lora", reward="correctness+brier", grpo_steps=10,
            grpo_sft_steps=40),
)
