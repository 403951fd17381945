"""`generate_and_store` without Dagster: a real DuckDB file, the shipped compile features."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestration.settings import GenerationSettings
from pipelines.generation.stored import generate_and_store
from pipelines.tasks import task_names
from warehouse.db import connect

DATA = Path(__file__).resolve().parents[2] / "data"


@pytest.mark.slow
def test_candidates_are_stored_once_then_every_task_is_skipped(tmp_path):
    db = tmp_path / "warehouse.duckdb"
    connect(db).close()
    settings = GenerationSettings(kernels_per_task=2, cpu_check_sample=0, workers=1)
    lines: list[str] = []
    first = generate_and_store(db, DATA, settings, log=lines.append)
    assert first.frame is not None and first.skipped_tasks == []
    assert first.rows_added == first.frame["kernel_id"].n_unique() > 0
    assert first.bad_ids == [] and first.orphan_parents == [] and first.uncompiled == []
    assert sum(ln.endswith(": 2 kernels") for ln in lines) == len(task_names())
    with connect(db, read_only=True) as con:
        assert con.execute("select count(*) from kernels").fetchone()[0] == first.rows_added
    again = generate_and_store(db, DATA, settings)
    assert again.frame is None and again.skipped_tasks == list(task_names()) and again.rows_added == 0
