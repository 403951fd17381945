"""Lineage tells what each version's fit used: the cost model, the text model and the committed
LLM adapter each answer with exactly the kernels of the dataset version they were trained on
(not the newest one), their MLflow runs hold that dataset as an input and its measurement ids,
and a version trained on a dataset the warehouse no longer holds says so."""

from __future__ import annotations

import json

import polars as pl
import pytest
from test_warehouse_factory import (
    H200_ID,
    kernel_row,
    kernel_table,
    result_row,
    results_table,
    write,
)

import warehouse
from models.classical import CostModel, TextModel
from models.tiny import build_tiny_model
from tests.forecasting.test_forecasting_models import toy_pairs
from warehouse.db import connect
from warehouse.errors import WarehouseError
from warehouse.formats import measurement_id
from warehouse.lineage import (
    kernels_for_model,
    lineage_of,
    read_model_lineage,
    record_model_lineage,
)

NAME = "kernelcast-surrogate"


@pytest.fixture
def store(tmp_path):
    """A warehouse with six measured kernels; v-old holds three of them, v-new (the newest) all six."""
    kernels = [kernel_row(i) for i in range(6)]
    results = [result_row(k["kernel_id"], speedup=1.0 + i) for i, k in enumerate(kernels)]
    con = connect(tmp_path / "warehouse.duckdb")
    warehouse.ingest_path(con, write(kernel_table(kernels), tmp_path / "k.parquet"))
    warehouse.ingest_path(con, write(results_table(results), tmp_path / "r.parquet"))
    ids = [measurement_id("batch-1", k["kernel_id"]) for k in kernels]
    warehouse.register_dataset_version(con, "v-old", "a" * 64, {}, ids[:3])
    warehouse.register_dataset_version(con, "v-new", "b" * 64, {}, ids)
    con.execute("UPDATE dataset_versions SET created_at = created_at - INTERVAL 1 DAY WHERE dataset_version = 'v-old'")
    yield {"con": con, "uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "kernels": [k["kernel_id"] for k in kernels],
           "ids": ids}
    con.close()


def _run_record(uri: str, run_id: str) -> tuple[dict, list, list[str]]:
    """(tags, training inputs, measurement_ids.txt lines) of a run."""
    import mlflow
    from mlflow import MlflowClient

    run = MlflowClient(uri).get_run(run_id)
    inputs = [d for d in run.inputs.dataset_inputs
              if {t.key: t.value for t in d.tags}.get("mlflow.data.context") == "training"]
    text = mlflow.artifacts.load_text(f"runs:/{run_id}/measurement_ids.txt")
    return run.data.tags, inputs, text.split()


