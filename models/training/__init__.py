"""Training of the LLM surrogate, by concern (import the module you need; nothing is loaded here):

    settings   TrainingSettings (paper defaults, per-profile overrides), resolve_precision
    rows       build_training_rows (one prompt per training pair), fitting_rows
    warmup     the supervised format warm-up before GRPO, and its record for a resumed run
    grpo       train_grpo: base model + LoRA, warm-up, TRL's GRPOTrainer, the saved adapter
    tracking   RunTracking (where the MLflow run goes) and the run's lifecycle
    supervised supervised distributional training (method.md section 5b), `data_parallel` its
               accelerate plumbing, `callbacks` the trainer callbacks
    sft        the answer-format targets of the warm-up
    rewards    the GRPO rewards (Brier, CRPS, format), in TRL's reward-function contract
    head       a small head on a frozen model's hidden states: the LLM that reads code
    gpu_host/  the trip to a GPU host: the job and bundle files, the host-side trainers

    settings = TrainingSettings.profile("smoke", base_model=str(tiny_dir))
    train = read_pairs(con, version, split="train")
    rows = build_training_rows(train, kernels, tasks, hardware)
    result = train_grpo(settings, rows, out_dir, RunTracking("sqlite:///mlflow.db", dataset_version=version,
                        measurement_ids=pair_measurement_ids(con, version, train)))

The warm-up exists because small models never write the answer format zero-shot, so GRPO would
see no reward signal (models.training.sft). MLflow gets the resolved settings as params, per-step metrics
from the trainer's log history (one reward curve per reward function, frac_reward_zero_std,
loss), parse rates before and after the warm-up, the dataset as an input (name = dataset
version, source and digest "duckdb:pairs@<version>"), the measurements behind its training pairs
as `measurement_ids.txt`, and tags dataset_version, base_model, git_commit, dagster_run_id. TRL's
own MLflow callback is not used (report_to="none"): logging here is explicit and works against
any tracking URI.

Nothing here imports dagster; the tracking URI is a plain string.
"""
