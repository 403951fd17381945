"""The code-reading LLM surrogate's host run on the CPU with the tiny model: a job of kind "code"
in the job format, the leakage check, the heads and the LoRA run within a time budget, what comes
back, and a second run resumed from it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from models.training.gpu_host.job import (
    JOB_FILE,
    PAIRS_FILE,
    JobError,
    leaking_pairs,
    read_job,
    read_jsonl_gz,
    write_job,
    write_jsonl_gz,
)

ROLE_PLAN = (["fit"] * 20 + ["calibration"] * 6 + ["eval"] * 6 + ["external"] * 4)


def toy_bundle(folder: Path, n_features: int = 3) -> None:
    """Two tasks; softmax pairs in the in-distribution roles, rms_norm the held-out task."""
    rng = random.Random(0)
    kernels = [{"kernel_id": f"ref-{t}", "task": t, "parent_kernel_id": None, "features": None,
                "prompt_source": f"def ref_kernel(x): return x.{t}(-1)\n"} for t in ("softmax", "rms_norm")]
    pairs = []
    for i, role in enumerate(ROLE_PLAN + ["held_out_eval"] * 6):
        task = "rms_norm" if role == "held_out_eval" else "softmax"
        b = rng.randint(1, 8)
        kernels.append({"kernel_id": f"k{i}", "task": task, "parent_kernel_id": f"ref-{task}",
                        "features": {"n_regs": 32 + b, "n_spills": 0, "shared_bytes": 0,
                                     "n_kernels": 1, "n_launches": 1},
                        "prompt_source": f"BLOCK_N = {2 ** (b + 3)}\n"})
        roles = [role]
        if role == "fit":
            roles.append("held_out_fit")
        elif role == "calibration":
            roles.append("held_out_calibration")
        pairs.append({"pair_id": f"p{i:02d}", "task": task, "hardware_id": "h", "anchor_kernel_id": f"ref-{task}",
                      "candidate_kernel_id": f"k{i}", "true_bin": b, "roles": roles,
                      "features": [float(b), rng.random(), float("nan")][:n_features],
                      "speedup": 2.0 ** (-2.75 + 0.75 * b)})
    tasks = {t: {"description": f"Row {t}.", "benchmark_cases": [{"M": 8, "N": 8}]} for t in ("softmax", "rms_norm")}
    write_job(folder, "code", {"dataset_version": "ds-toy", "held_out_task": "rms_norm", "tasks": tasks,
                               "hardware": {"h": {"device_name": "NVIDIA H200"}},
                               "feature_names": ["a", "b", "c"][:n_features]}, kernels, pairs)


def test_job_reads_back_and_a_leak_is_found(tmp_path):
    toy_bundle(tmp_path / "b")
    meta, kernels, pairs = read_job(tmp_path / "b", "code")
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


def test_a_job_that_is_not_one_or_of_the_other_kind_is_one_line(tmp_path, capsys):
    with pytest.raises(JobError, match="not a training job"):
        read_job(tmp_path)
    (tmp_path / JOB_FILE).write_text(json.dumps({"format": 99}))
    with pytest.raises(JobError, match="format 99"):
        read_job(tmp_path)
    toy_bundle(tmp_path / "b")
    with pytest.raises(JobError, match="run by models.training.gpu_host.llm_code, not models.training.gpu_host.gpu_job"):
        read_job(tmp_path / "b", "variants")
    # gpu_job refuses it before it starts anything
    from models.training.gpu_host.gpu_job import main

    assert main(["run", "--job", str(tmp_path / "b"), "--run", str(tmp_path / "run"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "a job of kind 'code'" in err and len(err.strip().splitlines()) == 1


def _train(tmp_path: Path, out: str, *extra: str) -> int:
    from models.training.gpu_host.llm_code import main

    return main(["train", "--job", str(tmp_path / "b"), "--out", str(tmp_path / out), "--work",
                 str(tmp_path / f"work-{out}"), "--base-model", "tiny", "--time-budget-s", "400",
                 "--layers", "1,-1", "--lora-epochs", "2", "--tokens-per-batch", "8192",
                 "--head-grid", "2", "--head-epochs", "30", "--grpo-steps", "0", *extra])


def test_train_on_cpu_forecasts_every_role_and_resumes(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    toy_bundle(tmp_path / "b")
    assert _train(tmp_path, "out1") == 0
    out = tmp_path / "out1"
    names = sorted(p.name for p in out.iterdir())
    assert names[:5] == ["embeddings.parquet", "forecasts.parquet", "heads.pt", "lora-best.tar", "lora-state.pt.0"]
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
    assert metrics["seconds"]["total"] <= 400 and metrics["skipped"]["grpo"] == "not asked for (--grpo-steps 0)"
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
    # The prefill's principal coordinates per setting: every pair the setting fits or scores.
    emb = pq.read_table(out / "embeddings.parquet").to_pylist()
    per = {s: [r for r in emb if r["setting"] == s] for s in ("in_distribution", "held_out_task")}
    assert len(per["in_distribution"]) == 36 and len(per["held_out_task"]) == 32
    assert all(len(r["zero_shot"]) == 8 and 1 <= len(r["pc"]) <= 48 for r in emb)
    # The axes travel with the coordinates, so a pair the host never saw lands on the same ones.
    from models.training.gpu_host.llm_code import AXES_KEY, read_axes

    axes = read_axes(pq.read_schema(out / "embeddings.parquet").metadata[AXES_KEY])
    assert set(axes) == {"in_distribution", "held_out_task"}
    for setting, a in axes.items():
        k = len(per[setting][0]["pc"])
        assert a["axes"].shape == (a["mean"].shape[0], k) and a["scale"].shape == a["mean"].shape
        assert (a["scale"] > 0).all()


def test_the_embedding_head_is_fitted_here_and_added_beside_the_host_variants(tmp_path, monkeypatch):
    from pipelines.surrogates.code_embed import add_embed_variants

    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    toy_bundle(tmp_path / "b")
    assert _train(tmp_path, "out", "--lora-epochs", "0") == 0
    out = tmp_path / "out"
    before = pq.read_table(out / "forecasts.parquet").to_pylist()
    summary = add_embed_variants(out, tmp_path / "b")
    assert summary["variants"] == ["code-embed", "code-embed-held-out"]
    ablation = summary["ablation"]["code-embed"]
    assert len(ablation) == 3 and {"features", "llm"} < set(ablation)
    grid = json.loads((out / "metrics.json").read_text())["variants"]["code-embed"]["grid"]
    chosen = min(grid, key=lambda g: g["calibration_brier"])  # the calibration role alone decides
    assert f"chosen (k={chosen['components']}, {'+'.join(chosen['parts'])})" in ablation
    rows = pq.read_table(out / "forecasts.parquet").to_pylist()
    new = [r for r in rows if r["variant"].startswith("code-embed")]
    assert len(rows) == len(before) + len(new)
    count = {}
    for r in new:
        count[(r["variant"], r["role"])] = count.get((r["variant"], r["role"]), 0) + 1
        assert abs(sum(r[f"p{i}"] for i in range(1, 9)) - 1) < 1e-6
    assert count == {("code-embed", "calibration"): 6, ("code-embed", "eval"): 6, ("code-embed", "external"): 4,
                     ("code-embed-held-out", "held_out_calibration"): 6, ("code-embed-held-out", "held_out_eval"): 6}
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["variants"]["code-embed"]["kind"] == "embed_head"
    record = metrics["variants"]["code-embed"]
    assert record["width"] == 3 + min(record["components"], len(emb_pc(out))) + 8 * ("zero_shot" in record["parts"])
    # Again: the variants are replaced, not added twice.
    add_embed_variants(out, tmp_path / "b")
    assert len(pq.read_table(out / "forecasts.parquet")) == len(rows)


def emb_pc(out: Path) -> list[float]:
    return pq.read_table(out / "embeddings.parquet").to_pylist()[0]["pc"]


def test_an_embedding_head_without_embeddings_is_one_line(tmp_path, monkeypatch):
    from pipelines.surrogates.code_embed import add_embed_variants

    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    toy_bundle(tmp_path / "b")
    assert _train(tmp_path, "out", "--lora-epochs", "0") == 0
    # Damaged axes in the metadata: one line, and nothing of the results folder changes.
    from models.training.gpu_host.llm_code import AXES_KEY

    path = tmp_path / "out" / "embeddings.parquet"
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({AXES_KEY: b"bm90IGEgemlw"}), path)
    before = {f.name: f.read_bytes() for f in (tmp_path / "out").iterdir()}
    with pytest.raises(JobError, match="principal axes are unreadable"):
        add_embed_variants(tmp_path / "out", tmp_path / "b")
    assert {f.name: f.read_bytes() for f in (tmp_path / "out").iterdir()} == before
    (tmp_path / "out" / "embeddings.parquet").unlink()
    with pytest.raises(JobError, match="no embeddings.parquet"):
        add_embed_variants(tmp_path / "out", tmp_path / "b")
    (tmp_path / "out" / "forecasts.parquet").unlink()
    with pytest.raises(JobError, match="no forecasts.parquet"):
        add_embed_variants(tmp_path / "out", tmp_path / "b")


def test_a_leaking_bundle_is_refused_before_training(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    toy_bundle(tmp_path / "b")
    table = read_jsonl_gz(tmp_path / "b" / PAIRS_FILE)
    table[26]["roles"].append("fit")  # an eval pair in training
    write_jsonl_gz(tmp_path / "b" / PAIRS_FILE, table)
    assert _train(tmp_path, "out") == 2
    assert "touch a scored split's lineage" in capsys.readouterr().err
    assert not (tmp_path / "out" / "forecasts.parquet").exists()


def _frame(pairs: list[dict], role: str):
    import polars as pl

    rows = [{k: p[k] for k in ("pair_id", "task", "hardware_id", "anchor_kernel_id", "candidate_kernel_id", "true_bin")}
            | {"speedup": 2.0 ** (p["true_bin"] - 4.5), "pair_type": "reference", "split": "eval" if role in
               ("eval", "external", "held_out_eval") else "train"} for p in pairs if role in p["roles"]]
    return pl.DataFrame(rows)


def test_the_bundle_build_refuses_a_scored_lineage_in_training():
    """pipelines.surrogates.code_bundle.check_no_leakage on the roles of a toy version: clean, then
    with an eval candidate's child in fit, then with an external kernel's parent in held-out fit."""
    import polars as pl

    from pipelines.surrogates.code_bundle import check_no_leakage
    from pipelines.surrogates.roles import Roles

    pairs = [{"pair_id": f"p{i}", "task": "softmax", "hardware_id": "h", "anchor_kernel_id": "ref",
              "candidate_kernel_id": f"k{i}", "true_bin": 1 + i % 8,
              "roles": ["fit", "held_out_fit"] if i < 8 else ["calibration", "held_out_calibration"] if i < 10
              else ["eval"] if i < 12 else ["external"]} for i in range(14)]
    lineage = pl.DataFrame({"kernel_id": ["ref"] + [f"k{i}" for i in range(14)],
                            "parent_kernel_id": [None] + ["ref"] * 14,
                            "generator": ["reference"] + ["kernelcast-space"] * 12 + ["rewrite:unroll"] * 2})
    f = {r: _frame(pairs, r) for r in ("fit", "calibration", "eval", "external")}
    roles = Roles(f["fit"], f["calibration"], f["eval"], f["fit"], f["calibration"], f["eval"].head(0), None, f["external"])
    check_no_leakage(roles, lineage)
    child_of_eval = lineage.with_columns(pl.when(pl.col("kernel_id") == "k3").then(pl.lit("k10"))
                                         .otherwise(pl.col("parent_kernel_id")).alias("parent_kernel_id"))
    with pytest.raises(ValueError, match="in distribution: 1 training pairs leak"):
        check_no_leakage(roles, child_of_eval)
    held = Roles(f["fit"].head(0), f["calibration"].head(0), f["eval"].head(0), f["fit"], f["calibration"],
                 f["eval"], "gdn", f["external"])
    parent_of_external = lineage.with_columns(pl.when(pl.col("kernel_id") == "k12").then(pl.lit("k5"))
                                              .otherwise(pl.col("parent_kernel_id")).alias("parent_kernel_id"))
    with pytest.raises(ValueError, match="held-out task: 1 training pairs leak"):
        check_no_leakage(held, parent_of_external)


def _host_output(folder: Path, bundle: Path) -> None:
    """What a host run returns, written (not trained): two head variants and the boosted one
    fitted back here (its own readout), each role it forecasts."""
    meta, _, pairs = read_job(bundle)
    rng = random.Random(1)
    rows = []
    plan = {"code-head": ("calibration", "eval", "external"), "code-head-held-out": ("held_out_calibration", "held_out_eval"),
            "code-embed": ("calibration", "eval", "external")}
    for variant, roles in plan.items():
        for p in pairs:
            for role in roles:
                if role in p["roles"]:
                    w = [rng.random() + (3.0 if b == p["true_bin"] else 0.0) for b in range(1, 9)]
                    rows.append({"variant": variant, "role": role, "pair_id": p["pair_id"],
                                 "readout": "embed_head" if variant == "code-embed" else "head",
                                 "repeat": 0, **{f"p{b}": w[b - 1] / sum(w) for b in range(1, 9)}})
    folder.mkdir()
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(rows), folder / "forecasts.parquet")
    variants = {v: {"kind": "embed_head" if v == "code-embed" else "head", "setting": "held_out_task" if "held-out" in v else "in_distribution",
                    "features": False, "style": "full", "best_epoch": 3, "fit_pairs": 20, "calibration_pairs": 6,
                    "settings": {"hidden": 256}, "history": [{"epoch": e, "calibration_nll": 2.0 - e / 10} for e in (1, 2, 3)]}
                for v in plan}
    # A LoRA run that has not finished an epoch: a record, no forecasts (not ingested).
    variants["code-lora"] = {"kind": "lora", "setting": "in_distribution", "best_epoch": 0, "history": []}
    (folder / "metrics.json").write_text(json.dumps({"dataset_version": meta["dataset_version"], "variants": variants}))


def test_ingest_commits_registers_and_the_report_lists_every_split(tmp_path, monkeypatch):
    import mlflow
    import polars as pl

    from pipelines.forecasting.embed import log_embed_head_model
    from pipelines.forecasting.registered import registered_forecasts
    from pipelines.surrogates.committed import calibrated_variants
    from pipelines.surrogates.registration import register_variants
    from pipelines.surrogates.remote_results import ingest
    from pipelines.surrogates.roles import Roles
    from warehouse.datasets import write_dataset
    from warehouse.db import connect

    toy_bundle(tmp_path / "b")
    _host_output(tmp_path / "out", tmp_path / "b")
    data_dir = tmp_path / "data"
    run_dir = data_dir / "training" / "h200" / "run"
    run_dir.mkdir(parents=True)
    # An earlier variant of the committed run stays beside the ingested ones.
    pl.DataFrame({"variant": ["old"], "role": ["eval"], "readout": ["logprob"], "repeat": [0], "pair_id": ["x"],
                  "hardware_id": ["h"], "anchor_kernel_id": ["ref-softmax"], "candidate_kernel_id": ["k26"],
                  "true_bin": [1], **{f"p{i}": [0.125] for i in range(1, 9)}}).write_parquet(run_dir / "forecasts.parquet")
    (run_dir / "training.json").write_text(json.dumps({"dataset_version": "ds-old", "variants": {"old": {"settings": {}}}}))
    summary = ingest(tmp_path / "out", tmp_path / "b", run_dir)
    assert summary["variants"] == ["code-embed", "code-head", "code-head-held-out"] and summary["adapters"] == []
    training = json.loads((run_dir / "training.json").read_text())
    assert set(training["variants"]) == {"old", "code-embed", "code-head", "code-head-held-out"}
    assert training["variants"]["code-embed"]["settings"]["finetune"] == "embed_head"
    assert training["dataset_version"] == "ds-old" and training["variants"]["code-head"]["dataset_version"] == "ds-toy"
    frame = pl.read_parquet(run_dir / "forecasts.parquet")
    assert set(frame["variant"]) == {"old", "code-embed", "code-head", "code-head-held-out"}
    assert set(frame.filter(pl.col("variant") == "code-head")["role"]) == {"calibration", "eval"}  # external: eval role

    _, _, pairs = read_job(tmp_path / "b")
    f = {r: _frame(pairs, r) for r in ("fit", "calibration", "eval", "external", "held_out_fit",
                                       "held_out_calibration", "held_out_eval")}
    roles = Roles(f["fit"], f["calibration"], f["eval"], f["held_out_fit"], f["held_out_calibration"],
                  f["held_out_eval"], "rms_norm", f["external"])
    got = {v.name: v for v in calibrated_variants(run_dir, pl.concat([f["eval"], f["external"]]), f["held_out_eval"])}
    assert got["code-head"].forecasts.height == 10 and got["code-head-held-out"].forecasts.height == 6
    assert got["code-head"].calibrator.n_fit == 6
    assert got["code-embed"].forecasts.height == 10  # the boosted head's readout is a distribution too

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    with connect(tmp_path / "wh.duckdb") as con:
        all_pairs = pl.concat([f[r] for r in ("fit", "calibration", "eval", "external", "held_out_eval")]).unique("pair_id")
        write_dataset(con, "ds-toy", "d", {}, [], all_pairs)
        versions = register_variants(con, uri, data_dir, run_dir, tmp_path / "out", summary["variants"],
                                     head_logger=log_embed_head_model)
        assert register_variants(con, uri, data_dir, run_dir, tmp_path / "out", summary["variants"],
                                 head_logger=log_embed_head_model) == versions  # re-used
        from warehouse.lineage import lineage_of

        assert lineage_of(con, "kernelcast-surrogate", versions["code-head"])["dataset_version"] == "ds-toy"
    # its training run says what it did: the fit's size, the calibration's size and scores
    client = mlflow.MlflowClient(uri)
    run = client.get_run(client.get_model_version("kernelcast-surrogate", str(versions["code-head"])).run_id)
    fit_n = int((pl.read_parquet(run_dir / "code_training_pairs.parquet")["role"] == "fit").sum())
    assert run.data.metrics["fit_pairs"] == fit_n > 0 and run.data.metrics["calibration_pairs"] == 6
    assert run.data.metrics["calibration_brier_after"] <= run.data.metrics["calibration_brier_before"] + 1e-9
    assert {"calibration_nll_before", "calibration_nll_after"} <= set(run.data.metrics)
    assert {"measurement_ids.txt", "calibration_measurement_ids.txt"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
    records = {k: {"kernel_id": k, "task": "softmax", "source": "x"} for k in
               set(all_pairs["anchor_kernel_id"].to_list()) | set(all_pairs["candidate_kernel_id"].to_list())}
    rows, listed, jobs = registered_forecasts(uri, "ds-toy", roles, records, tmp_path / "home", run_dir,
                                              lambda pairs, style: [], None)
    ref = f"models:/kernelcast-surrogate/{versions['code-head']}"
    splits = {(x.model_ref, x.split) for x in listed}
    assert {(ref, "in_distribution"), (ref, "external"),
            (f"models:/kernelcast-surrogate-held-out/{versions['code-head-held-out']}", "held_out_task")} <= splits
    assert not jobs  # answered from the committed forecasts, nothing planned for the LLM steps
    mine = rows.filter(pl.col("model_ref") == ref)
    assert set(mine["pair_id"]) == set(f["eval"]["pair_id"]) | set(f["external"]["pair_id"])


def test_code_lora_is_committed_without_its_adapter(tmp_path, monkeypatch):
    """code-lora's forecasts are committed, its adapter is not (an earlier run's goes): the version
    answers the pairs of its run from the committed folder and refuses, in one line, where none is."""
    import mlflow
    import polars as pl
    import pyarrow as pa

    from models.registry.versions import version_info
    from pipelines.forecasting import load_forecaster
    from pipelines.forecasting.committed import CommittedForecaster
    from pipelines.forecasting.embed import log_embed_head_model
    from pipelines.surrogates.registration import COMMITTED_ONLY, WEIGHTS_TAG, register_variants
    from pipelines.surrogates.remote_results import ingest
    from warehouse.datasets import write_dataset
    from warehouse.db import connect

    toy_bundle(tmp_path / "b")
    _host_output(tmp_path / "out", tmp_path / "b")
    _, _, pairs = read_job(tmp_path / "b")
    table = pq.read_table(tmp_path / "out" / "forecasts.parquet")
    lora = [{**r, "variant": "code-lora", "readout": "logprob"} for r in table.to_pylist() if r["variant"] == "code-head"]
    pq.write_table(pa.Table.from_pylist(table.to_pylist() + lora), tmp_path / "out" / "forecasts.parquet")
    (tmp_path / "out" / "lora-best.tar").write_bytes(b"")  # present, not asked for
    run_dir = tmp_path / "data" / "run"
    stale = run_dir / "adapters" / "code-lora"
    stale.mkdir(parents=True)
    (stale / "adapter_model.safetensors").write_bytes(b"an earlier run's")
    summary = ingest(tmp_path / "out", tmp_path / "b", run_dir)
    assert "code-lora" in summary["variants"] and summary["adapters"] == [] and not stale.exists()

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    f = {r: _frame(pairs, r) for r in ("fit", "calibration", "eval", "external")}
    with connect(tmp_path / "wh.duckdb") as con:
        write_dataset(con, "ds-toy", "d", {}, [], pl.concat(list(f.values())).unique("pair_id"))
        versions = register_variants(con, uri, tmp_path / "data", run_dir, None, ["code-lora"], "tiny",
                                     head_logger=log_embed_head_model)
    assert version_info(uri, versions["code-lora"])["tags"][WEIGHTS_TAG] == COMMITTED_ONLY
    ref = f"models:/kernelcast-surrogate/{versions['code-lora']}"
    held = load_forecaster(ref, tracking_uri=uri, home=tmp_path / "home", committed_dir=run_dir)
    assert isinstance(held, CommittedForecaster) and held.forecast_pairs(f["eval"], {}).shape == (6, 8)
    with pytest.raises(ValueError, match="no weights to run here") as e:
        load_forecaster(ref, tracking_uri=uri, home=tmp_path / "home")
    assert len(str(e.value).splitlines()) == 1


def test_fast_encode_gives_encode_rows_ids(tmp_path):
    from transformers import PreTrainedTokenizerFast

    from models.base_model import resolve_base_model
    from models.training.gpu_host.job import training_rows
    from models.training.gpu_host.llm_code import fast_encode
    from models.training.supervised import encode_rows

    toy_bundle(tmp_path / "b")
    meta, kernels, pairs = read_job(tmp_path / "b")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(resolve_base_model("tiny", tmp_path / "home")))
    for style in ("full", "compact+features"):
        rows = training_rows(meta, kernels, pairs, style)
        assert fast_encode(tokenizer, rows, chunk=7) == encode_rows(tokenizer, rows)


@pytest.mark.slow
def test_grpo_runs_on_top_of_the_lora_variant_when_time_is_left(tmp_path, monkeypatch):
    """(c) on the CPU: one GRPO step after the format warm-up, on code-lora's best epoch, then the
    same readout on the scored roles; a run without time for it records why."""
    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    toy_bundle(tmp_path / "b")
    assert _train(tmp_path, "out", "--lora-epochs", "1", "--head-grid", "1", "--head-epochs", "5",
                  "--grpo-steps", "1", "--grpo-warmup-steps", "2", "--time-budget-s", "500") == 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert "grpo" not in metrics["skipped"], metrics["skipped"]
    grpo = metrics["variants"]["code-lora-grpo"]
    assert metrics["seconds"]["total"] <= 500
    assert grpo["finished"] and grpo["steps"] == 1 and grpo["from"] == "code-lora"
    rows = [r for r in pq.read_table(tmp_path / "out" / "forecasts.parquet").to_pylist() if r["variant"] == "code-lora-grpo"]
    assert sorted({r["role"] for r in rows}) == ["calibration", "eval", "external"] and len(rows) == 16
    assert all(abs(sum(r[f"p{i}"] for i in range(1, 9)) - 1) < 1e-6 for r in rows)
