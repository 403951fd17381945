"""The training assets' pipeline calls without Dagster, on the smoke settings: a real DuckDB file
curated from two committed H200 files, a real sqlite MLflow store and registry, the tiny model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from orchestration.settings import load_settings
from pipelines.curation.stored import curate_and_store
from pipelines.forecasting.embed import log_embed_head_model
from pipelines.forecasting.pyfunc import log_classical_sources_model
from pipelines.surrogates.classical import train_classical_surrogates
from pipelines.surrogates.export import NoDatasetVersion
from pipelines.surrogates.grpo import train_grpo_surrogates
from pipelines.surrogates.llm import UnknownLlmSource, produce_llm_surrogate
from warehouse.db import connect
from warehouse.ingest import ingest_paths
from warehouse.lineage import read_model_lineage

H200 = Path(__file__).resolve().parents[2] / "data" / "measurements" / "h200"
NAME = "kernelcast-surrogate"


@pytest.fixture(scope="module")
def curated(tmp_path_factory):
    """(warehouse file, MLflow URI, smoke settings with their home) of one curated dataset version."""
    home = tmp_path_factory.mktemp("home")
    settings = load_settings("smoke", home)
    with connect(settings.warehouse_path) as con:
        ingest_paths(con, [H200 / "kernels-2026-11-29-harness1.parquet", H200 / "results-2026-11-29-harness1-run-b.parquet"])
    stored = curate_and_store(settings.warehouse_path, settings.curation)
    return settings.warehouse_path, settings.mlflow_uri, settings, stored.version


@pytest.mark.slow
def test_classical_versions_are_registered_then_reused(curated):
    db, uri, settings, version = curated
    sur = replace(settings.surrogate, classical=("cost_model",), held_out_task=None)
    lines: list[str] = []
    first = train_classical_surrogates(db, uri, sur, "batch-1", NAME, {"dagster_run_id": "batch-1"}, progress=lines.append,
                                       model_logger=log_classical_sources_model)
    assert first.dataset_version == version and first.fit_pairs > 0 and first.calibration_pairs > 0
    (reg,) = first.registered
    assert (reg.name, reg.kind, reg.split, reg.reused) == (NAME, "cost_model", "in_distribution", False) and lines
    with connect(db, read_only=True) as con:
        assert str(reg.version) in read_model_lineage(con, NAME)["model_version"].to_list()
    again = train_classical_surrogates(db, uri, sur, "batch-2", NAME, {}, model_logger=log_classical_sources_model)
    assert [(r.version, r.reused) for r in again.registered] == [(reg.version, True)]


@pytest.mark.slow
def test_the_supervised_llm_is_trained_registered_and_traced(curated, tmp_path):
    db, uri, settings, version = curated
    llm = produce_llm_surrogate(db, uri, settings.home, settings.data_dir, settings.surrogate, tmp_path / "work",
                                {"dagster_run_id": "run-1"}, head_logger=log_embed_head_model)
    assert llm.dataset_version == version and llm.missing_lineage == []
    assert llm.registered.source == "supervised" and not llm.registered.reused and llm.registered.run_id
    assert llm.trained["dataset_version"] == version
    with pytest.raises(UnknownLlmSource, match="unknown surrogate.llm setting 'nope'"):
        produce_llm_surrogate(db, uri, settings.home, settings.data_dir, replace(settings.surrogate, llm="nope"),
                              tmp_path / "work", {}, head_logger=log_embed_head_model)


@pytest.mark.slow
def test_grpo_variants_are_trained_with_lineage(curated):
    db, uri, settings, version = curated
    lines: list[str] = []
    grpo = train_grpo_surrogates(db, uri, settings.home, replace(settings.surrogate, llm="grpo"), "run-2",
                                 log=lines.append)
    assert grpo.dataset_version == version and grpo.train_rows > 0 and grpo.missing_lineage == []
    assert [variant for variant, _ in grpo.produced] == list(settings.surrogate.variants)
    assert lines[0].startswith(f"{settings.surrogate.variants[0]}: ")
    assert not (settings.home / "training" / "run-2").exists() or not any((settings.home / "training" / "run-2").iterdir())


def test_no_dataset_version_is_refused(tmp_path):
    settings = load_settings("smoke", tmp_path)
    connect(settings.warehouse_path).close()
    with pytest.raises(NoDatasetVersion):
        train_classical_surrogates(settings.warehouse_path, settings.mlflow_uri, settings.surrogate, "b", NAME, {},
                                   model_logger=log_classical_sources_model)
    with pytest.raises(NoDatasetVersion):
        train_grpo_surrogates(settings.warehouse_path, settings.mlflow_uri, tmp_path, settings.surrogate, "b")
