"""GRPO training of the surrogate (method.md section 5): settings, rows, SFT warm-up, GRPO, MLflow.

    settings = TrainingSettings.profile("smoke", base_model=str(tiny_dir))
    rows = build_training_rows(read_pairs(con, version, split="train"), kernels, tasks, hardware)
    result = train_grpo(settings, rows, out_dir, tracking_uri="sqlite:///mlflow.db",
                        dataset_version=version, measurement_ids=dataset_measurement_ids(con, version))

One LoRA adapter (peft) is trained twice: first a short supervised warm-up on the answer
format (`models.sft`: small models never write the format zero-shot, so GRPO would see no
reward signal), then TRL's GRPOTrainer with the calibration-shaped rewards of
`models.rewards`. The adapter (relative to the untouched base model) and the tokenizer are
saved to `out_dir`; `models.registry` registers them.

MLflow: the resolved settings as params, per-step metrics from the trainer's log history
(one reward curve per reward function, frac_reward_zero_std, loss), parse rates before and
after the warm-up, the dataset as an input (name = dataset version, source and digest
"duckdb:pairs@<version>"), the measurement ids as `measurement_ids.txt`, and tags
dataset_version, base_model, git_commit, dagster_run_id. TRL's own MLflow callback is not
used (report_to="none"): logging here is explicit and works against any tracking URI.

This module never imports dagster; the tracking URI is a plain string.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from models.prompts import build_prompt
from models.sft import sft_warmup

if TYPE_CHECKING:  # polars only for type hints: the GPU host trains without it
    import polars as pl

log = logging.getLogger(__name__)

RewardSpec = Literal["correctness", "correctness+brier", "correctness+crps"]
REWARDS: tuple[str, ...] = ("correctness", "correctness+brier", "correctness+crps")
DEFAULT_EXPERIMENT = "kernelcast-training"


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
        sft_steps: supervised format warm-up steps before GRPO (0 = none).
        sft_lr: warm-up learning rate.
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
            row had non-finite gradients; single ones are skipped (models/callbacks.py).
    """

    base_model: str = "smollm2"
    reward: RewardSpec = "correctness+brier"
    reward_weight: float = 1.0
    lora_rank: int = 32
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
        from models.rewards import brier_reward, correctness_reward, crps_reward

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


