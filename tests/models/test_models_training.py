"""Surrogate training: settings and profiles, training rows, the format warm-up, GRPO end to
end on CPU with the tiny in-process model, and what the MLflow run holds."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
import torch

from models.parsing import parse_forecast
from models.tiny import build_tiny_model
from models.training.grpo import train_grpo
from models.training.rewards import brier_reward, correctness_reward, crps_reward
from models.training.rows import build_training_rows
from models.training.settings import PROFILES, TrainingSettings
from models.training.sft import format_target, smoothed_one_hot
from models.training.tracking import RunTracking

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


def test_the_warm_up_goes_on_in_rounds_until_the_format_holds(tmp_path, one_thread, monkeypatch):
    """Rounds of sft_steps until the probe's parse rate reaches sft_parse_target, at most
    sft_max_rounds; each round goes on through the rows where the last one stopped."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from models.training import sft
    from models.training.grpo import _with_lora
    from models.training.tracking import TrainingRun
    from models.training.warmup import warm_up

    tiny = build_tiny_model(tmp_path / "tiny")
    settings = TrainingSettings.profile("smoke", base_model=str(tiny), sft_steps=3, sft_parse_target=1.01,
                                        sft_max_rounds=3, max_completion_length=8)
    rows = build_training_rows(make_pairs(), KERNELS, TASKS, HARDWARE, style=settings.prompt_style)
    model = _with_lora(AutoModelForCausalLM.from_pretrained(str(tiny)), settings)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tiny))
    seen = []
    monkeypatch.setattr(sft, "run_sft", lambda *a, start=0, **k: seen.append(start) or [1.0] * settings.sft_steps)
    # a target no parse rate reaches: every round runs, each from where the last stopped
    warm = warm_up(model, tokenizer, rows, settings, TrainingRun(None, settings))
    assert warm.metrics["sft_rounds"] == 3 and seen == [0, 3, 6] and len(warm.sft_losses) == 9
    # a target reached in the second round ends the warm-up there
    rates = iter([0.0, 0.4, 0.8, 1.0])
    monkeypatch.setattr(sft, "parse_rate", lambda *a, **k: next(rates))
    warm = warm_up(model, tokenizer, rows, replace(settings, sft_parse_target=0.75), TrainingRun(None, settings))
    assert warm.metrics["sft_rounds"] == 2 and warm.metrics["parse_rate_after_sft"] == 0.8
    assert warm.metrics["parse_rate_before_sft"] == 0.0
    # the default (target 0): one round, as a plain warm-up
    rates = iter([0.0, 0.1])
    warm = warm_up(model, tokenizer, rows, replace(settings, sft_parse_target=0.0), TrainingRun(None, settings))
    assert warm.metrics["sft_rounds"] == 1


LIVE: list[tuple[str, int]] = []  # (run status, loss points stored) per trainer log line, from `trained`


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_thread):
    """One smoke run: 120 warm-up steps, then 2 GRPO steps of 2 prompts x 2 rollouts."""
    root = tmp_path_factory.mktemp("training")
    tiny = build_tiny_model(root / "tiny")
    settings = TrainingSettings.profile("smoke", base_model=str(tiny))
    rows = build_training_rows(make_pairs(), KERNELS, TASKS, HARDWARE, style=settings.prompt_style)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    from mlflow import MlflowClient

    from models.training.callbacks import MlflowMetricsCallback

    seen_live = []  # (run status, loss points stored) as each trainer log line is sent
    original = MlflowMetricsCallback.on_log

    def spy(self, args, state, control, logs=None, **kwargs):
        out = original(self, args, state, control, logs=logs, **kwargs)
        client = MlflowClient(self.tracking_uri)
        seen_live.append((client.get_run(self.run_id).info.status, len(client.get_metric_history(self.run_id, "loss"))))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(MlflowMetricsCallback, "on_log", spy)
        tracking = RunTracking(uri, dataset_version="v-test", measurement_ids=["m1", "m2", "m3"],
                               tags={"dagster_run_id": "dg-run-1"})
        result = train_grpo(settings, rows, root / "adapter", tracking)
    LIVE[:] = seen_live
    return result, uri, tiny


