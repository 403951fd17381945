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

from models.training.gpu_host.job import (
    JOB_FILE,
    JOB_FORMAT,
    KERNELS_FILE,
    JobError,
    read_job,
    read_jsonl_gz,
    write_job,
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
    write_job(folder, "variants", {"dataset_version": "ds-toy", "held_out_task": None,
                                   "tasks": {"softmax": {"description": "Row softmax.", "benchmark_cases": [{"M": 8, "N": 8}]}},
                                   "hardware": {"h": {"device_name": "NVIDIA H200"}},
                                   "variants": [v.to_dict() for v in variants]}, kernels, pairs)


def test_a_job_that_is_not_one_is_one_line(tmp_path):
    with pytest.raises(JobError, match="not a training job"):
        read_job(tmp_path)
    (tmp_path / JOB_FILE).write_text(json.dumps({"format": 99}))
    with pytest.raises(JobError, match="format 99"):
        read_job(tmp_path)


def test_a_job_round_trips_with_its_kind_and_float32_vectors(tmp_path):
    """Both kinds write and read back the same rows; a pair's vector comes back as float32 values
    (NaN kept), what the heads were fitted on; an old format and an unknown role are refused."""
    import math

    _job(tmp_path / "v", [Variant("full")])
    meta, kernels, pairs = read_job(tmp_path / "v", "variants")
    assert meta["format"] == JOB_FORMAT and meta["kind"] == "variants" and len(pairs) == 40 and len(kernels) == 41
    assert meta["variants"][0]["name"] == "full" and kernels["k0"]["features"]["n_regs"] >= 33
    vector = [0.1, float("nan"), 3.0]
    code = write_job(tmp_path / "c", "code", {**meta, "variants": None, "feature_names": ["a", "b", "c"]},
                     kernels.values(), [{**p, "features": vector} for p in pairs])
    meta2, kernels2, pairs2 = read_job(tmp_path / "c", "code")
    assert meta2 == code and meta2["kind"] == "code" and kernels2 == kernels
    got = pairs2[0]["features"]
    assert got[0] == 0.10000000149011612 and math.isnan(got[1]) and got[2] == 3.0
    assert [{k: v for k, v in p.items() if k != "features"} for p in pairs2] == pairs
    old = json.loads((tmp_path / "v" / JOB_FILE).read_text())
    (tmp_path / "v" / JOB_FILE).write_text(json.dumps({**old, "format": 1}))
    with pytest.raises(JobError, match="job format 1, this code reads 2"):
        read_job(tmp_path / "v")
    with pytest.raises(JobError, match="unknown role"):
        write_job(tmp_path / "x", "variants", meta, kernels.values(), [{**pairs[0], "roles": ["train"]}])
    with pytest.raises(JobError, match="unknown job kind"):
        write_job(tmp_path / "x", "sft", meta, kernels.values(), pairs)
    assert len(read_jsonl_gz(tmp_path / "c" / KERNELS_FILE)) == 41
    # The one ingest reads a code job's host output from its OUT folder, and says what is missing.
    from pipelines.surrogates.remote_results import ingest

    (tmp_path / "empty").mkdir()
    with pytest.raises(JobError, match="not a host run's output \\(forecasts.parquet and metrics.json missing\\)"):
        ingest(tmp_path / "empty", tmp_path / "c", tmp_path / "into")
    with pytest.raises(JobError, match="from its OUT folder"):
        ingest([tmp_path / "empty", tmp_path / "empty"], tmp_path / "c", tmp_path / "into")
    assert not (tmp_path / "into").exists()


def _results_tar(folder: Path, pairs: list[dict], variant: str) -> None:
    """What gpu_job packs for one finished variant (status, history, forecasts), written by hand."""
    import gzip
    import io

    rng = random.Random(2)
    rows = []
    for p in pairs:
        for role in p["roles"]:
            w = [rng.random() + (2.0 if b == p["true_bin"] else 0.0) for b in range(1, 9)]
            rows.append({"pair_id": p["pair_id"], "role": role, "readout": "logprob", "repeat": 0,
                         "parse_ok": True, "parse_error": None, "p": [x / sum(w) for x in w]})
    files = {f"{variant}/status.json": json.dumps({"name": variant, "finished": True, "evaluated": True}).encode(),
             f"{variant}/sft/history.json": json.dumps({"history": [{"epoch": 1}]}).encode(),
             f"{variant}/forecasts.jsonl.gz": gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode())}
    folder.mkdir(parents=True)
    with tarfile.open(folder / "results.tar", "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_one_ingest_merges_a_variants_run_beside_the_code_variants(tmp_path):
    """A gpu_job run's results.tar brought into a committed folder that already holds a code
    variant: its rows and record join, the code variant's stay, and its fit pairs go to the
    variants' file; again, the variant is replaced, not added twice. A code job's output folder
    given for a variants job, or the other way round, is one line."""
    from pipelines.surrogates.remote_results import CODE_PAIRS_FILE, TRAINING_PAIRS_FILE, ingest

    _job(tmp_path / "job", [Variant("full")])
    _, _, pairs = read_job(tmp_path / "job")
    _results_tar(tmp_path / "out", pairs, "full")
    into = tmp_path / "committed"
    into.mkdir()
    pl.DataFrame({"variant": ["code-head"], "role": ["eval"], "readout": ["head"], "repeat": [0], "pair_id": ["x"],
                  "hardware_id": ["h"], "anchor_kernel_id": ["ref"], "candidate_kernel_id": ["k39"], "true_bin": [1],
                  **{f"p{i}": [0.125] for i in range(1, 9)}}).write_parquet(into / "forecasts.parquet")
    (into / "training.json").write_text(json.dumps({"dataset_version": "ds-old", "held_out_task": None,
                                                    "variants": {"code-head": {"dataset_version": "ds-old"}}}))
    summary = ingest(tmp_path / "out", tmp_path / "job", into)
    assert summary["variants"] == ["full"] and summary["forecasts"] == 40 and summary["training_pairs"] == 24
    frame = pl.read_parquet(into / "forecasts.parquet")
    assert frame.group_by("variant").len().sort("variant").rows() == [("code-head", 1), ("full", 40)]
    full = frame.filter(pl.col("variant") == "full")
    assert (full["dataset_version"] == "ds-toy").all() and set(full["role"]) == {"fit", "calibration", "eval"}
    training = json.loads((into / "training.json").read_text())
    assert set(training["variants"]) == {"code-head", "full"} and training["dataset_version"] == "ds-old"
    assert training["variants"]["full"]["status"]["finished"] and "dataset_version" not in training["variants"]["full"]
    assert pl.read_parquet(into / TRAINING_PAIRS_FILE).height == 24 and not (into / CODE_PAIRS_FILE).exists()
    ingest(tmp_path / "out" / "results.tar", tmp_path / "job", into)
    assert pl.read_parquet(into / "forecasts.parquet").height == 41
    with pytest.raises(JobError, match="no variant results"):
        ingest(tmp_path / "job", tmp_path / "job", into)
    assert pl.read_parquet(into / "forecasts.parquet").height == 41  # nothing written


@pytest.mark.slow
def test_gpu_job_runs_collects_and_reads_back_calibrated(tmp_path, monkeypatch):
    from pipelines.surrogates.committed import calibrated_variants
    from pipelines.surrogates.remote_results import ingest

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
    summary = ingest(sorted((tmp_path / "out").iterdir()), tmp_path / "job", tmp_path / "committed")
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


def test_the_command_line_ingests_a_variants_run(tmp_path):
    """`kernelcast train ingest` takes a gpu_job run's results.tar and says what it brought."""
    from typer.testing import CliRunner

    from orchestration.cli import app

    _job(tmp_path / "job", [Variant("full")])
    _, _, pairs = read_job(tmp_path / "job")
    _results_tar(tmp_path / "out", pairs, "full")
    into = tmp_path / "committed"
    res = CliRunner().invoke(app, ["train", "ingest", str(tmp_path / "out" / "results.tar"), "--job", str(tmp_path / "job"),
                                   "--into", str(into)])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[:2] == [f"40 forecasts of full of ds-toy -> {into}", "  24 fit pairs kept beside them"]
    assert pl.read_parquet(into / "forecasts.parquet").height == 40