# Per-profile overrides of the paper defaults; each says why.
PROFILES: dict[str, dict[str, Any]] = {
    # Tests and CI: a tiny random model (models/tiny.py), seconds per step. 2 prompts x 2
    # rollouts is the smallest batch GRPO accepts; 96 tokens fit the warm-up answer (~70
    # tokens). The tiny model's embeddings are random with std 0.02, so logits stay near
    # uniform unless the (tied) embedding itself trains: it goes in modules_to_save, and
    # LoRA wraps every linear layer at a high rate, or 120 steps cannot teach the format.
    "smoke": dict(
        reward="correctness+brier",
        lora_rank=16,
        lora_targets="all-linear",
        lora_modules_to_save=("embed_tokens",),
        learning_rate=1e-3,
        prompts_per_step=2,
        num_generations=2,
        max_steps=2,
        max_completion_length=96,
        prompt_style="diff",
        sft_steps=120,  # measured: greedy parse rate 0 -> 1 (seeds 0, 1, 3 checked), ~15 s on one core
        sft_lr=1e-2,
        parse_probe_rows=2,
    ),
    # SmolLM2-135M on a 2-core CPU inside `make run`, where training and evaluating the
    # surrogate may add ~6-8 minutes. The first version of this profile (4 steps of 4 x 4
    # rollouts of 256 tokens, "diff" prompts, a 40-step warm-up) was far over: on this
    # machine a forward pass over a real pair's ~3,000-token "diff" prompt takes 15-45 s.
    # Measured 2026-11-29 with "compact" prompts (~1,100 tokens, models/prompts.py): a
    # warm-up step ~14 s, one GRPO step of 2 prompts x 2 rollouts ~150 s (generation, then
    # a forward and backward pass over 4 x 1,100 tokens; ~330 s before gradient
    # checkpointing was turned off on CPU, see _grpo_config), a parse probe ~15-30 s. So: one
    # GRPO step of the smallest group (2 x 2), 96 new tokens (the warm-up answer is ~75
    # tokens), a 6-step warm-up at a high rate and one probe row: ~5 minutes. This is a
    # plumbing-scale run on real data (warm-up, GRPO, registry, evaluation, promotion), not
    # a useful model: SmolLM2 does not learn the answer format in 6 steps (probe parse rate
    # stays 0, so GRPO rewards are all 0); a model worth using comes from the "gpu" profile.
    "default": dict(
        base_model="smollm2",
        lora_rank=16,
        learning_rate=1e-4,
        prompts_per_step=2,
        num_generations=2,
        max_steps=1,
        max_completion_length=96,
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


@dataclass(frozen=True)
class TrainingResult:
    """What a training run produced.

    Attributes:
        run_id: the MLflow run (None when no tracking URI was given).
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


def build_training_rows(
    pairs: pl.DataFrame | Sequence[Mapping[str, Any]],
    kernels: Mapping[str, str],
    tasks: Mapping[str, str] | Mapping[str, Mapping[str, Any]],
    hardware: Mapping[str, Any] | Mapping[str, Mapping[str, Any]],
    style: str = "diff",
    features: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One dataset row per pair: the prompt, the true bin and the pair id.

    Args:
        pairs: pairs rows (`warehouse.read_pairs(..., split="train")`, or plain dicts): task,
            anchor_kernel_id, candidate_kernel_id, true_bin, pair_id, hardware_id. The caller
            passes training pairs only (method.md: never an eval pair).
        kernels: kernel_id -> source.
        tasks: task name -> one-paragraph description, or -> {"description": ...,
            "benchmark_cases": [...]} (the cases are shown by "+features" styles).
        hardware: one fingerprint for every pair, or hardware_id -> fingerprint.
        style: prompt style ("diff" for small models, "full" as the paper; "+features" adds
            compile features and benchmark shapes, models/prompts.py).
        features: kernel_id -> compile features (n_regs, n_spills, shared_bytes, n_kernels,
            n_launches), for "+features" styles; a kernel without features shows n/a.
    Returns:
        [{"prompt": chat messages, "true_bin": int, "pair_id": str}], in the pairs' order.
    Raises:
        KeyError: a kernel source or task description is missing (one line naming it).
    """
    per_id = bool(hardware) and all(isinstance(v, Mapping) for v in hardware.values())
    features = features or {}
    rows = []
    items = pairs.iter_rows(named=True) if hasattr(pairs, "iter_rows") else pairs
    for pair in items:
        for key in ("anchor_kernel_id", "candidate_kernel_id"):
            if pair[key] not in kernels:
                raise KeyError(f"pair {pair.get('pair_id')}: no source for kernel {pair[key]}")
        if pair["task"] not in tasks:
            raise KeyError(f"pair {pair.get('pair_id')}: no description for task {pair['task']!r}")
        task = tasks[pair["task"]]
        description = task if isinstance(task, str) else task["description"]
        cases = None if isinstance(task, str) else task.get("benchmark_cases")
        hw = hardware.get(pair.get("hardware_id"), {}) if per_id else hardware
        rows.append(
            {
                "prompt": build_prompt(
                    pair["task"],
                    description,
                    kernels[pair["anchor_kernel_id"]],
                    kernels[pair["candidate_kernel_id"]],
                    dict(hw),
                    style,
                    benchmark_cases=cases,
                    anchor_features=features.get(pair["anchor_kernel_id"]),
                    candidate_features=features.get(pair["candidate_kernel_id"]),
                ),
                "true_bin": int(pair["true_bin"]),
                "pair_id": str(pair["pair_id"]),
            }
        )
    return rows


def git_commit() -> str | None:
    """`git rev-parse HEAD` of the working directory, or None outside a repository."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


SMALL_MODEL_BYTES = 4 * 2**30  # checkpoints under this train in float32 on a GPU
PRECISIONS = ("auto", "fp32", "bf16-autocast", "bf16")


def resolve_precision(precision: str, cuda: bool, checkpoint_bytes: int) -> str:
    """The precision a run uses: `precision` unless "auto".

    auto: fp32 on CPU (stack.md: bf16 on CPU is slow and unsupported by some ops); on a GPU,
    fp32 for a small checkpoint and bf16 for a big one. SmolLM2's GRPO runs on the H200 logged
    NaN gradient norms in bf16 (after 11 steps with bf16 weights; at step 1 with float32 weights
    under bf16 autocast; data/training/h200/). The cause is cuDNN's attention backward (see
    _load_base, which now turns that backend off), not bf16 itself; float32 with TF32 matmuls
    also keeps attention off cuDNN, and costs little for a 135M model.

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
        # huggingface/trl#7181). Seen on our H200 host: scripts/gpu_check_sdpa.py finds NaN in
        # grad_q at every length 64 mod 128 (704 ... 6,592) with cuDNN and none with the
        # memory-efficient or math backends, which compute the same attention. Our GRPO runs
        # there logged NaN gradient norms (step 12 of one run, step 1 of three others).
        torch.backends.cuda.enable_cudnn_sdp(False)
    precision = resolve_precision(settings.precision, cuda, _checkpoint_bytes(path))
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.bfloat16 if precision == "bf16" else torch.float32
    )
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to("cuda" if cuda else "cpu"), tokenizer, precision