@pytest.mark.slow
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


def test_training_metrics_are_streamed_while_the_run_is_running(trained):
    """Each GRPO step's log line is in MLflow while training goes on (live curves), not after."""
    live = LIVE
    assert [status for status, _ in live if _] and all(status == "RUNNING" for status, _ in live)
    losses = [n for _, n in live]
    assert losses[:2] == [1, 2]  # step 1's loss was stored before step 2 ran


def test_grad_guard_drops_a_non_finite_step_and_gives_up_after_too_many():
    from transformers import TrainerControl, TrainerState

    from models.training.callbacks import NonFiniteGradGuard

    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([p], lr=0.1)
    guard = NonFiniteGradGuard(max_consecutive=2)
    state, control = TrainerState(), TrainerControl()

    def step(grad):
        p.grad = torch.tensor(grad)
        guard.on_pre_optimizer_step(None, state, control, optimizer=opt)
        opt.step()
        state.global_step += 1

    step([float("nan"), 1.0, 1.0])  # dropped: the weights stay untouched
    assert p.grad is None and torch.equal(p.detach(), torch.zeros(3)) and guard.skipped_steps == [1]
    step([1.0, 1.0, 1.0])  # a finite step trains and resets the run of bad ones
    assert torch.isfinite(p).all() and p.detach().abs().sum() > 0 and guard.consecutive == 0
    step([float("inf"), 0.0, 0.0])
    assert not control.should_training_stop
    step([0.0, float("nan"), 0.0])
    assert guard.skipped_steps == [1, 3, 4] and guard.gave_up and control.should_training_stop
    assert torch.isfinite(p).all()
    with pytest.raises(ValueError, match="max_consecutive"):
        NonFiniteGradGuard(0)


def _poison_lora_grads(monkeypatch, backward_passes: int) -> None:
    """Make the first `backward_passes` backward passes of the LoRA model produce NaN grads
    (what the H200 runs logged), by wrapping models.training.grpo._with_lora."""
    from models.training import grpo as training

    real = training._with_lora
    left = {"n": backward_passes}

    def poisoned(model, settings):
        peft_model = real(model, settings)
        first = next(p for n, p in peft_model.named_parameters() if p.requires_grad and "lora_A" in n)

        def hook(grad):
            if left["n"] <= 0:
                return grad
            left["n"] -= 1
            return grad * float("nan")

        # The format warm-up runs backward passes too: poison only GRPO's (armed below).
        first.register_hook(lambda g: hook(g) if armed["on"] else g)
        return peft_model

    armed = {"on": False}
    import trl  # train_grpo imports GRPOTrainer from trl when it runs: arm it there

    class Armed(trl.GRPOTrainer):
        def train(self, *a, **k):
            armed["on"] = True
            return super().train(*a, **k)

    monkeypatch.setattr(training, "_with_lora", poisoned)
    monkeypatch.setattr(trl, "GRPOTrainer", Armed)


def _nan_settings(tmp_path, **kw):
    tiny = build_tiny_model(tmp_path / "tiny")
    return TrainingSettings.profile("smoke", base_model=str(tiny), sft_steps=0, parse_probe_rows=1, **kw)


def test_a_nan_gradient_costs_one_step_not_the_run(tmp_path, monkeypatch, one_thread):
    _poison_lora_grads(monkeypatch, backward_passes=1)
    settings = _nan_settings(tmp_path)
    rows = build_training_rows(make_pairs(), KERNELS, TASKS, HARDWARE, style=settings.prompt_style)
    result = train_grpo(settings, rows, tmp_path / "adapter")
    assert result.steps == 2 and result.metrics["nonfinite_grad_steps"] == 1.0
    grad_norms = [h["grad_norm"] for h in result.log_history if "grad_norm" in h]
    assert math.isnan(grad_norms[0]) and math.isfinite(grad_norms[1])
    from safetensors.torch import load_file

    weights = load_file(str(result.adapter_dir / "adapter_model.safetensors"))
    assert all(torch.isfinite(t).all() for t in weights.values())


