"""Surrogate training: settings and profiles, training rows, the format warm-up, GRPO end to
end on CPU with the tiny in-process model, and what the MLflow run holds."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest
import torch

from models.parsing import parse_forecast
from models.rewards import brier_reward, correctness_reward, crps_reward
from models.sft import format_target, smoothed_one_hot
from models.tiny import build_tiny_model
from models.training import (
    PROFILES,
    TrainingSettings,
    build_training_rows,
    train_grpo,
)

ANCHOR = "import triton\n\n\ndef kernel(x):\n    return x * 2\n"
KERNELS = {f"k{i}": ANCHOR.replace("x * 2", f"x * {i + 2}") for i in range(5)}
TASKS = {"softmax": "Row-wise softmax of a 2-D tensor."}
HARDWARE = {"device_name": "NVIDIA H200", "capability": [9, 0], "sm_count": 132}


def make_pairs() -> pl.DataFrame:
    """Four hand-made training pairs against anchor k0, bins 2, 4, 5, 7."""
    return pl.DataFrame(
        {
            "pair_id": [f"p{i}" for i in range(1, 5)],
            "task": ["softmax"] * 4,
            "hardware_id": ["nvidia-h200-sm90"] * 4,
            "anchor_kernel_id": ["k0"] * 4,
            "candidate_kernel_id": ["k1", "k2", "k3", "k4"],
            "true_bin": [2, 4, 5, 7],
            "split": ["train"] * 4,
        }
    )


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread: on 2 loaded cores the tiny model runs ~3x faster than with 2."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_profiles_scale_down_the_paper_settings():
    gpu = TrainingSettings.profile("gpu")
    assert (gpu.lora_rank, gpu.learning_rate, gpu.prompts_per_step, gpu.num_generations) == (
        32,
        4e-5,
        8,
        8,
    )
    assert (gpu.max_steps, gpu.temperature, gpu.max_completion_length) == (20, 1.0, 8192)
    smoke = TrainingSettings.profile("smoke", base_model="/x", reward_weight=2.5)
    assert (smoke.max_steps, smoke.prompts_per_step, smoke.num_generations) == (2, 2, 2)
    assert smoke.prompt_style == "diff" and smoke.base_model == "/x"
    assert set(PROFILES) == {"smoke", "default", "gpu"}
    with pytest.raises(ValueError, match="unknown training profile"):
        TrainingSettings.profile("huge")
    with pytest.raises(ValueError, match="reward must be"):
        TrainingSettings(reward="brier")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "reward, funcs, weights",
    [
        ("correctness", [correctness_reward], [1.0]),
        ("correctness+brier", [correctness_reward, brier_reward], [1.0, 2.5]),
        ("correctness+crps", [correctness_reward, crps_reward], [1.0, 2.5]),
    ],
)
def test_reward_weight_is_honoured(reward, funcs, weights):
    assert TrainingSettings(reward=reward, reward_weight=2.5).reward_parts() == (funcs, weights)


def test_build_training_rows_one_per_pair():
    rows = build_training_rows(make_pairs(), KERNELS, TASKS, HARDWARE)
    assert [r["pair_id"] for r in rows] == ["p1", "p2", "p3", "p4"]
    assert [r["true_bin"] for r in rows] == [2, 4, 5, 7]
    user = rows[1]["prompt"][1]["content"]
    assert [m["role"] for m in rows[1]["prompt"]] == ["system", "user"]
    assert "+    return x * 4" in user and "NVIDIA H200" in user  # diff style, hardware table
    by_id = build_training_rows(make_pairs(), KERNELS, TASKS, {"nvidia-h200-sm90": HARDWARE})
    assert by_id[0]["prompt"] == rows[0]["prompt"]
    with pytest.raises(KeyError, match="no source for kernel k4"):
        build_training_rows(
            make_pairs(), {k: v for k, v in KERNELS.items() if k != "k4"}, TASKS, {}
        )


@pytest.mark.parametrize("y", range(1, 9))
def test_warmup_target_parses_and_peaks_at_the_true_bin(y):
    p = smoothed_one_hot(y)
    assert math.isclose(sum(p), 1.0) and max(p) == p[y - 1] == 0.6 and min(p) > 0
    f = parse_forecast(format_target(y))
    assert f.parse_ok and f.predicted_bin == y and math.isclose(f.raw_sum, 1.0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_thread):
    """One smoke run: 120 warm-up steps, then 2 GRPO steps of 2 prompts x 2 rollouts."""
    root = tmp_path_factory.mktemp("training")
    tiny = build_tiny_model(root / "tiny")
    settings = TrainingSettings.profile("smoke", base_model=str(tiny))
    rows = build_training_rows(make_pairs(), KERNELS, TASKS, HARDWARE, style=settings.prompt_style)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    result = train_grpo(
        settings,
        rows,
        root / "adapter",
        tracking_uri=uri,
        tags={"dagster_run_id": "dg-run-1"},
        dataset_version="v-test",
        measurement_ids=["m1", "m2", "m3"],
    )
    return result, uri, tiny


def test_warmup_teaches_the_answer_format(trained):
    result, _, _ = trained
    m = result.metrics
    # Measured: a random 0.17M-parameter model never writes the answer zero-shot; after 120
    # warm-up steps its greedy completions parse (2 of 2 probe prompts in our runs).
    assert m["parse_rate_before_sft"] == 0.0
    assert m["parse_rate_after_sft"] > m["parse_rate_before_sft"]
    assert m["sft_loss_last"] < m["sft_loss_first"] / 5


def test_grpo_runs_and_saves_the_adapter(trained):
    result, _, tiny = trained
    assert result.steps == 2
    steps = [h for h in result.log_history if "loss" in h]
    assert len(steps) == 2 and all(math.isfinite(h["loss"]) for h in steps)
    keys = set().union(*steps)
    # Both reward functions ran and are logged as their own curves.
    assert {"rewards/correctness_reward/mean", "rewards/brier_reward/mean"} <= keys
    assert "frac_reward_zero_std" in keys and "frac_reward_zero_std_avg" in result.metrics
    assert (result.adapter_dir / "adapter_config.json").is_file()
    assert (result.adapter_dir / "tokenizer.json").is_file()
    from safetensors.torch import load_file

    weights = load_file(str(result.adapter_dir / "adapter_model.safetensors"))
    lora_b = [t for k, t in weights.items() if "lora_B" in k]
    assert lora_b and any(t.abs().sum() > 0 for t in lora_b)  # B starts at zero: it trained


def test_mlflow_run_holds_config_metrics_dataset_and_ids(trained, tmp_path):
    from mlflow import MlflowClient

    result, uri, tiny = trained
    client = MlflowClient(uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    p = run.data.params
    assert (p["lora_rank"], p["max_steps"], p["reward"], p["reward_weight"]) == (
        "16",
        "2",
        "correctness+brier",
        "1.0",
    )
    assert p["base_model"] == str(tiny) and p["dataset_version"] == "v-test"
    t = run.data.tags
    assert (t["dataset_version"], t["base_model"], t["dagster_run_id"]) == (
        "v-test",
        str(tiny),
        "dg-run-1",
    )
    assert len(t.get("git_commit", "x" * 40)) == 40
    assert run.data.metrics["parse_rate_after_sft"] == result.metrics["parse_rate_after_sft"]
    curve = client.get_metric_history(result.run_id, "rewards/brier_reward/mean")
    assert sorted(m.step for m in curve) == [1, 2]
    assert len(client.get_metric_history(result.run_id, "sft/loss")) == 120
    inputs = run.inputs.dataset_inputs
    assert len(inputs) == 1
    ds = inputs[0].dataset
    assert ds.name == "v-test" and ds.digest == "duckdb:pairs@v-test"
    assert "duckdb:pairs@v-test" in ds.source
    ids = Path(client.download_artifacts(result.run_id, "measurement_ids.txt", str(tmp_path)))
    assert ids.read_text().split() == ["m1", "m2", "m3"]
