"""The LLM surrogate's trip to a GPU host, run here on the CPU with the tiny model: a job in the
job format, the GPU-host runner (one supervised variant, one LoRA variant with its adapter), what
comes back collected into the committed form, and read back calibrated for a dataset version."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tarfile
from pathlib import Path

import polars as pl
import pytest

from models.training.gpu_host.jobfile import (
    JOB_FILE,
    JOB_FORMAT,
    KERNELS_FILE,
    PAIRS_FILE,
    JobError,
    read_job,
    write_json,
    write_jsonl_gz,
)
from models.training.gpu_host.variants import Variant

REPO = Path(__file__).resolve().parents[2]


def _threads() -> dict[str, str]:
    """The test process's OMP_NUM_THREADS (tests/conftest.py) for the job's bare environment."""
    return {k: v for k, v in os.environ.items() if k == "OMP_NUM_THREADS"}


def _job(folder: Path, variants: list[Variant]) -> None:
    rng = random.Random(0)
    kernels = [{"kernel_id": "ref", "task": "softmax", "prompt_source": "def ref_kernel(x): return x.softmax(-1)\n",
                "features": None}]
    pairs = []
    for i in range(40):
        b = rng.randint(1, 8)
        kernels.append({"kernel_id": f"k{i}", "task": "softmax", "prompt_source": f"BLOCK_N = {2 ** (b + 3)}\n",
                        "features": {"n_regs": 32 + b, "n_spills": 0, "shared_bytes": 0, "n_kernels": 1, "n_launches": 1}})
        role = ["fit"] if i < 24 else ["calibration"] if i < 32 else ["eval"]
        pairs.append({"pair_id": f"p{i}", "task": "softmax", "hardware_id": "h", "anchor_kernel_id": "ref",
                      "candidate_kernel_id": f"k{i}", "true_bin": b, "speedup": 2.0 ** (b - 4.5), "roles": role})
    folder.mkdir(parents=True)
    write_jsonl_gz(folder / KERNELS_FILE, kernels)
    write_jsonl_gz(folder / PAIRS_FILE, pairs)
    write_json(folder / JOB_FILE, {"format": JOB_FORMAT, "dataset_version": "ds-toy", "held_out_task": None,
                                   "tasks": {"softmax": {"description": "Row softmax.", "benchmark_cases": [{"M": 8, "N": 8}]}},
                                   "hardware": {"h": {"device_name": "NVIDIA H200"}},
                                   "variants": [v.to_dict() for v in variants]})


def test_a_job_that_is_not_one_is_one_line(tmp_path):
    with pytest.raises(JobError, match="not a training job"):
        read_job(tmp_path)
    (tmp_path / JOB_FILE).write_text(json.dumps({"format": 99}))
    with pytest.raises(JobError, match="format 99"):
        read_job(tmp_path)


@pytest.mark.slow
def test_gpu_job_runs_collects_and_reads_back_calibrated(tmp_path, monkeypatch):
    from pipelines.surrogates.committed import calibrated_variants
    from pipelines.surrogates.remote_results import collect

    variants = [Variant("full", style="compact+features", epochs=2, tokens_per_batch=4096, learning_rate=1e-3),
                Variant("lora", style="compact", finetune="lora", epochs=1, tokens_per_batch=4096, learning_rate=1e-3),
                Variant("grpo", style="compact", grpo_from="lora", grpo_steps=1, grpo_sft_steps=2)]
    _job(tmp_path / "job", variants)
    env = {"KERNELCAST_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(REPO), **_threads()}
    res = subprocess.run([sys.executable, "-m", "models.training.gpu_host.gpu_job", "run", "--job", str(tmp_path / "job"),
                          "--run", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--base-model", "tiny",
                          "--deadline-s", "600"], capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    out = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert out == ["adapter-lora.tar", "results.tar"]
    with tarfile.open(tmp_path / "out" / "adapter-lora.tar") as tar:
        assert sorted(tar.getnames()) == ["adapter/adapter_config.json", "adapter/adapter_model.safetensors"]
    # The same command again finds everything done and trains nothing.
    again = subprocess.run([sys.executable, "-m", "models.training.gpu_host.gpu_job", "run", "--job", str(tmp_path / "job"),
                            "--run", str(tmp_path / "run"), "--out", str(tmp_path / "out2"), "--base-model", "tiny"],
                           capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert again.returncode == 0 and "started" not in again.stderr
    summary = collect(sorted((tmp_path / "out").iterdir()), tmp_path / "job", tmp_path / "committed")
    assert summary["variants"] == ["full", "grpo", "lora"] and summary["adapters"] == ["lora"]
    frame = pl.read_parquet(tmp_path / "committed" / "forecasts.parquet")
    assert set(frame["role"]) == {"calibration", "eval"}
    # logprob on calibration and eval pairs for all three, the verbalized readout of GRPO's on eval
    assert frame.height == 3 * (8 + 8) + 8
    verbal = frame.filter(pl.col("readout") == "verbalized")
    assert set(verbal["variant"]) == {"grpo"} and verbal.height == 8  # answers that do not parse are rows too
    # Read back for a "current" dataset version whose pair ids differ: matched by the pair's keys.
    meta, _, pairs = read_job(tmp_path / "job")
    evals = pl.DataFrame([{"pair_id": f"new-{p['pair_id']}", "hardware_id": p["hardware_id"],
                           "anchor_kernel_id": p["anchor_kernel_id"], "candidate_kernel_id": p["candidate_kernel_id"]}
                          for p in pairs if "eval" in p["roles"]])
    got = {v.name: v for v in calibrated_variants(tmp_path / "committed", evals, evals.head(0))}
    assert set(got) == {"full", "grpo", "lora"}
    for v in got.values():
        assert v.forecasts.height == 8 and v.forecasts["pair_id"].str.starts_with("new-").all()
        p = v.forecasts.select([f"p{i}" for i in range(1, 9)]).to_numpy()
        assert abs(p.sum(axis=1) - 1).max() < 1e-9
        assert v.calibrator.n_fit == 8  # fitted on the variant's own calibration forecasts


@pytest.mark.slow
def test_gpu_job_trains_a_supervised_variant_on_two_processes(tmp_path):
    """`run --gpus-per-variant 2` starts a LoRA variant under accelerate launch (two gloo processes
    here): it trains, the main process alone forecasts, and what comes back is one variant's."""
    _job(tmp_path / "job", [Variant("lora", style="compact", finetune="lora", epochs=2, patience=0,
                                    tokens_per_batch=4096, learning_rate=1e-3)])
    env = {"KERNELCAST_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(REPO), **_threads()}
    res = subprocess.run([sys.executable, "-m", "models.training.gpu_host.gpu_job", "run", "--job", str(tmp_path / "job"),
                          "--run", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--base-model", "tiny",
                          "--gpus-per-variant", "2", "--deadline-s", "400"],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=420)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "started lora on 2 process(es)" in res.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["adapter-lora.tar", "results.tar"]
    with tarfile.open(tmp_path / "out" / "results.tar") as tar:
        status = json.load(tar.extractfile("lora/status.json"))
        history = json.load(tar.extractfile("lora/sft/history.json"))
        log = tar.extractfile("lora/child.log").read().decode()
    assert history["processes"] == 2 and [e["epoch"] for e in history["history"]] == [1, 2]
    assert status["finished"] and status["evaluated"] and status["forecasts"] == 8 + 8
    assert log.count('"name": "lora"') == 1  # one status line: the main process's


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU path")
def test_gpu_check_sdpa_without_a_gpu_is_one_line(capsys):
    from models.training.gpu_host import sdpa_check

    assert sdpa_check.main([]) == 2
    assert capsys.readouterr().err.strip() == "error: no CUDA GPU here"