def test_gradients_that_stay_non_finite_stop_training_with_one_clear_error(tmp_path, monkeypatch, one_thread):
    _poison_lora_grads(monkeypatch, backward_passes=100)
    settings = _nan_settings(tmp_path, max_nonfinite_steps=2)
    rows = build_training_rows(make_pairs(), KERNELS, TASKS, HARDWARE, style=settings.prompt_style)
    with pytest.raises(RuntimeError, match=r"2 steps in a row had non-finite gradients \(skipped steps \[1, 2\]"):
        train_grpo(settings, rows, tmp_path / "adapter")


def test_rows_with_prompts_over_the_limit_are_left_out(tmp_path):
    from transformers import PreTrainedTokenizerFast

    from models.training.rows import fitting_rows, prompt_tokens
    tiny = build_tiny_model(tmp_path / "tiny")
    tok = PreTrainedTokenizerFast.from_pretrained(str(tiny))
    rows = build_training_rows(make_pairs(), KERNELS, TASKS, HARDWARE, style="diff")
    sizes = sorted(prompt_tokens(tok, r["prompt"]) for r in rows)
    assert sizes[0] > 10
    assert fitting_rows(rows, tok, None) == rows
    assert len(fitting_rows(rows, tok, sizes[1])) >= 2 and len(fitting_rows(rows, tok, sizes[0] - 1)) == 0
    settings = TrainingSettings.profile("smoke", base_model=str(tiny), max_prompt_tokens=sizes[0] - 1)
    with pytest.raises(ValueError, match="0 training rows have prompts of at most"):
        train_grpo(settings, rows, tmp_path / "adapter")
    with pytest.raises(ValueError, match="precision"):
        TrainingSettings(precision="fp8")


@pytest.mark.slow
def test_a_run_stopped_by_the_clock_resumes_from_its_checkpoint(tmp_path, one_thread):
    """stop_at ends GRPO at a whole step (checkpointed); the next call resumes there without
    repeating the warm-up and finishes the run: how training spans several runs on a GPU host."""
    import json

    from models.training.warmup import WARMUP_RECORD, last_checkpoint
    tiny = build_tiny_model(tmp_path / "tiny")
    settings = TrainingSettings.profile("smoke", base_model=str(tiny), sft_steps=3, parse_probe_rows=1)
    rows = build_training_rows(make_pairs(), KERNELS, TASKS, HARDWARE, style=settings.prompt_style)
    ckpt = tmp_path / "ckpt"
    first = train_grpo(settings, rows, tmp_path / "adapter", checkpoint_dir=ckpt, stop_at=0.0)
    assert not first.finished and first.steps == 1 and first.run_id is None
    assert last_checkpoint(ckpt).name == "checkpoint-1"
    assert not (tmp_path / "adapter" / "adapter_config.json").exists()  # nothing final yet
    warm = json.loads((ckpt / WARMUP_RECORD).read_text())
    assert len(warm["sft_losses"]) == 3

    # A checkpoint cut while being written (no trainer_state.json) is passed over.
    (ckpt / "checkpoint-7").mkdir()
    assert last_checkpoint(ckpt).name == "checkpoint-1"

    second = train_grpo(settings, rows, tmp_path / "adapter", checkpoint_dir=ckpt)
    assert second.finished and second.steps == 2
    assert second.sft_losses == warm["sft_losses"]  # the warm-up was not run again
    assert [h["step"] for h in second.log_history if "loss" in h] == [1, 2]
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert last_checkpoint(tmp_path / "none") is None

    # The same run in one go ends with the same weights: the resume restored the warmed-up
    # adapter, the optimizer and the sampling state, not a fresh start.
    from safetensors.torch import load_file

    whole = train_grpo(settings, rows, tmp_path / "whole")
    a = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(whole.adapter_dir / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
