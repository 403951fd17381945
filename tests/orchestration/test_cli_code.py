"""`kernelcast train code`: the code-reading LLM's job from the command line. Its help says what
each command does; a host run's OUT folder comes into a committed run folder (`--job`); a missing folder, a missing warehouse, a run of another dataset
version or a forecast of a pair the job lacks is one line with exit code 2 and writes nothing."""

from __future__ import annotations

import json
import random
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from models.training.gpu_host.job import write_job
from orchestration.cli import app

runner = CliRunner()
DATASET = "ds-code-cli"


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _one_line_error(res) -> str:
    lines = [line for line in res.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, res.output
    assert lines[0].startswith("error:"), res.output
    return lines[0]


def _code_job(folder: Path) -> list[dict]:
    """A job of kind "code" of 12 softmax pairs (8 fit, 2 calibration, 2 eval); its pairs."""
    rng = random.Random(0)
    kernels = [{"kernel_id": "ref", "task": "softmax", "prompt_source": "def ref_kernel(x): return x.softmax(-1)\n",
                "features": None}]
    pairs = []
    for i in range(12):
        kernels.append({"kernel_id": f"k{i}", "task": "softmax", "prompt_source": f"BLOCK_N = {16 << i % 4}\n",
                        "features": None})
        pairs.append({"pair_id": f"p{i}", "task": "softmax", "hardware_id": "h", "anchor_kernel_id": "ref",
                      "candidate_kernel_id": f"k{i}", "true_bin": rng.randint(1, 8), "features": [float(i), 1.0],
                      "roles": ["fit"] if i < 8 else ["calibration"] if i < 10 else ["eval"]})
    write_job(folder, "code", {"dataset_version": DATASET, "held_out_task": None, "variants": None,
                               "tasks": {"softmax": {"description": "Row softmax.", "benchmark_cases": [{"M": 8, "N": 8}]}},
                               "hardware": {"h": {"device_name": "NVIDIA H200"}}, "feature_names": ["a", "b"]},
               kernels, pairs)
    return pairs


def _host_run(folder: Path, pairs: list[dict], dataset_version: str = DATASET, extra_pair: bool = False) -> int:
    """What llm_code leaves in its OUT folder for one head variant (forecasts.parquet of every
    pair in each of its roles, metrics.json), written by hand; the number of forecasts."""
    rows = [{"variant": "code-head", "role": role, "readout": "head", "repeat": 0, "pair_id": p["pair_id"],
             **{f"p{b}": 0.125 for b in range(1, 9)}}
            for p in pairs + ([{"pair_id": "not-in-job", "roles": ["eval"]}] if extra_pair else []) for role in p["roles"]]
    folder.mkdir(parents=True)
    pl.DataFrame(rows).write_parquet(folder / "forecasts.parquet")
    (folder / "metrics.json").write_text(json.dumps({"dataset_version": dataset_version, "variants": {
        "code-head": {"kind": "head", "setting": "in_distribution", "best_epoch": 1, "history": [{"epoch": 1}]}}}))
    return len(rows)


def test_the_code_group_and_each_command_say_what_they_do():
    res = runner.invoke(app, ["train", "--help"], terminal_width=100)
    assert res.exit_code == 0 and "code-reading LLM's job" in res.output
    res = runner.invoke(app, ["train", "code", "--help"], terminal_width=100)
    assert res.exit_code == 0, res.output
    listed = " ".join(res.output.split())
    for command, summary in (("build-bundle", "Write the code-reading LLM's job of a dataset version"),
                             ("embed-head", "Fit the boosted code-embed variants")):
        assert summary in listed, (command, res.output)
        own = runner.invoke(app, ["train", "code", command, "--help"], terminal_width=100)
        assert own.exit_code == 0 and summary in " ".join(own.output.split()), own.output
    assert "--job" in runner.invoke(app, ["train", "code", "embed-head", "--help"]).output
    import typer

    train = typer.main.get_command(app).commands["train"]
    assert set(train.commands["code"].commands) == {"build-bundle", "embed-head"}
    assert "ingest" in train.commands and "collect" not in train.commands


def test_one_ingest_brings_home_both_kinds_of_host_run():
    res = runner.invoke(app, ["train", "--help"], terminal_width=100)
    listed = " ".join(res.output.split())
    assert res.exit_code == 0 and "Bring what a GPU host sent back into the committed run folder" in listed
    own = runner.invoke(app, ["train", "ingest", "--help"], terminal_width=100)
    assert own.exit_code == 0 and "--job" in own.output and "--register" in own.output


def test_register_of_anything_but_a_code_run_folder_is_refused_before_writing(tmp_path):
    pairs = _code_job(tmp_path / "job")
    _host_run(tmp_path / "out", pairs)
    (tmp_path / "extra.tar").write_bytes(b"")
    into = tmp_path / "committed"
    res = runner.invoke(app, ["train", "ingest", str(tmp_path / "out"), str(tmp_path / "extra.tar"),
                              "--job", str(tmp_path / "job"), "--into", str(into), "--register"])
    assert res.exit_code == 2 and "give a code run's OUT folder alone" in _one_line_error(res)
    assert not into.exists()


def test_ingest_of_a_missing_folder_is_one_line_and_writes_nothing(tmp_path):
    _code_job(tmp_path / "job")
    into = tmp_path / "committed"
    res = runner.invoke(app, ["train", "ingest", str(tmp_path / "no-such-out"), "--job", str(tmp_path / "job"),
                              "--into", str(into)])
    assert res.exit_code == 2
    assert "no-such-out" in _one_line_error(res) and "does not exist" in res.output
    assert not into.exists()


def test_ingest_brings_a_host_run_into_the_committed_folder(tmp_path):
    pairs = _code_job(tmp_path / "job")
    n = _host_run(tmp_path / "out", pairs)
    into = tmp_path / "committed"
    res = runner.invoke(app, ["train", "ingest", str(tmp_path / "out"), "--job", str(tmp_path / "job"),
                              "--into", str(into)])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0] == f"{n} forecasts of code-head of {DATASET} -> {into}"
    frame = pl.read_parquet(into / "forecasts.parquet")
    assert frame.height == n and set(frame["variant"]) == {"code-head"} and (frame["dataset_version"] == DATASET).all()
    training = json.loads((into / "training.json").read_text())
    assert training["variants"]["code-head"]["dataset_version"] == DATASET


