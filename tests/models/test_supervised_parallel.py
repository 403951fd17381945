"""Data-parallel supervised training, really launched: two processes (a gloo process group on
the CPU) under `accelerate launch` with the product's config, against one process with the same
settings and rows (tests/supervised_ranks.py is what each process runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from models.training.gpu_host.gpu_job import _free_port

REPO = Path(__file__).resolve().parents[2]


def _launch(work: Path, home: Path, processes: int) -> subprocess.CompletedProcess:
    env = {"KERNELCAST_HOME": str(home), "HF_HUB_OFFLINE": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
           **{k: v for k, v in os.environ.items() if k == "OMP_NUM_THREADS"}}  # tests/conftest.py's
    cmd = [sys.executable, "-m", "accelerate.commands.launch",
           "--config_file", str(REPO / "deploy/accelerate/multi_gpu.yaml"), "--num_processes", str(processes),
           "--main_process_port", str(_free_port()), str(REPO / "tests/supervised_ranks.py"), str(work)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


def _max_abs_diff(a: dict, b: dict) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.slow
def test_two_processes_train_disjoint_shares_in_sync_as_one_process_would(tmp_path, monkeypatch):
    import torch
    from safetensors.torch import load_file
    from supervised_ranks import row_digest
    from supervised_toy import parallel_case
    from transformers import PreTrainedTokenizerFast

    from models.training.supervised import encode_rows, train_supervised

    home = tmp_path / "home"
    monkeypatch.setenv("KERNELCAST_HOME", str(home))
    settings, train, calibration = parallel_case()
    single = train_supervised(settings, train, calibration, tmp_path / "single")  # also builds the tiny model
    work = tmp_path / "dp"
    work.mkdir()
    res = _launch(work, home, 2)
    assert res.returncode == 0, res.stderr[-3000:]
    ranks = [json.loads((work / f"rank-{r}.json").read_text()) for r in (0, 1)]

    # Each batch is split: the two processes fed the model disjoint rows, together every
    # training row once per epoch, about half each.
    encoded, _ = encode_rows(PreTrainedTokenizerFast.from_pretrained(str(home / "models" / "tiny")), train)
    fed = [Counter(r["fed"]) for r in ranks]
    assert not set(fed[0]) & set(fed[1])
    assert fed[0] + fed[1] == Counter({row_digest(e): settings.epochs for e in encoded})
    assert abs(fed[0].total() - fed[1].total()) <= single.history[-1]["steps"]  # at most a row per step

    # Gradients are averaged: both processes end with the same weights ...
    weights = [torch.load(work / f"rank-{r}.pt") for r in (0, 1)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    # ... and with those one process reaches on the whole batches (float summation order aside).
    history = json.loads((work / "out-0" / "history.json").read_text())
    assert history["processes"] == 2 and history["best_epoch"] == single.best_epoch
    assert [e["steps"] for e in history["history"]] == [e["steps"] for e in single.history]
    one, two = load_file(tmp_path / "single/best/model.safetensors"), load_file(work / "out-0/best/model.safetensors")
    moved = _max_abs_diff(one, load_file(home / "models/tiny/model.safetensors"))
    assert moved > 1e-3 and _max_abs_diff(one, two) < 0.01 * moved
    for a, b in zip(history["history"], single.history, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-3)
        assert a["calibration_nll"] == pytest.approx(b["calibration_nll"], rel=1e-3)

    # The main process alone wrote weights, history and checkpoint, and alone got the callbacks.
    assert (work / "out-0/best").is_dir() and (work / "ckpt-0/state.pt").is_file()
    assert not (work / "out-1").exists() and not (work / "ckpt-1").exists()
    assert [e["epoch"] for e in ranks[0]["epochs"]] == list(range(1, settings.epochs + 1))
    assert ranks[1]["epochs"] == []