def prompt_tokens(tokenizer: Any, prompt: Any) -> int:
    """Tokens of a training row's prompt as the trainer feeds it (chat template applied)."""
    from models.backends.transformers_backend import render_chat

    text = prompt if isinstance(prompt, str) else render_chat(tokenizer, prompt)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def fitting_rows(rows: Sequence[dict[str, Any]], tokenizer: Any, limit: int | None) -> list[dict[str, Any]]:
    """The rows whose prompt has at most `limit` tokens (all of them when limit is None)."""
    if limit is None:
        return list(rows)
    return [r for r in rows if prompt_tokens(tokenizer, r["prompt"]) <= limit]


WARMUP_RECORD = "warmup.json"  # beside the checkpoints: the warm-up's figures, for a resumed run


def last_checkpoint(folder: Path) -> Path | None:
    """The newest complete checkpoint-N in `folder` (its trainer_state.json, written last, is
    there), or None; a checkpoint cut while being written is passed over."""
    if not folder.is_dir() or not (folder / WARMUP_RECORD).is_file():
        return None
    steps = {p: p.name.removeprefix("checkpoint-") for p in folder.glob("checkpoint-*")}
    whole = [p for p, n in steps.items() if n.isdigit() and (p / "trainer_state.json").is_file()]
    return max(whole, key=lambda p: int(steps[p]), default=None)


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
        bf16=precision in ("bf16", "bf16-autocast"),  # never on CPU (stack.md): resolve_precision
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


def _dataset_source_class():
    from mlflow.data.dataset_source import DatasetSource

    class _DuckDBPairsSource(DatasetSource):
        """The pairs table of one dataset version in the kernelcast warehouse."""

        def __init__(self, dataset_version: str) -> None:
            self.dataset_version = dataset_version

        @staticmethod
        def _get_source_type() -> str:
            return "duckdb"

        def load(self, **kwargs: Any) -> str:
            return self.uri

        @property
        def uri(self) -> str:
            return f"duckdb:pairs@{self.dataset_version}"

        @staticmethod
        def _can_resolve(raw_source: Any) -> bool:
            return isinstance(raw_source, str) and raw_source.startswith("duckdb:pairs@")

        @classmethod
        def _resolve(cls, raw_source: Any) -> _DuckDBPairsSource:
            return cls(str(raw_source).split("@", 1)[1])

        def to_dict(self) -> dict[str, Any]:
            return {"uri": self.uri}

        @classmethod
        def from_dict(cls, source_dict: dict[Any, Any]) -> _DuckDBPairsSource:
            return cls._resolve(source_dict["uri"])

    return _DuckDBPairsSource


def DuckDBPairsSource(dataset_version: str) -> Any:  # noqa: N802 - reads as a class at call sites
    """An MLflow dataset source naming `duckdb:pairs@<dataset_version>`."""
    return _dataset_source_class()(dataset_version)


def mlflow_experiment(client: Any, tracking_uri: str, name: str) -> str:
    """The experiment id of `name`, created if missing (models.tracking.mlflow_experiment)."""
    from models.tracking import mlflow_experiment as experiment_id

    return experiment_id(client, tracking_uri, name)


