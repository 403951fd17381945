"""The classical forecasters without generator metadata: source-derived features, metadata
dropout, a spread per task for forecasts from the source alone, the portable twin."""

from __future__ import annotations

import json
import random

import numpy as np
import pandas as pd
import pytest
from supervised_toy import BLOCKS

from models.bins import speedup_to_bin
from models.classical import CostModel, TextModel
from models.classical.features import (
    COMPILE_FIELDS,
    METADATA_FIELDS,
    FeatureSpace,
    dropout_rows,
    has_metadata,
    kernel_features,
    pair_frame,
    scale_keys,
    source_constants,
    withhold_metadata,
    without_metadata,
)
from models.classical.portable import PortableCostModel


def _brier(p: np.ndarray, y: np.ndarray) -> float:
    return float(0.5 * ((p - np.eye(8)[y - 1]) ** 2).sum(axis=1).mean())


def toy_pairs(n: int, seed: int, bare: bool = False) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Reference anchor, candidates whose BLOCK_N decides log2 S; the knob is in the metadata and
    spelt in the code (as the generator's templates and most hand-written kernels do)."""
    rng = random.Random(seed)
    anchor = {"kernel_id": "ref", "task": "softmax", "source": "def custom_kernel(x): return x.softmax(-1)\n",
              "language": "pytorch", "generator": "reference", "algorithm": "reference", "knobs_json": "{}"}
    cands, log2s = [], []
    for i in range(n):
        b = rng.choice(BLOCKS)
        warps = rng.choice((2, 4, 8))
        log2s.append(-2.4 + 0.7 * BLOCKS.index(b) + rng.gauss(0, 0.1))
        rec = {"kernel_id": f"k{seed}-{i}", "task": "softmax", "language": "triton",
               "generator": "kernelcast-space", "algorithm": "two_pass",
               "knobs_json": json.dumps({"BLOCK_N": b, "NUM_WARPS": warps}, sort_keys=True),
               "source": f"BLOCK_N = {b}\n@triton.jit\ndef k(x):\n    tl.load(x)\n"
                         f"def custom_kernel(x):\n    k[(1,)](x, BLOCK_N=BLOCK_N, num_warps={warps})\n"}
        cands.append(without_metadata(rec) if bare else rec)
    frame = pair_frame([without_metadata(anchor) if bare else anchor] * n, cands)
    log2s = np.array(log2s)
    return frame, np.array([speedup_to_bin(2.0**v) for v in log2s]), log2s


def test_source_constants_and_new_counts_come_from_the_code_alone():
    code = "BLOCK_M = 128\nGRID: int = 66\nk[grid](x, BLOCK_N=64, num_warps=8, num_stages=3)\n" \
           "@triton.autotune(configs=[triton.Config({'BLOCK': 256}), triton.Config({'BLOCK': 1024})])\n"
    assert source_constants(code) == {"BLOCK": 1024.0, "BLOCK_M": 128.0, "BLOCK_N": 64.0, "GRID": 66.0,
                                      "num_stages": 3.0, "num_warps": 8.0}
    f = kernel_features({"task": "t", "source": "x = tl.load(p, eviction_policy='evict_first')\n"
                                               "for i in tl.range(0, n, num_stages=2):\n    pass\n"})
    assert f["src:eviction"] == 1 and f["src:tl_range"] == 1 and f["const:num_stages"] == 2.0
    names = kernel_features({"task": "t", "source": "@triton.autotune(configs=[])\n@triton.jit\ndef b_k(x):\n"
                                                    "    pass\n@triton.jit\ndef a_k(x):\n    pass\n"})["jit_names"]
    assert names == "a_k|b_k" and kernel_features({"task": "t", "source": "x = 1\n"})["jit_names"] == "none"
    # comments and docstrings say what the generator meant, not what runs: never read
    assert "const:BLOCK_N" not in kernel_features({"task": "t", "source": '"""BLOCK_N = 64"""\n# BLOCK_N = 64\n'})


def test_source_features_are_kernel_fields_and_reach_the_feature_table():
    assert COMPILE_FIELDS[:5] == ("n_regs", "n_spills", "shared_bytes", "n_kernels", "n_launches")
    assert len(set(COMPILE_FIELDS)) == len(COMPILE_FIELDS)
    frame, _, _ = toy_pairs(30, 0)
    frame["c_trace_programs_log2"] = np.linspace(5, 20, len(frame))
    frame["a_trace_programs_log2"] = 12.0
    table = FeatureSpace().fit(frame).transform(frame)
    assert {"c:trace_programs_log2", "d:trace_programs_log2", "c:const:BLOCK_N"} <= set(table.columns)


def test_the_forecast_pipeline_source_feature_names_match_the_models():
    from pipelines.forecasting.source_features import FEATURE_COLUMNS

    assert set(COMPILE_FIELDS) == set(FEATURE_COLUMNS)


def test_withholding_metadata_and_dropout_are_deterministic():
    frame, _, _ = toy_pairs(400, 0)
    mask = dropout_rows(frame, 0.5, seed=0)
    assert 150 < mask.sum() < 250 and np.array_equal(mask, dropout_rows(frame.iloc[::-1], 0.5)[::-1])
    assert not dropout_rows(frame, 0.0).any() and dropout_rows(frame, 1.0).all()
    out = withhold_metadata(frame, mask)
    assert out.loc[mask, [f"c_{f}" for f in METADATA_FIELDS]].isna().all().all()
    assert out.loc[~mask, "c_algorithm"].eq("two_pass").all()
    assert frame["c_algorithm"].eq("two_pass").all()  # a copy: the input is untouched
    assert has_metadata(out).tolist() == (~mask).tolist()
    assert set(scale_keys(out)) == {"softmax", "softmax|bare"}


@pytest.mark.parametrize("dropout", [1.0, 0.5])
def test_cost_model_forecasts_well_without_metadata(dropout):
    fit, y_fit, l_fit = toy_pairs(400, 0)
    cal, y_cal, _ = toy_pairs(120, 1)
    model = CostModel(max_iter=60, metadata_dropout=dropout).fit(fit, y_fit, l_fit)
    model.calibrate(cal, y_cal)
    bare, y_bare, _ = toy_pairs(200, 2, bare=True)
    p = model.predict_proba(bare)
    assert p.shape == (200, 8) and np.allclose(p.sum(axis=1), 1.0)
    assert _brier(p, y_bare) < 0.25  # uniform scores 0.4375
    if dropout < 1:  # with metadata still known, a spread each way
        assert {"softmax", "softmax|bare"} <= set(model.task_scales_)
    else:
        assert "c:family" not in model.space_.columns and "c:knob:BLOCK_N" not in model.space_.columns
    portable = PortableCostModel.from_cost_model(model)
    assert np.allclose(portable.predict_proba(bare), p)
    with_meta, _, _ = toy_pairs(50, 3)
    assert np.allclose(portable.predict_proba(with_meta), model.predict_proba(with_meta))


def test_text_model_needs_no_metadata_at_all():
    fit, y_fit, l_fit = toy_pairs(300, 0)
    bare, y_bare, _ = toy_pairs(120, 2, bare=True)
    model = TextModel(C=8.0).fit(fit, y_fit, l_fit)
    full, _, _ = toy_pairs(120, 2)
    assert np.allclose(model.predict_proba(bare), model.predict_proba(full))


def test_source_counts_equal_the_plain_regex_counts_on_committed_kernels():
    """kernel_features skips a count's regex when none of its literals is in the code: on a
    sample of committed kernels of every task and generator (and a file with every construct)
    the counts are the plain `re.findall` counts."""
    import re
    from pathlib import Path

    import polars as pl

    from models.classical.features import SOURCE_COUNTS, code_text, kernel_features

    files = sorted((Path(__file__).resolve().parents[2] / "data" / "measurements").rglob("kernels-*.parquet"))
    frame = pl.concat([pl.read_parquet(f, columns=["task", "generator", "source"]) for f in files], how="vertical_relaxed")
    sample = frame.filter(pl.col("source").is_not_null()).group_by("task", "generator").head(12)
    every = ("@triton.autotune\n@triton.jit\ndef k(x, y, mask=None):\n    for i in tl.static_range(4):\n"
             "        a = tl.load(x, eviction_policy='evict_last', cache_modifier='.cg').to(tl.float32)\n"
             "        tl.store(y, tl.where(a > 0, tl.exp(a), tl.math.exp2(a)), mask=mask)\n"
             "    tl.atomic_add(y, tl.sum(tl.dot(a, a)), sem='relaxed'); tl.dot_scaled(a, a, 'e4m3')\n"
             "    p = tl.make_block_ptr(x); tl.advance(p, (0, 1)); tl.program_id(1); tl.num_programs(0)\n"
             "    d = tl.make_tensor_descriptor(x); z = tanh(erf(sigmoid(rsqrt(sqrt(log2(a))))))\n"
             "f = torch.compile(g); o = torch.empty_like(x).contiguous(); torch.float8_e4m3fn; k[grid](x, y)\n")
    sources = [*sample["source"].to_list(), every]
    assert len(sources) > 100
    for source in sources:
        code = code_text(source)
        got = kernel_features({"task": "t", "source": source})
        assert {n: got[f"src:{n}"] for n in SOURCE_COUNTS} == {n: len(re.findall(p, code)) for n, p in SOURCE_COUNTS.items()}
    assert all(kernel_features({"source": every})[f"src:{n}"] > 0 for n in SOURCE_COUNTS)


def test_source_counts_equal_findall_where_matches_meet():
    """The counts found from a pattern's literal part (models.classical.features._counter) are
    findall's where a match ends inside a word, a boundary is missing, or matches touch."""
    import re

    from models.classical.features import _COUNT, SOURCE_COUNTS

    cases = ["a[idx[i]]", "x[gridy[(", "k[grid](x)k[grid](y)", "ab[ cd[(", "[x[(", "é[(", "a_1[ \n grid",
             "x[i][j]", "xtl.load(a) tl.load(b)tl.load(c)", "_mask=1 mask =2 mask= 3", "fortl.sum for i in x in y",
             "torch.zeros(torch.empty_like(x))", "tl.program_id( 1 )tl.program_id(2)", "sqrtlog2 log2(tanh(x))",
             "ntl.where tl.where(", "exp2(tl.exp(x))exp2", "é tl.load(x) ü_mask=1"]
    for code in cases:
        assert {n: _COUNT[n](code) for n in SOURCE_COUNTS} == {n: len(re.findall(p, code)) for n, p in SOURCE_COUNTS.items()}, code
