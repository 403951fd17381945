"""Surrogate registry: register an adapter as an MLflow model version, aliases, resolve by
models:/ URI, load it onto the base model for forecasting, and lineage rows in DuckDB."""

from __future__ import annotations

import json
import math

import pytest
import torch

import warehouse
from models.backends import ForecastRequest
from models.backends.transformers_backend import TransformersAnswerer
from models.prompts import build_prompt
from models.registry.tracking import mlflow_experiment
from models.registry.versions import (
    load_surrogate,
    parse_model_uri,
    read_base_model_ref,
    register_surrogate,
    resolve_surrogate,
    set_alias,
)
from models.tiny import build_tiny_model
from tests.warehouse.test_warehouse_factory import (
    kernel_row,
    kernel_table,
    result_row,
    results_table,
    write,
)
from warehouse.db import connect
from warehouse.formats import measurement_id

NAME = "kernelcast-surrogate"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def adapter(tiny, tmp_path):
    """A LoRA adapter on the tiny model with non-zero B (as after training) + tokenizer."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(str(tiny)),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    out = tmp_path / "adapter"
    model.save_pretrained(str(out))
    PreTrainedTokenizerFast.from_pretrained(str(tiny)).save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    """One sqlite store for the module (creating its tables takes seconds); tests that
    register use their own model names, so version numbers do not interact."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def new_run(uri: str) -> str:
    """A finished training run (as train_grpo leaves it) with git and dagster tags."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    run = client.create_run(
        mlflow_experiment(client, uri, "kernelcast-training"),
        tags={"git_commit": "c" * 40, "dagster_run_id": "dg-7"},
    )
    client.set_terminated(run.info.run_id)
    return run.info.run_id


@pytest.fixture(scope="module")
def run_id(uri):
    return new_run(uri)


@pytest.fixture
def con(tmp_path):
    """A warehouse with 3 measured softmax kernels and dataset version v1 over them."""
    kernels = [kernel_row(i) for i in range(3)]
    results = [result_row(k["kernel_id"], speedup=1.0 + i) for i, k in enumerate(kernels)]
    c = connect(tmp_path / "warehouse.duckdb")
    warehouse.ingest_path(c, write(kernel_table(kernels), tmp_path / "k.parquet"))
    warehouse.ingest_path(c, write(results_table(results), tmp_path / "r.parquet"))
    ids = sorted(measurement_id("batch-1", k["kernel_id"]) for k in kernels)
    warehouse.register_dataset_version(c, "v1", "d" * 64, {"measurements": 3}, ids)
    yield c, ids
    c.close()


def test_register_alias_resolve_load_forecast(uri, run_id, adapter, tiny, con, tmp_path):
    from mlflow import MlflowClient

    c, ids = con
    version = register_surrogate(
        uri, run_id, adapter, base_model=str(tiny), dataset_version="v1", alias="challenger", con=c
    )
    assert version == 1
    client = MlflowClient(uri, registry_uri=uri)
    mv = client.get_model_version(NAME, "1")
    assert mv.tags["dataset_version"] == "v1" and mv.tags["base_model"] == str(tiny)
    assert mv.run_id == run_id
    assert int(client.get_model_version_by_alias(NAME, "challenger").version) == 1
    # Nothing promoted yet: no champion.
    assert resolve_surrogate(uri, f"models:/{NAME}@champion", tmp_path / "none") is None
    set_alias(uri, "champion", version)
    aliases = client.get_registered_model(NAME).aliases
    assert {k: int(v) for k, v in aliases.items()} == {"challenger": 1, "champion": 1}

    local = resolve_surrogate(uri, f"models:/{NAME}@champion", tmp_path / "resolved")
    assert local is not None and (local / "peft" / "adapter_model.safetensors").is_file()
    assert (local / "MLmodel").is_file()  # an MLflow model, registered from the logged model
    assert mv.source.startswith("models:/m-") and mv.tags["kind"] == "llm"
    assert read_base_model_ref(local) == {"base_model": str(tiny), "dataset_version": "v1"}
    assert resolve_surrogate(uri, f"models:/{NAME}/1", tmp_path / "by-version") is not None

    model, tokenizer = load_surrogate(local, read_base_model_ref(local)["base_model"])
    messages = build_prompt("softmax", "Row softmax.", "a = 1\n", "a = 2\n", {}, style="diff")
    [forecast] = TransformersAnswerer(model, tokenizer).forecast([ForecastRequest(messages)])
    assert forecast.parse_ok and len(forecast.p) == 8 and math.isclose(sum(forecast.p), 1.0)
    # The adapter is applied: the forecast differs from the bare base model's.
    [bare] = TransformersAnswerer(str(tiny)).forecast([ForecastRequest(messages)])
    assert max(abs(a - b) for a, b in zip(forecast.p, bare.p, strict=True)) > 1e-6

    # Lineage: model version -> dataset version -> measurements.
    lineage = warehouse.read_model_lineage(c, NAME).to_dicts()
    assert len(lineage) == 1
    row = lineage[0]
    assert (row["model_version"], row["dataset_version"], row["mlflow_run_id"]) == (
        "1",
        "v1",
        run_id,
    )
    assert (row["git_commit"], row["dagster_run_id"], row["base_model"]) == (
        "c" * 40,
        "dg-7",
        str(tiny),
    )
    assert warehouse.measurements_for_model(c, NAME, 1)["measurement_id"].to_list() == ids

    # A second registration is version 2; the artifact JSON names the base model.
    assert register_surrogate(uri, run_id, adapter, base_model=str(tiny), dataset_version="v1") == 2


def test_malformed_uri_and_alias_are_one_line_errors(uri, run_id, adapter):
    with pytest.raises(ValueError, match="is not models:/<name>@<alias>"):
        resolve_surrogate(uri, "runs:/abc/adapter", ".")
    with pytest.raises(ValueError, match="alias must be one of"):
        register_surrogate(uri, run_id, adapter, alias="production")
    assert parse_model_uri(f"models:/{NAME}/3") == (NAME, None, 3)
    # An unknown model name resolves to None, not an exception.
    assert resolve_surrogate(uri, "models:/nobody@champion", ".") is None


def test_a_version_loads_as_mlflow_users_expect(uri, adapter, tiny, tmp_path):
    """models:/NAME@champion through MLflow's own loaders: pyfunc (text generation) and the
    transformers flavour (model + tokenizer, the adapter applied to the referenced base)."""
    import mlflow
    from mlflow import MlflowClient
    from peft import PeftModel

    from models.registry.versions import model_id_of

    name = "load-check"
    run_id = new_run(uri)
    version = register_surrogate(uri, run_id, adapter, name=name, base_model=str(tiny), dataset_version="v9",
                                 alias="champion", prompt_style="compact")
    assert version == 1
    mv = MlflowClient(uri, registry_uri=uri).get_model_version(name, "1")
    model_id = model_id_of(uri, 1, name)
    assert model_id and mv.source == f"models:/{model_id}"
    logged = mlflow.get_logged_model(model_id)
    assert logged.source_run_id == run_id  # version -> logged model -> training run

    pyfunc = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    assert [c.name for c in pyfunc.metadata.signature.inputs.inputs] == ["prompt"]
    assert pyfunc.metadata.metadata["dataset_version"] == "v9" and pyfunc.metadata.metadata["kind"] == "llm"
    import pandas as pd

    [answer] = pyfunc.predict(pd.DataFrame({"prompt": ["bin?"]}), params={"max_new_tokens": 4})
    assert isinstance(answer, str) and answer.startswith("bin?")  # the pipeline returns prompt + continuation

    parts = mlflow.transformers.load_model(f"models:/{name}@champion", return_type="components",
                                           base_model_path=str(tiny))
    assert isinstance(parts["model"], PeftModel) and parts["tokenizer"] is not None
    local = resolve_surrogate(uri, f"models:/{name}/1", tmp_path / "dl")
    assert read_base_model_ref(local) == {"base_model": str(tiny), "dataset_version": "v9", "prompt_style": "compact"}
    # A plain adapter folder (trained on a GPU host) still names its base model in base_model.json.
    (adapter / "base_model.json").write_text(json.dumps({"base_model": "smollm2"}))
    assert read_base_model_ref(adapter) == {"base_model": "smollm2"}


def test_champion_and_challenger_are_two_aliases_never_on_one_version(uri, tmp_path):
    """set_aliases records a promotion's outcome: the challenger is the best candidate that is
    not the champion, so it is never set to the champion's version (and leaves when it becomes one)."""
    from mlflow import MlflowClient

    from models.registry.versions import aliases, clear_alias, set_aliases

    name = "alias-check"
    client = MlflowClient(uri, registry_uri=uri)
    client.create_registered_model(name)
    for _ in range(3):
        client.create_model_version(name, source=(tmp_path / "m").as_uri())
    assert aliases(uri, name) == {"champion": None, "challenger": None, "champion-external": None,
                                  "challenger-external": None}
    assert set_aliases(uri, champion=1, challenger=2, name=name) == {"champion": 1, "challenger": 2}
    # version 2 wins the next promotion: it leaves @challenger; 3 is the new best other candidate
    assert set_aliases(uri, champion=2, name=name) == {"champion": 2, "challenger": None}
    assert set_aliases(uri, challenger=2, name=name) == {"champion": 2, "challenger": None}
    assert set_aliases(uri, challenger=3, name=name) == {"champion": 2, "challenger": 3}
    clear_alias(uri, "challenger", name)
    clear_alias(uri, "challenger", name)  # not set: nothing to do, no error
    assert aliases(uri, name) == {"champion": 2, "challenger": None, "champion-external": None,
                                  "challenger-external": None}
    with pytest.raises(ValueError, match="alias must be one of"):
        clear_alias(uri, "production", name)