@pytest.mark.parametrize("kind", ["cost_model", "text_model"])
def test_a_classical_version_traces_back_to_exactly_its_training_kernels(store, kind):
    from models.classical.registry import log_classical
    from models.registry.versions import version_info
    from warehouse.datasets import current_dataset_version, dataset_measurement_ids

    con, uri = store["con"], store["uri"]
    assert current_dataset_version(con) == "v-new"
    fit, y, l2 = toy_pairs(120, 0)
    model = (CostModel(max_iter=20) if kind == "cost_model" else TextModel()).fit(fit, y, l2)
    model.calibrate(*toy_pairs(40, 1)[:2])
    old_ids = dataset_measurement_ids(con, "v-old")
    run_id, version = log_classical(model, uri, fit.head(4), NAME, "v-old", "in_distribution", measurement_ids=old_ids)
    record_model_lineage(con, NAME, version, "v-old", mlflow_run_id=run_id, base_model=kind)

    assert kernels_for_model(con, NAME, version) == sorted(store["kernels"][:3])  # not v-new's six
    row = lineage_of(con, NAME, version)
    tags, inputs, listed = _run_record(uri, run_id)
    info = version_info(uri, version)
    # model_lineage, the run's and the version's tags name the same dataset version
    assert row["dataset_version"] == tags["trained_dataset_version"] == info["tags"]["trained_dataset_version"] == "v-old"
    assert row["dataset_held"] and tags["trained_dataset_held"] == "true"
    assert listed == old_ids
    [dataset] = inputs
    assert dataset.dataset.name == "v-old" and dataset.dataset.digest.startswith("duckdb:dataset_measurements@v-old")
    assert json.loads(dataset.dataset.source)["uri"] == "duckdb:dataset_measurements@v-old"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def _committed_run(root, tiny, trained_on: str, pairs: list[dict] | None) -> None:
    """A committed GPU run folder: one LoRA variant's adapter, its training record, no forecasts."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from pipelines.surrogates.remote_results import TRAINING_PAIRS_FILE, training_pairs_frame
    from warehouse.bin_edges import P_COLS

    adapter = root / "adapters" / "lora"
    get_peft_model(AutoModelForCausalLM.from_pretrained(str(tiny)),
                   LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM")).save_pretrained(str(adapter))
    settings = {"name": "lora", "finetune": "lora", "held_out": False, "style": "compact"}
    (root / "training.json").write_text(json.dumps({"dataset_version": trained_on, "variants": {
        "lora": {"settings": settings, "history": {"history": [{"epoch": 1, "loss": 0.5}]}}}}))
    schema = {"variant": pl.String, "role": pl.String, "readout": pl.String, "repeat": pl.Int64, "pair_id": pl.String,
              "hardware_id": pl.String, "anchor_kernel_id": pl.String, "candidate_kernel_id": pl.String,
              "true_bin": pl.Int64, "parse_ok": pl.Boolean, **{c: pl.Float64 for c in P_COLS}}
    pl.DataFrame(schema=schema).write_parquet(root / "forecasts.parquet")
    if pairs is not None:
        training_pairs_frame(pairs).write_parquet(root / TRAINING_PAIRS_FILE)


def _register(store, tmp_path, tiny, trained_on: str, pairs: list[dict] | None = None):
    from pipelines.surrogates.llm import register_committed

    data = tmp_path / "data"
    _committed_run(data / "training" / "h200" / "day", tiny, trained_on, pairs)
    empty = pl.DataFrame(schema={"pair_id": pl.String, "hardware_id": pl.String, "anchor_kernel_id": pl.String,
                                 "candidate_kernel_id": pl.String})
    return register_committed(store["con"], store["uri"], data, "training/h200/day", "lora", "v-new", "tiny",
                              tiny, empty, empty, tags={"dagster_run_id": "dg-1"})


@pytest.mark.slow
def test_a_committed_llm_version_names_the_dataset_it_was_trained_on(store, tmp_path, tiny):
    from models.registry.versions import version_info
    from warehouse.datasets import dataset_measurement_ids

    con, uri = store["con"], store["uri"]
    pairs = [{"pair_id": "p-1", "task": "softmax", "hardware_id": H200_ID, "anchor_kernel_id": store["kernels"][0],
              "candidate_kernel_id": store["kernels"][1], "true_bin": 3, "roles": ["fit"]},
             {"pair_id": "p-2", "task": "softmax", "hardware_id": "h", "anchor_kernel_id": store["kernels"][0],
              "candidate_kernel_id": store["kernels"][2], "true_bin": 5, "roles": ["eval"]}]
    out = _register(store, tmp_path, tiny, "v-old", pairs)
    info = version_info(uri, out.version)
    # registered in a run of v-new (scored on its pairs), trained on v-old: lineage says v-old
    assert info["tags"]["dataset_version"] == "v-new"
    assert info["tags"]["trained_dataset_version"] == "v-old" == read_model_lineage(con, NAME)["dataset_version"][0]
    assert kernels_for_model(con, NAME, out.version) == sorted(store["kernels"][:3])
    tags, inputs, listed = _run_record(uri, out.run_id)
    # the measurements behind its one fit pair (kernels 0 and 1), not all of v-old (kernels 0-2)
    assert tags["trained_dataset_version"] == "v-old" and listed == sorted(store["ids"][:2])
    assert set(listed) < set(dataset_measurement_ids(con, "v-old"))
    [dataset] = inputs
    assert dataset.dataset.digest.startswith("duckdb:pairs@v-old")  # the fit pairs the collect kept
    assert json.loads(dataset.dataset.profile)["num_rows"] == 1


@pytest.mark.slow
def test_a_version_trained_on_a_dataset_no_longer_held_says_so(store, tmp_path, tiny):
    from mlflow import MlflowClient

    from models.registry.versions import version_info

    con, uri = store["con"], store["uri"]
    out = _register(store, tmp_path, tiny, "ds-gone")
    info = version_info(uri, out.version)
    assert info["tags"]["trained_dataset_version"] == "ds-gone" and info["tags"]["trained_dataset_held"] == "false"
    mv = MlflowClient(uri, registry_uri=uri).get_model_version(NAME, str(out.version))
    assert "ds-gone (not held by this warehouse)" in mv.description and "v-new" in mv.description
    row = lineage_of(con, NAME, out.version)
    assert row["dataset_version"] == "ds-gone" and not row["dataset_held"]
    assert row["note"].endswith("which this warehouse no longer holds")
    with pytest.raises(WarehouseError, match="ds-gone, which this warehouse no longer holds"):
        kernels_for_model(con, NAME, out.version)  # never the current version's kernels
    run = MlflowClient(uri).get_run(out.run_id)
    assert run.data.tags["trained_dataset_held"] == "false"
    [dataset] = [d for d in run.inputs.dataset_inputs]
    assert dataset.dataset.name == "ds-gone"
    names = {a.path for a in MlflowClient(uri).list_artifacts(out.run_id)}
    assert "measurement_ids.txt" not in names  # unknown here: no invented list


def test_lineage_of_a_dataset_not_held_is_refused_unless_asked_for(store):
    con = store["con"]
    with pytest.raises(warehouse.ValidationError, match="is not registered"):
        record_model_lineage(con, NAME, 9, "ds-gone")
    with pytest.raises(warehouse.ValidationError, match="no dataset version"):
        record_model_lineage(con, NAME, 9, "", require_held=False)
    record_model_lineage(con, NAME, 9, "ds-gone", require_held=False)
    assert read_model_lineage(con, NAME).select("model_version", "dataset_held").rows() == [("9", False)]
    assert warehouse.models_for_measurement(con, store["ids"][0]).height == 0


def test_collect_keeps_the_fit_pairs_of_every_role():
    from pipelines.surrogates.remote_results import training_pairs_frame

    pairs = [{"pair_id": "a", "task": "t", "hardware_id": "h", "anchor_kernel_id": "k0", "candidate_kernel_id": "k1",
              "true_bin": 2, "roles": ["fit", "held_out_fit"]},
             {"pair_id": "b", "task": "t", "hardware_id": "h", "anchor_kernel_id": "k0", "candidate_kernel_id": "k2",
              "true_bin": 7, "roles": ["eval"]}]
    frame = training_pairs_frame(pairs)
    assert frame.select("role", "pair_id", "true_bin").rows() == [("fit", "a", 2), ("held_out_fit", "a", 2)]
    assert training_pairs_frame([]).height == 0
