"""Measurement reads and counts, pairs and dataset versions, forecasts, model lineage."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl
import pytest
from test_warehouse_factory import (
    A100,
    A100_ID,
    H200_ID,
    kernel_row,
    kernel_table,
    result_row,
    results_table,
    write,
)

import warehouse
from models.bins import speedups_to_bins
from warehouse.db import connect, execute
from warehouse.errors import ValidationError, WarehouseError
from warehouse.formats import measurement_id

SPEEDUPS = [0.2, 1.0, 1.2, 3.0, 5.0]  # bins 1, 4, 5, 7, 8


@dataclass
class Fixture:
    """Kernel rows of the fixture warehouse, by task."""

    soft: list[dict]
    mm: list[dict]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Fixture]:
    """A warehouse file with 7 softmax kernels (one child) and 2 matmul kernels, measured on an
    H200 (softmax: 5 ok + 1 incorrect + 1 timeout; matmul: 2 ok) and softmax again on an A100
    (2 ok). Built once; each test works on its own copy."""
    folder = tmp_path_factory.mktemp("built")
    path = folder / "warehouse.duckdb"
    soft = [kernel_row(i) for i in range(6)] + [kernel_row(6, parent=0)]
    mm = [kernel_row(i, task="matmul") for i in range(2)]
    rows = [result_row(k["kernel_id"], speedup=s) for k, s in zip(soft[:5], SPEEDUPS, strict=True)]
    rows.append(result_row(soft[5]["kernel_id"], status="failed", failure_kind="incorrect"))
    rows.append(result_row(soft[6]["kernel_id"], status="failed", failure_kind="timeout"))
    rows += [result_row(k["kernel_id"], task="matmul", speedup=2.5) for k in mm]
    a100 = [
        result_row(k["kernel_id"], batch_id="a100-1", speedup=0.9, hw_id=A100_ID, fingerprint=A100)
        for k in soft[:2]
    ]
    with connect(path) as c:
        warehouse.ingest_path(c, write(kernel_table(soft + mm), folder / "k.parquet"))
        warehouse.ingest_path(c, write(results_table(rows), folder / "h200.parquet"))
        warehouse.ingest_path(c, write(results_table(a100), folder / "a100.parquet"))
    return path, Fixture(soft, mm)


@pytest.fixture
def world(built, tmp_path):
    path = Path(shutil.copy(built[0], tmp_path / "warehouse.duckdb"))
    c = connect(path)
    yield c, built[1]
    c.close()


@pytest.fixture
def con(world) -> duckdb.DuckDBPyConnection:
    return world[0]


@pytest.fixture
def kernels(world) -> Fixture:
    return world[1]


def _pairs(kernels: Fixture) -> pl.DataFrame:
    """Reference-style pairs on the H200: anchor soft[1] (speedup 1.0) against soft[0, 2, 3, 4]."""
    anchor = kernels.soft[1]["kernel_id"]
    rows = []
    for i in (0, 2, 3, 4):
        cand = kernels.soft[i]["kernel_id"]
        S = SPEEDUPS[i] / SPEEDUPS[1]
        rows.append(
            {
                "task": "softmax",
                "hardware_id": H200_ID,
                "anchor_kernel_id": anchor,
                "candidate_kernel_id": cand,
                "anchor_measurement_id": measurement_id("batch-1", anchor),
                "candidate_measurement_id": measurement_id("batch-1", cand),
                "S": S,
                "true_bin": int(speedups_to_bins([S])[0]),
                "pair_type": "reference",
                "split": "eval" if i in (2, 4) else "train",
            }
        )
    return pl.DataFrame(rows)


def _h200_ids(con) -> list[str]:
    return [
        r[0]
        for r in execute(
            con,
            f"SELECT measurement_id FROM measurements WHERE hardware_id = '{H200_ID}' AND task = 'softmax'",
        )
    ]


def test_measurements_frame_joins_kernels_and_filters(con, kernels):
    frame = warehouse.measurements_frame(con)
    assert frame.height == 11
    assert {"generator", "algorithm", "parent_kernel_id", "mutation", "case_speedups"} <= set(
        frame.columns
    )
    child = frame.filter(pl.col("kernel_id") == kernels.soft[6]["kernel_id"]).row(0, named=True)
    assert (
        child["parent_kernel_id"] == kernels.soft[0]["kernel_id"]
        and child["mutation"] == "BLOCK:64->448"
    )
    assert warehouse.measurements_frame(con, hardware_id=A100_ID).height == 2
    assert warehouse.measurements_frame(con, hardware_id=H200_ID, task="matmul")[
        "speedup"
    ].to_list() == [2.5, 2.5]
    assert warehouse.measurements_frame(con, task="nope").height == 0


def test_dataset_counts(con):
    counts = warehouse.dataset_counts(con)
    json.dumps(counts)  # the CLI prints it with --json
    t = counts["totals"]
    assert (t["kernels"], t["hardware"], t["batches"], t["measurements"], t["ok"], t["failed"]) == (
        9,
        2,
        2,
        11,
        9,
        2,
    )
    assert counts["by_task"] == [
        {"task": "matmul", "kernels": 2, "measurements": 2, "ok": 2, "failed": 0},
        {"task": "softmax", "kernels": 7, "measurements": 9, "ok": 7, "failed": 2},
    ]
    assert counts["by_hardware"] == [
        {"hardware_id": A100_ID, "measurements": 2, "ok": 2, "failed": 0, "kernels": 2},
        {"hardware_id": H200_ID, "measurements": 9, "ok": 7, "failed": 2, "kernels": 9},
    ]
    assert counts["by_status"] == [
        {"status": "ok", "failure_kind": None, "measurements": 9},
        {"status": "failed", "failure_kind": "incorrect", "measurements": 1},
        {"status": "failed", "failure_kind": "timeout", "measurements": 1},
    ]
    assert counts["latest_dataset"] is None


def test_speedup_bin_counts_uses_the_given_bins(con):
    frame = warehouse.speedup_bin_counts(con, speedups_to_bins, hardware_id=H200_ID, task="softmax")
    assert frame["bin"].to_list() == [1, 4, 5, 7, 8]
    assert frame["measurements"].to_list() == [1, 1, 1, 1, 1]
    everything = warehouse.speedup_bin_counts(con, speedups_to_bins)
    assert everything["measurements"].sum() == 9
    assert warehouse.speedup_bin_counts(con, speedups_to_bins, task="nope").height == 0


def test_pairs_round_trip_and_split_filter(con, kernels):
    pairs = _pairs(kernels)
    assert warehouse.write_pairs(con, pairs, "v1") == 4
    assert warehouse.write_pairs(con, pairs, "v1") == 0
    back = warehouse.read_pairs(con, "v1")
    assert back.height == 4 and set(back["dataset_version"]) == {"v1"}
    assert back["true_bin"].sort().to_list() == [1, 5, 7, 8]
    assert back["pair_id"].to_list() == sorted(back["pair_id"].to_list())
    assert warehouse.read_pairs(con, "v1", split="eval").height == 2
    assert warehouse.read_pairs(con, "v2").height == 0
    expected_id = warehouse.make_pair_id(
        "v1", H200_ID, pairs["anchor_kernel_id"][0], pairs["candidate_kernel_id"][0]
    )
    assert expected_id in back["pair_id"].to_list()


@pytest.mark.parametrize(
    "change,match",
    [
        ({"S": float("inf")}, "must be finite and > 0"),
        ({"S": 0.0}, "must be finite and > 0"),
        ({"true_bin": 9}, "true_bin=9"),
        ({"pair_type": "sideways"}, "pair_type='sideways'"),
        ({"split": "test"}, "split='test'"),
    ],
)
def test_bad_pairs_write_nothing(con, kernels, change, match):
    pairs = _pairs(kernels)
    col, value = next(iter(change.items()))
    spoiled = pairs.with_columns(
        pl.when(pl.int_range(pl.len()) == 2).then(pl.lit(value)).otherwise(pl.col(col)).alias(col)
    )
    with pytest.raises(ValidationError, match=match):
        warehouse.write_pairs(con, spoiled, "v1")
    assert execute(con, "SELECT count(*) FROM pairs") == [(0,)]


def test_repeated_pair_is_refused(con, kernels):
    pairs = _pairs(kernels)
    with pytest.raises(ValidationError, match="appears 2 times"):
        warehouse.write_pairs(con, pl.concat([pairs, pairs.head(1)]), "v1")


def test_dataset_version_registration(con):
    ids = _h200_ids(con)
    assert warehouse.register_dataset_version(con, "v1", "d" * 64, {"pairs": 4}, ids) is True
    assert warehouse.register_dataset_version(con, "v1", "d" * 64, {"pairs": 4}, ids) is False
    with pytest.raises(ValidationError, match="immutable"):
        warehouse.register_dataset_version(con, "v1", "e" * 64, {}, ids)
    with pytest.raises(ValidationError, match="1 unknown measurement id"):
        warehouse.register_dataset_version(con, "v2", "f" * 64, {}, ids + ["nope"])
    assert execute(con, "SELECT count(*) FROM dataset_versions") == [(1,)]
    record = warehouse.read_dataset_version(con, "v1")
    assert record["counts"] == {"pairs": 4} and record["n_measurements"] == len(ids) == 7
    assert warehouse.dataset_measurement_ids(con, "v1") == sorted(ids)
    assert warehouse.read_dataset_version(con, "v9") is None


def test_write_dataset_is_atomic(con, kernels):
    bad = _pairs(kernels).with_columns(pl.lit("nonsense").alias("split"))
    with pytest.raises(ValidationError):
        warehouse.write_dataset(con, "v1", "d" * 64, {}, _h200_ids(con), bad)
    with pytest.raises(ValidationError, match="unknown measurement"):
        warehouse.write_dataset(con, "v1", "d" * 64, {}, ["nope"], _pairs(kernels))
    assert execute(
        con, "SELECT (SELECT count(*) FROM pairs) + (SELECT count(*) FROM dataset_versions)"
    ) == [(0,)]
    assert (
        warehouse.write_dataset(con, "v1", "d" * 64, {"pairs": 4}, _h200_ids(con), _pairs(kernels))
        == 4
    )
    versions = warehouse.list_dataset_versions(con)
    assert versions.select("dataset_version", "pairs").rows() == [("v1", 4)]
    latest = warehouse.dataset_counts(con)["latest_dataset"]
    assert latest["dataset_version"] == "v1"
    assert sum(r["pairs"] for r in latest["pairs"]) == 4


def test_forecasts_upsert_and_parse_failures(con, kernels):
    warehouse.write_pairs(con, _pairs(kernels), "v1")
    pair_ids = warehouse.read_pairs(con, "v1")["pair_id"].to_list()
    uniform = [1 / 8] * 8
    frame = pl.DataFrame(
        {
            "pair_id": pair_ids[:2],
            "model_ref": ["models:/surrogate/1"] * 2,
            "predicted_bin": [5, None],
            "argmax_bin": [5, None],
            "p": [uniform, None],
            "raw_sum": [1.0, None],
            "parse_ok": [True, False],
            "parse_error": [None, "no JSON object"],
            "tokens": [120, 300],
            "latency_s": [0.5, 1.5],
        }
    )
    assert warehouse.write_forecasts(con, frame) == 2
    again = frame.with_columns(pl.lit(6).alias("predicted_bin"))
    assert warehouse.write_forecasts(con, again.head(1)) == 1
    back = warehouse.read_forecasts(con, model_ref="models:/surrogate/1")
    assert back.height == 2 and back["repeat"].to_list() == [0, 0]
    first = back.filter(pl.col("pair_id") == pair_ids[0]).row(0, named=True)
    assert first["predicted_bin"] == 6 and first["p8"] == pytest.approx(0.125)
    failed = back.filter(~pl.col("parse_ok")).row(0, named=True)
    assert failed["p1"] is None and failed["parse_error"] == "no JSON object"
    joined = warehouse.read_forecasts(con, dataset_version="v1", with_pairs=True)
    assert {"true_bin", "speedup", "split"} <= set(joined.columns) and joined.height == 2
    assert warehouse.read_forecasts(con, model_ref="other").height == 0


@pytest.mark.parametrize(
    "change,match",
    [
        ({"predicted_bin": 0}, "predicted_bin=0"),
        ({"p": [1.5] + [0.0] * 7}, "p1 outside"),
        ({"p": [0.5] * 7}, "must hold 8"),
        ({"p": None}, "has no p1"),
    ],
)
def test_bad_forecasts_write_nothing(change, match):
    con = connect(":memory:")
    row = {
        "pair_id": "x",
        "model_ref": "m",
        "repeat": 0,
        "predicted_bin": 3,
        "p": [1 / 8] * 8,
        "parse_ok": True,
    }
    row.update(change)
    frame = pl.DataFrame([row], schema_overrides={"p": pl.List(pl.Float64)})
    with pytest.raises(ValidationError, match=match):
        warehouse.write_forecasts(con, frame)
    assert execute(con, "SELECT count(*) FROM forecasts") == [(0,)]
    # A good frame of another model beside the bad one: neither is written.
    good = pl.DataFrame([{"pair_id": "x", "model_ref": "other", "p1": 1.0, **{f"p{b}": 0.0 for b in range(2, 9)},
                          "predicted_bin": 1, "parse_ok": True}])
    with pytest.raises(ValidationError, match=match):
        warehouse.write_forecasts(con, good, frame)
    assert execute(con, "SELECT count(*) FROM forecasts") == [(0,)]
    assert warehouse.write_forecasts(con, good, frame.with_columns(pl.lit("m2").alias("model_ref")).filter(False)) == 1


def test_model_lineage_round_trip(con, kernels):
    ids = _h200_ids(con)
    warehouse.write_dataset(con, "v1", "d" * 64, {}, ids, _pairs(kernels))
    with pytest.raises(ValidationError, match="not registered"):
        warehouse.record_model_lineage(con, "kernelcast-surrogate", 1, "v0")
    warehouse.record_model_lineage(
        con,
        "kernelcast-surrogate",
        1,
        "v1",
        mlflow_run_id="run-abc",
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
    )
    warehouse.record_model_lineage(con, "kernelcast-surrogate", 2, "v1", mlflow_run_id="run-def")

    learned = warehouse.measurements_for_model(con, "kernelcast-surrogate", "1")
    assert sorted(learned["measurement_id"].to_list()) == sorted(ids)
    assert set(learned["hardware_id"]) == {H200_ID} and set(learned["task"]) == {"softmax"}
    assert {"generator", "algorithm", "parent_kernel_id", "mutation"} <= set(learned.columns)
    assert learned.filter(pl.col("status") == "failed").height == 2

    models = warehouse.models_for_measurement(con, ids[0])
    assert models.select(
        "model_name", "model_version", "dataset_version", "mlflow_run_id"
    ).rows() == [
        ("kernelcast-surrogate", "1", "v1", "run-abc"),
        ("kernelcast-surrogate", "2", "v1", "run-def"),
    ]
    a100_id = measurement_id("a100-1", kernels.soft[0]["kernel_id"])
    assert warehouse.models_for_measurement(con, a100_id).height == 0
    with pytest.raises(WarehouseError, match="no lineage recorded"):
        warehouse.measurements_for_model(con, "kernelcast-surrogate", 3)
    assert warehouse.read_model_lineage(con)["model_version"].to_list() == ["1", "2"]