def train_grpo(
    settings: TrainingSettings,
    rows: Sequence[dict[str, Any]],
    out_dir: str | Path,
    tracking_uri: str | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
    tags: Mapping[str, str] | None = None,
    dataset_version: str | None = None,
    measurement_ids: Sequence[str] | None = None,
    checkpoint_dir: str | Path | None = None,
    stop_at: float | None = None,
) -> TrainingResult:
    """Format warm-up, then GRPO, then save the adapter; logs the run to MLflow.

    With `checkpoint_dir`, every GRPO step is checkpointed there and a call that finds a
    checkpoint resumes from it (the warm-up is not repeated: its record is kept beside the
    checkpoints); with `stop_at` (a time.time() value), GRPO stops cleanly after the first
    step that ends past it and the result says `finished=False`. Together they let a run
    longer than one GPU call go on in the next (models/remote/gpu_job.py).

    Args:
        settings: the resolved training settings.
        rows: `build_training_rows` output (training pairs only).
        out_dir: where the adapter + tokenizer are saved (created).
        tracking_uri: MLflow tracking URI (e.g. "sqlite:///.../mlflow.db"); None = no MLflow.
        experiment: MLflow experiment name.
        tags: extra run tags (e.g. {"dagster_run_id": ...}).
        dataset_version: the warehouse dataset version the rows come from.
        measurement_ids: the measurements behind that version (logged as an artifact).
    Returns:
        TrainingResult(run_id, adapter_dir, metrics, steps, log_history).
    Raises:
        ValueError: fewer rows than prompts_per_step (a step would repeat prompts).
        RuntimeError: max_nonfinite_steps steps in a row had non-finite gradients.
    """
    run = _TrainingRun(tracking_uri, experiment, settings, dataset_version, tags, measurement_ids)
    try:
        return _train_grpo(settings, rows, out_dir, run, checkpoint_dir, stop_at)
    except BaseException:
        run.close("FAILED")  # a crashed or interrupted run shows as failed, not as running forever
        raise


class _TrainingRun:
    """The MLflow run of one train_grpo call: opened before the warm-up, streamed into during
    GRPO (models.tracking.MlflowMetricsCallback), closed at the end. Inert without a URI."""

    def __init__(self, tracking_uri, experiment, settings, dataset_version, tags, measurement_ids) -> None:
        self.tracking_uri, self.experiment, self.settings = tracking_uri, experiment, settings
        self.dataset_version, self.tags, self.measurement_ids = dataset_version, tags, measurement_ids
        self.run_id: str | None = None

    def open(self, rows: Sequence[dict[str, Any]]) -> None:
        if not self.tracking_uri or not _main_process():
            return  # under `accelerate launch` one process logs the run, not one per GPU
        from models.tracking import start_training_run

        self.run_id = start_training_run(self.tracking_uri, self.experiment, _run_params(self.settings, self.dataset_version, rows),
                                         _run_tags(self.settings, self.dataset_version, self.tags), rows, self.dataset_version)

    def callbacks(self) -> list[Any]:
        if self.run_id is None:
            return []
        from models.tracking import MlflowMetricsCallback

        return [MlflowMetricsCallback(self.tracking_uri, self.run_id)]

    def log_sft(self, losses: Sequence[float]) -> None:
        if self.run_id is not None:
            from models.tracking import log_sft_losses

            log_sft_losses(self.tracking_uri, self.run_id, losses)

    def close(self, status: str, metrics: Mapping[str, float] | None = None) -> None:
        if self.run_id is None:
            return
        from models.tracking import finish_training_run

        run_id, self.run_id = self.run_id, None
        finish_training_run(self.tracking_uri, run_id, metrics or {}, self.measurement_ids, status)
        self.closed_run_id = run_id


def _main_process() -> bool:
    """False in the processes of a distributed launch other than the main one."""
    from accelerate import PartialState

    return PartialState().is_main_process


