"""`curate_and_store` without Dagster: the committed H200 measurements in a real DuckDB file."""

from __future__ import annotations

from pathlib import Path

from orchestration.settings import CurationSettings
from pipelines.curation.stored import REPORT_SPLITS, curate_and_store
from warehouse.db import connect
from warehouse.ingest import ingest_paths

H200 = Path(__file__).resolve().parents[2] / "data" / "measurements" / "h200"


def test_the_dataset_is_written_once_under_its_version(tmp_path):
    db = tmp_path / "warehouse.duckdb"
    with connect(db) as con:
        ingest_paths(con, [H200 / "kernels-2026-11-29-harness1.parquet", H200 / "results-2026-11-29-harness1-run-b.parquet"])
    first = curate_and_store(db, CurationSettings(eval_per_bin=4))
    assert first.rows.height > 0 and first.rows_added == first.rows.height
    assert first.unsupported == [] and first.dataset.leakage == []
    assert sum(first.split_rows(s).height for s in REPORT_SPLITS) <= first.rows.height
    assert first.shortfall.filter(first.shortfall["shortfall"] <= 0).is_empty()
    with connect(db, read_only=True) as con:
        stored = con.execute("select count(*) from pairs where dataset_version = ?", [first.version]).fetchone()[0]
    assert stored == first.rows.height
    again = curate_and_store(db, CurationSettings(eval_per_bin=4))
    assert again.version == first.version and again.rows_added == 0
