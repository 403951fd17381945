"""Language-model forecasts on curated pairs, with a tiny in-process model."""

from __future__ import annotations

import polars as pl

from models.backends.transformers_backend import TransformersAnswerer
from models.tiny import build_tiny_model
from pipelines.forecasting.lm_forecasts import forecast_pairs, sample_pairs
from pipelines.generation import registry
from pipelines.generation.reference import reference_record
from pipelines.tasks import prompt_source


def test_reference_prompt_shows_the_pytorch_body():
    ref = reference_record("softmax")
    shown = prompt_source("softmax", ref["source"], "reference")
    assert "def ref_kernel" in shown and "TASK" not in shown.split("\n")[0]
    assert prompt_source("softmax", "x = 1", "kernelcast-space") == "x = 1"


def test_forecast_pairs_rows_fit_the_forecasts_table(tmp_path):
    ref = reference_record("softmax")
    seed = registry.make_record(registry.seed_point("softmax"))
    kernels = {ref["kernel_id"]: (ref["source"], "reference"), seed["kernel_id"]: (seed["source"], "kernelcast-space")}
    pairs = pl.DataFrame({"pair_id": ["p1", "p0"], "task": ["softmax", "softmax"],
                          "anchor_kernel_id": [ref["kernel_id"]] * 2, "candidate_kernel_id": [seed["kernel_id"]] * 2})
    assert sample_pairs(pairs, 1)["pair_id"].to_list() == ["p0"]
    model = build_tiny_model(tmp_path / "tiny")
    rows = forecast_pairs(pairs, kernels, {"device_name": "NVIDIA H200", "sm_count": 132},
                          TransformersAnswerer(str(model), readout="logprob"), "base:tiny", repeats=2)
    assert rows.height == 4 and set(rows["pair_id"]) == {"p0", "p1"}
    assert rows["parse_ok"].all()
    p = rows.select([f"p{i}" for i in range(1, 9)]).to_numpy()
    assert abs(p.sum(axis=1) - 1).max() < 1e-6
    from warehouse.db import connect
    from warehouse.forecasts import write_forecasts

    with connect(tmp_path / "w.duckdb") as con:
        assert write_forecasts(con, rows) == 4
