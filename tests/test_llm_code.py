"""The code-reading LLM surrogate's host run on the CPU with the tiny model: a bundle in the
bundle format, the leakage check, the heads and the LoRA run within a time budget, what comes
back, and a second run resumed from it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from models.remote.bundle import (
    BUNDLE_FORMAT,
    KERNELS_FILE,
    META_FILE,
    PAIRS_FILE,
    BundleError,
    kernel_schema,
    leaking_pairs,
    pair_schema,
    read_bundle,
    write_parquet,
)

ROLE_PLAN = (["fit"] * 20 + ["calibration"] * 6 + ["eval"] * 6 + ["external"] * 4)


def toy_bundle(folder: Path, n_features: int = 3) -> None:
    """Two tasks; softmax pairs in the in-distribution roles, rms_norm the held-out task."""
    rng = random.Random(0)
    kernels = [{"kernel_id": f"ref-{t}", "task": t, "parent_kernel_id": None, "features_json": None,
                "prompt_source": f"def ref_kernel(x): return x.{t}(-1)\n"} for t in ("softmax", "rms_norm")]
    pairs = []
    for i, role in enumerate(ROLE_PLAN + ["held_out_eval"] * 6):
        task = "rms_norm" if role == "held_out_eval" else "softmax"
        b = rng.randint(1, 8)
        kernels.append({"kernel_id": f"k{i}", "task": task, "parent_kernel_id": f"ref-{task}",
                        "features_json": json.dumps({"n_regs": 32 + b, "n_spills": 0, "shared_bytes": 0,
                                                     "n_kernels": 1, "n_launches": 1}),
                        "prompt_source": f"BLOCK_N = {2 ** (b + 3)}\n"})
        roles = [role]
        if role == "fit":
            roles.append("held_out_fit")
        elif role == "calibration":
            roles.append("held_out_calibration")
        pairs.append({"pair_id": f"p{i:02d}", "task": task, "hardware_id": "h", "anchor_kernel_id": f"ref-{task}",
                      "candidate_kernel_id": f"k{i}", "true_bin": b, "roles": roles,
                      "features": [float(b), rng.random(), float("nan")][:n_features]})
    folder.mkdir(parents=True)
    write_parquet(folder / PAIRS_FILE, pairs, pair_schema())
    write_parquet(folder / KERNELS_FILE, kernels, kernel_schema())
    tasks = {t: {"description": f"Row {t}.", "benchmark_cases": [{"M": 8, "N": 8}]} for t in ("softmax", "rms_norm")}
    (folder / META_FILE).write_text(json.dumps({"format": BUNDLE_FORMAT, "dataset_version": "ds-toy",
                                                "held_out_task": "rms_norm", "tasks": tasks,
                                                "hardware": {"h": {"device_name": "NVIDIA H200"}},
                                                "feature_names": ["a", "b", "c"][:n_features]}))


def test_bundle_reads_back_and_a_leak_is_found(tmp_path):
    toy_bundle(tmp_path / "b")
    meta, kernels, pairs = read_bundle(tmp_path / "b")
    assert meta["dataset_version"] == "ds-toy" and len(pairs) == 42 and kernels["k0"]["features"]["n_regs"] >= 33
    assert leaking_pairs(pairs, kernels, "rms_norm") == []
    # A fit candidate that is the child of an eval candidate: its lineage reaches training.
    eval_kernel = next(p["candidate_kernel_id"] for p in pairs if p["roles"] == ["eval"])
    kernels["k0"] = {**kernels["k0"], "parent_kernel_id": eval_kernel}
    assert leaking_pairs(pairs, kernels, "rms_norm") == ["p00"]
    # A pair of the held-out task in the held-out fit role, or an eval pair also in fit.
    kernels["k0"]["parent_kernel_id"] = "ref-softmax"
    moved = [{**p, "roles": [*p["roles"], "held_out_fit"]} if p["pair_id"] == "p40" else
             {**p, "roles": [*p["roles"], "fit"]} if p["pair_id"] == "p26" else p for p in pairs]
    assert leaking_pairs(moved, kernels, "rms_norm") == ["p26", "p40"]


def test_a_bundle_that_is_not_one_is_one_line(tmp_path):
    with pytest.raises(BundleError, match="not a bundle"):
        read_bundle(tmp_path)
    (tmp_path / META_FILE).write_text(json.dumps({"format": 99}))
    with pytest.raises(BundleError, match="format 99"):
        read_bundle(tmp_path)


def _train(tmp_path: Path, out: str, *extra: str) -> int:
    from models.remote.llm_code import main

    return main(["train", "--bundle", str(tmp_path / "b"), "--out", str(tmp_path / out), "--work",
                 str(tmp_path / f"work-{out}"), "--base-model", "tiny", "--time-budget-s", "240",
                 "--layers", "1,-1", "--lora-epochs", "2", "--tokens-per-batch", "8192", *extra])


def test_train_on_cpu_forecasts_every_role_and_resumes(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    toy_bundle(tmp_path / "b")
    assert _train(tmp_path, "out1") == 0
    out = tmp_path / "out1"
    names = sorted(p.name for p in out.iterdir())
    assert names[:4] == ["forecasts.parquet", "heads.pt", "lora-best.tar", "lora-state.pt.0"]
    assert "metrics.json" in names and "train.log" in names and len(names) <= 8
    assert all(p.stat().st_size <= 16 * 2**20 for p in out.iterdir())
    rows = pq.read_table(out / "forecasts.parquet").to_pylist()
    by = {}
    for r in rows:
        by.setdefault((r["variant"], r["role"]), []).append(r)
        p = [r[f"p{i}"] for i in range(1, 9)]
        assert abs(sum(p) - 1) < 1e-6 and min(p) >= 0
    for v in ("code-head", "code-head-features", "code-lora"):
        assert {role: len(by[(v, role)]) for role in ("calibration", "eval", "external")} == \
            {"calibration": 6, "eval": 6, "external": 4}
    for v in ("code-head-held-out", "code-head-features-held-out"):
        assert len(by[(v, "held_out_eval")]) == 6 and len(by[(v, "held_out_calibration")]) == 6
        assert (v, "eval") not in by
    metrics = json.loads((out / "metrics.json").read_text())
    lora = metrics["variants"]["code-lora"]
    assert lora["finished"] and lora["epochs_run"] == 2 and 1 <= lora["best_epoch"] <= 2
    head = metrics["variants"]["code-head-features"]
    assert head["width"] == metrics["variants"]["code-head"]["width"] + 3  # the feature vector beside
    assert 1 <= head["best_epoch"] <= len(head["history"])
    saved = torch.load(out / "heads.pt", weights_only=False)
    assert set(saved) == {"code-head", "code-head-features", "code-head-held-out", "code-head-features-held-out"}
    # Again from what came back: the heads are carried over and the LoRA run resumes from its
    # checkpoint where it ended (same history, timings included: restored, not trained again).
    assert _train(tmp_path, "out2", "--resume", str(out)) == 0
    again = json.loads((tmp_path / "out2" / "metrics.json").read_text())
    assert again["variants"]["code-lora"]["history"] == lora["history"]
    assert again["variants"]["code-head"]["history"] == metrics["variants"]["code-head"]["history"]
    assert "heads carried over" in (tmp_path / "out2" / "train.log").read_text()
    assert len(pq.read_table(tmp_path / "out2" / "forecasts.parquet")) == len(rows)


def test_a_leaking_bundle_is_refused_before_training(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    toy_bundle(tmp_path / "b")
    table = pq.read_table(tmp_path / "b" / PAIRS_FILE).to_pylist()
    table[26]["roles"].append("fit")  # an eval pair in training
    write_parquet(tmp_path / "b" / PAIRS_FILE, table, pair_schema())
    assert _train(tmp_path, "out") == 2
    assert "touch a scored split's lineage" in capsys.readouterr().err
    assert not (tmp_path / "out" / "forecasts.parquet").exists()
