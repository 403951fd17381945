"""Source features in the warehouse: a features file ingested, read back as columns, merged with
the compile features into what the forecasters' kernel records carry."""

from __future__ import annotations

import json

import polars as pl
import pytest
from test_warehouse_factory import kernel_row

from warehouse.db import connect, execute
from warehouse.errors import ValidationError
from warehouse.kernels import (
    add_kernel_features,
    add_kernel_source_features,
    add_kernels,
    forecast_features,
    ingest_compile_features,
    read_kernel_source_features,
)


@pytest.fixture
def con():
    c = connect(":memory:")
    add_kernels(c, pl.DataFrame([kernel_row(i) for i in range(3)]))
    yield c
    c.close()


def _file(tmp_path, kids, name="source-features.parquet"):
    rows = pl.DataFrame({
        "kernel_id": [*kids, "f" * 64], "task": ["softmax"] * (len(kids) + 1), "target": ["sm_90"] * (len(kids) + 1),
        "status": ["ok", "partial", "error", "ok"], "compile_status": ["compiled", "compile_failed", None, "compiled"],
        "error": [None, "compile: boom", "worker: did not start", None], "seconds": [1.0, 2.0, 0.0, 1.0],
        "n_regs": [40.0, None, None, 8.0], "trace_programs_log2": [12.5, 9.0, None, 1.0],
    })
    path = tmp_path / name
    rows.write_parquet(path, compression="zstd")
    return path


def test_a_source_features_file_goes_in_once_and_reads_back_as_columns(con, tmp_path):
    kids = [kernel_row(i)["kernel_id"] for i in range(3)]
    path = _file(tmp_path, kids)
    # ok and partial rows of known kernels; the 'error' row and the unknown kernel are left out
    assert ingest_compile_features(con, path) == 2
    assert ingest_compile_features(con, path) == 0  # re-ingesting changes nothing
    back = {r["kernel_id"]: r for r in read_kernel_source_features(con, "sm_90")}
    assert set(back) == set(kids[:2])
    assert back[kids[0]]["n_regs"] == 40.0 and back[kids[0]]["trace_programs_log2"] == 12.5
    assert "n_regs" not in back[kids[1]] and back[kids[1]]["error"] == "compile: boom"
    assert read_kernel_source_features(con, "sm_90", [kids[1]])[0]["kernel_id"] == kids[1]
    assert read_kernel_source_features(con, "sm_80") == []


def test_the_compile_features_ingest_routes_a_source_features_file(con, tmp_path):
    kids = [kernel_row(i)["kernel_id"] for i in range(3)]
    assert ingest_compile_features(con, _file(tmp_path, kids)) == 2
    assert execute(con, "SELECT count(*) FROM kernel_source_features") == [(2,)]
    assert execute(con, "SELECT count(*) FROM kernel_features") == [(0,)]


def test_forecast_features_overlay_source_on_compile_features(con):
    kids = [kernel_row(i)["kernel_id"] for i in range(3)]
    add_kernel_features(con, pl.DataFrame({"kernel_id": kids[:2], "target": ["sm_90"] * 2,
                                           "status": ["compiled", "compile_failed"], "n_regs": [32, None],
                                           "n_kernels": [1, None]}))
    add_kernel_source_features(con, pl.DataFrame({
        "kernel_id": [kids[0], kids[2]], "target": ["sm_90"] * 2, "status": ["ok", "failed"],
        "features": [json.dumps({"n_regs": 40.0, "ptx_wgmma": 2.0}), "{}"]}))
    feats = forecast_features(con, kids)
    assert feats[kids[0]]["n_regs"] == 40.0 and feats[kids[0]]["ptx_wgmma"] == 2.0
    assert feats[kids[0]]["n_kernels"] == 1  # from the compile features
    assert kids[1] not in feats and kids[2] not in feats  # failed rows add nothing


def test_bad_source_features_are_one_line_errors(con, tmp_path):
    kid = kernel_row(0)["kernel_id"]
    with pytest.raises(ValidationError, match="not a JSON object of numbers"):
        add_kernel_source_features(con, pl.DataFrame({"kernel_id": [kid], "target": ["sm_90"], "status": ["ok"],
                                                      "features": [json.dumps({"n_regs": "many"})]}))
    with pytest.raises(ValidationError, match="status"):
        add_kernel_source_features(con, pl.DataFrame({"kernel_id": [kid], "target": ["sm_90"], "status": ["great"],
                                                      "features": ["{}"]}))