def _run_params(settings: TrainingSettings, dataset_version: str | None, rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    return {**settings.as_params(), "dataset_version": dataset_version or "", "train_rows": str(len(rows))}


def _run_tags(settings: TrainingSettings, dataset_version: str | None, tags: Mapping[str, str] | None) -> dict[str, str]:
    return {"dataset_version": dataset_version or "", "base_model": settings.base_model,
            **({"git_commit": c} if (c := git_commit()) else {}), **dict(settings.tags), **dict(tags or {})}


def _train_grpo(settings: TrainingSettings, rows: Sequence[dict[str, Any]], out_dir: str | Path, run: _TrainingRun,
                checkpoint_dir: str | Path | None, stop_at: float | None) -> TrainingResult:
    """train_grpo's body; `run` is its MLflow run."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from models.callbacks import NonFiniteGradGuard, StopAt
    from models.sft import parse_rate, run_sft

    if len(rows) < settings.prompts_per_step:
        raise ValueError(
            f"{len(rows)} training rows, fewer than prompts_per_step={settings.prompts_per_step}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base, tokenizer, precision = _load_base(settings)
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
    rows = kept
    run.open(rows)
    model = _with_lora(base, settings)

    ckpt = Path(checkpoint_dir) if checkpoint_dir else None
    resume = last_checkpoint(ckpt) if ckpt else None
    if resume:  # the warm-up's weights are in the checkpoint; its figures beside it
        warm = json.loads((ckpt / WARMUP_RECORD).read_text())
        metrics, sft_losses = warm["metrics"], warm["sft_losses"]
        log.info("resuming GRPO from %s", resume)
    else:
        probe = list(rows[: settings.parse_probe_rows])
        probe_tokens = settings.max_completion_length
        metrics = {
            "parse_rate_before_sft": parse_rate(model, tokenizer, probe, probe_tokens),
            "train_rows_used": float(len(kept)),
        }
        sft_losses = run_sft(model, tokenizer, rows, settings)
        run.log_sft(sft_losses)
        metrics["parse_rate_after_sft"] = parse_rate(model, tokenizer, probe, probe_tokens)
        if sft_losses:
            metrics["sft_loss_first"], metrics["sft_loss_last"] = sft_losses[0], sft_losses[-1]
        log.info(
            "format warm-up: parse rate %.2f -> %.2f over %d probe rows",
            metrics["parse_rate_before_sft"],
            metrics["parse_rate_after_sft"],
            len(probe),
        )
        if ckpt:
            ckpt.mkdir(parents=True, exist_ok=True)
            part = ckpt / (WARMUP_RECORD + ".part")  # whole or absent: a resume reads it
            part.write_text(json.dumps({"metrics": metrics, "sft_losses": sft_losses}))
            part.replace(ckpt / WARMUP_RECORD)

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
    steps = int(trainer.state.global_step)
    if guard.gave_up:
        raise RuntimeError(
            f"GRPO stopped: {guard.max_consecutive} steps in a row had non-finite gradients "
            f"(skipped steps {guard.skipped_steps}; precision {precision})"
        )
    history = [dict(h) for h in trainer.state.log_history]
    if steps < settings.max_steps:
        log.info("GRPO stopped at step %d of %d (stop_at); resume from %s", steps, settings.max_steps, ckpt)
        run.close("KILLED", metrics)
        return TrainingResult(None, out, metrics, steps, history, sft_losses, finished=False)
    metrics.update(_summary(history))
    # Steps whose update was skipped, in this process (a resumed run counts its own part).
    metrics["nonfinite_grad_steps"] = float(len(guard.skipped_steps))
    trainer.model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    log.info("GRPO: %d steps, adapter saved to %s", steps, out)

    run.close("FINISHED", metrics)
    return TrainingResult(getattr(run, "closed_run_id", None), out, metrics, steps, history, sft_losses)


def log_training_run(
    tracking_uri: str,
    experiment: str,
    settings: TrainingSettings,
    history: list[dict[str, Any]],
    sft_losses: list[float],
    metrics: dict[str, float],
    rows: Sequence[dict[str, Any]],
    dataset_version: str | None,
    measurement_ids: Sequence[str] | None,
    tags: Mapping[str, str] | None,
) -> str:
    """Log a run trained elsewhere (a GPU host without MLflow) after the fact; its id.

    The same run as train_grpo's (params, tags, dataset input, one curve per logged key at the
    trainer's steps, final metrics, measurement ids); only the timing differs
    (pipelines/training/llm.py).
    """
    from models.tracking import (
        _client,
        finish_training_run,
        log_sft_losses,
        start_training_run,
        step_metrics,
    )

    run_id = start_training_run(tracking_uri, experiment, _run_params(settings, dataset_version, rows),
                                _run_tags(settings, dataset_version, tags), rows, dataset_version)
    try:
        log_sft_losses(tracking_uri, run_id, sft_losses)
        batch = [m for h in history for m in step_metrics(h, int(h.get("step", 0)))]
        for start in range(0, len(batch), 900):  # MLflow accepts at most 1000 metrics per batch
            _client(tracking_uri).log_batch(run_id, metrics=batch[start : start + 900])
        finish_training_run(tracking_uri, run_id, metrics, measurement_ids)
    except Exception:
        _client(tracking_uri).set_terminated(run_id, "FAILED")
        raise
    return run_id


__all__ = [
    "PROFILES",
    "REWARDS",
    "TrainingResult",
    "TrainingSettings",
    "build_training_rows",
    "git_commit",
    "log_training_run",
    "mlflow_experiment",
    "sft_warmup",
    "train_grpo",
]