def test_ingest_refuses_a_run_that_does_not_match_the_job_in_one_line(tmp_path):
    pairs = _code_job(tmp_path / "job")
    _host_run(tmp_path / "other", pairs, dataset_version="ds-other")
    _host_run(tmp_path / "extra", pairs, extra_pair=True)
    into = tmp_path / "committed"
    res = runner.invoke(app, ["train", "ingest", str(tmp_path / "other"), "--job", str(tmp_path / "job"),
                              "--into", str(into)])
    assert res.exit_code == 2 and "trained on ds-other" in _one_line_error(res)
    res = runner.invoke(app, ["train", "ingest", str(tmp_path / "extra"), "--job", str(tmp_path / "job"),
                              "--into", str(into)])
    assert res.exit_code == 2 and "pairs the job does not hold (first: not-in-job)" in _one_line_error(res)
    assert not into.exists()


def test_embed_head_of_a_run_of_another_dataset_version_is_one_line(tmp_path):
    pairs = _code_job(tmp_path / "job")
    _host_run(tmp_path / "out", pairs, dataset_version="ds-other")
    res = runner.invoke(app, ["train", "code", "embed-head", str(tmp_path / "out"), "--job", str(tmp_path / "job"),
                              "--base-model", "tiny"])
    assert res.exit_code == 2
    assert f"not a host run of the job's dataset version {DATASET}" in _one_line_error(res)


def test_build_bundle_without_a_warehouse_is_one_line(tmp_path, home):
    res = runner.invoke(app, ["train", "code", "build-bundle", "--out", str(tmp_path / "bundle")])
    assert res.exit_code == 2
    assert f"no warehouse at {home / 'warehouse.duckdb'}" in _one_line_error(res)
    res = runner.invoke(app, ["train", "code", "build-bundle", "--out", str(tmp_path / "bundle"),
                              "--warehouse", str(tmp_path / "gone.duckdb")])
    assert res.exit_code == 2 and "gone.duckdb" in _one_line_error(res)
    assert not (tmp_path / "bundle").exists() and not home.exists()
