"""GRPO training of the surrogate (method.md section 5), by concern:

    settings   TrainingSettings (paper defaults, per-profile overrides), resolve_precision
    rows       build_training_rows (one prompt per training pair), fitting_rows
    warmup     the supervised format warm-up before GRPO, and its record for a resumed run
    grpo       train_grpo: base model + LoRA, warm-up, TRL's GRPOTrainer, the saved adapter
    tracking   RunTracking (where the MLflow run goes) and the run's lifecycle

    settings = TrainingSettings.profile("smoke", base_model=str(tiny_dir))
    rows = build_training_rows(read_pairs(con, version, split="train"), kernels, tasks, hardware)
    result = train_grpo(settings, rows, out_dir, RunTracking("sqlite:///mlflow.db", dataset_version=version,
                        measurement_ids=dataset_measurement_ids(con, version)))

The warm-up exists because small models never write the answer format zero-shot, so GRPO would
see no reward signal (models.sft). MLflow gets the resolved settings as params, per-step metrics
from the trainer's log history (one reward curve per reward function, frac_reward_zero_std,
loss), parse rates before and after the warm-up, the dataset as an input (name = dataset
version, source and digest "duckdb:pairs@<version>"), the measurement ids as
`measurement_ids.txt`, and tags dataset_version, base_model, git_commit, dagster_run_id. TRL's
own MLflow callback is not used (report_to="none"): logging here is explicit and works against
any tracking URI.

Nothing here imports dagster; the tracking URI is a plain string.
"""

from models.training.grpo import TrainingResult, train_grpo
from models.training.rows import build_training_rows, fitting_rows, prompt_tokens
from models.training.settings import (
    PRECISIONS,
    PROFILES,
    REWARDS,
    TrainingSettings,
    resolve_precision,
)
from models.training.tracking import DEFAULT_EXPERIMENT, RunTracking, git_commit
from models.training.warmup import WARMUP_RECORD, last_checkpoint

__all__ = [
    "DEFAULT_EXPERIMENT",
    "PRECISIONS",
    "PROFILES",
    "REWARDS",
    "WARMUP_RECORD",
    "RunTracking",
    "TrainingResult",
    "TrainingSettings",
    "build_training_rows",
    "fitting_rows",
    "git_commit",
    "last_checkpoint",
    "prompt_tokens",
    "resolve_precision",
    "train_grpo",
]
