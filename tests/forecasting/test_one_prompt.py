"""A pair's prompt is the training row builder's, byte for byte, wherever it is made: the
evaluation's (pipelines.forecasting.lm_forecasts, from the warehouse too) and the forecasting
adapters' (pipelines.forecasting.language), for every style, "+features" included."""

from __future__ import annotations

import polars as pl
import pytest

from models.prompts import PROMPT_STYLES
from models.service import DEFAULT_HARDWARE
from models.training.rows import build_training_rows
from pipelines.forecasting.language import pair_prompt
from pipelines.forecasting.lm_forecasts import pair_messages, pair_requests
from pipelines.tasks import get_task, prompt_source

STYLES = [*PROMPT_STYLES, *(f"{s}+features" for s in PROMPT_STYLES)]
FEATS = {"n_regs": 40, "n_spills": 0, "shared_bytes": 4096, "n_kernels": 1, "n_launches": 2}
CANDIDATE = '''import torch

def custom_kernel(data):
    x = data[0] if isinstance(data, tuple) else data
    return torch.softmax(x.float(), dim=-1).to(x.dtype)
'''


def _training_prompts(pairs, sources, generators, features, style):
    """What the surrogate was trained on: the row builder fed the task's description and cases."""
    task = get_task("softmax")
    shown = {k: prompt_source("softmax", s, generators[k]) for k, s in sources.items()}
    tasks = {"softmax": {"description": task.description, "benchmark_cases": [dict(c) for c in task.benchmark_cases]}}
    rows = build_training_rows(pairs.with_columns(pl.lit(1).alias("true_bin")), shown, tasks, DEFAULT_HARDWARE,
                               style=style, features=features)
    return [r["prompt"] for r in rows]


@pytest.mark.parametrize("style", STYLES)
def test_every_builder_gives_the_training_prompt(style):
    """The anchor is the task reference (shown as its PyTorch body); the candidate has compile
    features, the reference none (n/a)."""
    sources = {"ref": "from pipelines.tasks.softmax import ref_kernel as custom_kernel\n", "cand": CANDIDATE}
    generators = {"ref": "reference", "cand": "handwritten"}
    pairs = pl.DataFrame({"pair_id": ["p1"], "task": ["softmax"], "hardware_id": ["h"],
                          "anchor_kernel_id": ["ref"], "candidate_kernel_id": ["cand"]})
    want = _training_prompts(pairs, sources, generators, {"cand": FEATS}, style)
    row = pairs.row(0, named=True)
    tuples = {k: (s, generators[k]) for k, s in sources.items()}
    assert [pair_messages(row, tuples, DEFAULT_HARDWARE, style, {"cand": FEATS})] == want
    records = {k: {"source": s, "generator": generators[k], "task": "softmax"} for k, s in sources.items()}
    records["cand"] = {**records["cand"], **FEATS}
    assert [pair_prompt(row, records, DEFAULT_HARDWARE, style)] == want
    text = want[0][-1]["content"]
    assert "def ref_kernel" in text  # the reference's body, not its wrapper module
    if style.endswith("+features"):
        assert "| registers per thread | n/a | 40 |" in text
        assert "Benchmark inputs" in text
    else:
        assert "registers per thread" not in text


@pytest.mark.parametrize("style", ["full", "compact+features"])
def test_the_warehouse_prompts_are_the_training_prompts(tmp_path, style):
    """pair_requests reads sources, fingerprints and, for "+features", compile features from the
    warehouse: a "+features" prompt shows the stored features, never a silent n/a."""
    from pipelines.generation.candidates import build_candidates, write_batch
    from warehouse.db import connect
    from warehouse.ingest import ingest_path
    from warehouse.kernels import add_kernel_features

    kernels = build_candidates("softmax", 3, seed=0, compile=False)
    ids = sorted(kernels["kernel_id"].to_list())[:3]
    pairs = pl.DataFrame({"pair_id": ["p1", "p2"], "task": "softmax", "hardware_id": "a-device-the-warehouse-does-not-know",
                          "anchor_kernel_id": ids[0], "candidate_kernel_id": ids[1:]})
    with connect(tmp_path / "w.duckdb") as con:
        ingest_path(con, write_batch(kernels, tmp_path / "kernels.parquet"))
        add_kernel_features(con, pl.DataFrame([{"kernel_id": ids[1], "target": "sm_90", "status": "compiled", **FEATS}]))
        got = [r["prompt"] for r in pair_requests(con, pairs, style)]
    by_id = {r["kernel_id"]: r for r in kernels.iter_rows(named=True)}
    want = _training_prompts(pairs, {k: by_id[k]["source"] for k in ids}, {k: by_id[k]["generator"] for k in ids},
                             {ids[1]: FEATS}, style)
    assert got == want
    if style.endswith("+features"):
        assert "| registers per thread | n/a | 40 |" in got[0][-1]["content"]
        assert "| registers per thread | n/a | n/a |" in got[1][-1]["content"]
