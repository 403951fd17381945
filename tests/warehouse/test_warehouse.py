"""Warehouse connection, migrations, tasks, kernels, kernel features and checks."""

from __future__ import annotations

import duckdb
import polars as pl
import pytest
from test_warehouse_factory import kernel_row, kernel_source, kernel_table

import warehouse
from warehouse import db
from warehouse.db import Migration, connect, execute, table_names
from warehouse.errors import MigrationError, ValidationError, WarehouseError

TABLES = {
    "schema_migrations",
    "tasks",
    "kernels",
    "kernel_features",
    "kernel_source_features",
    "kernel_checks",
    "hardware",
    "batches",
    "measurements",
    "ingested_files",
    "pairs",
    "dataset_versions",
    "dataset_measurements",
    "forecasts",
    "forecast_listings",
    "model_lineage",
    "promotion_decisions",
    "promotion_scores",
}


def _schema(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    return execute(
        con,
        "SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns "
        "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position",
    )


@pytest.fixture
def con():
    c = connect(":memory:")
    yield c
    c.close()


def test_connect_creates_parent_dirs_and_every_table(tmp_path):
    path = tmp_path / "deep" / "er" / "warehouse.duckdb"
    c = connect(path)
    assert path.exists()
    assert set(table_names(c)) == TABLES
    applied = execute(c, "SELECT version, name FROM schema_migrations ORDER BY version")
    assert applied[0] == (1, "init")
    assert [v for v, _ in applied] == list(range(1, len(applied) + 1))  # every migration, in order
    assert (2, "promotion_decisions") in applied and (3, "kernel_feature_launches") in applied
    assert (4, "measurement_sandbox") in applied and (5, "kernel_source_features") in applied
    c.close()


def test_migrations_are_idempotent(tmp_path):
    path = tmp_path / "w.duckdb"
    c = connect(path)
    before = _schema(c)
    applied_before = execute(c, "SELECT version, applied_at, checksum FROM schema_migrations")
    c.close()

    c = connect(path)
    assert db.apply_migrations(c) == []  # nothing left to apply
    assert _schema(c) == before
    assert (
        execute(c, "SELECT version, applied_at, checksum FROM schema_migrations") == applied_before
    )
    c.close()


def test_migration_checksum_is_recorded(con):
    shipped = db.load_migrations()
    assert [m.version for m in shipped] == list(range(1, len(shipped) + 1))
    assert (
        execute(con, "SELECT checksum FROM schema_migrations WHERE version = 1")[0][0]
        == shipped[0].checksum
    )


def test_changed_migration_is_refused(tmp_path):
    path = tmp_path / "w.duckdb"
    c = connect(path)
    execute(c, "UPDATE schema_migrations SET checksum = 'edited' WHERE version = 1")
    c.close()
    with pytest.raises(MigrationError, match="changed after it was applied"):
        connect(path)


def test_failed_migration_rolls_back(con, monkeypatch):
    shipped = db.load_migrations()
    bad = Migration(
        len(shipped) + 1, "bad", "CREATE TABLE half_done (a INTEGER); SELECT * FROM no_such_table;"
    )
    monkeypatch.setattr(db, "load_migrations", lambda: [*shipped, bad])
    with pytest.raises(MigrationError, match="bad failed") as err:
        db.apply_migrations(con)
    assert "\n" not in str(err.value)
    assert "half_done" not in table_names(con)
    assert execute(con, "SELECT max(version) FROM schema_migrations")[0][0] == len(shipped)


def test_read_only(tmp_path):
    path = tmp_path / "w.duckdb"
    with pytest.raises(WarehouseError, match="no warehouse"):
        connect(path, read_only=True)
    connect(path).close()
    ro = connect(path, read_only=True)
    assert set(table_names(ro)) == TABLES
    with pytest.raises(duckdb.Error):
        execute(ro, "INSERT INTO tasks (task, description) VALUES ('t', 'd')")
    ro.close()


def test_public_names_resolve():
    for name in warehouse.__all__:
        assert getattr(warehouse, name) is not None
    with pytest.raises(AttributeError):
        warehouse.not_a_name  # noqa: B018
    from warehouse import tables  # the facade assets import

    assert tables.upsert_tasks is warehouse.upsert_tasks
    assert set(tables.__all__) <= set(warehouse.__all__)


def test_upsert_tasks_round_trip(con):
    rows = [
        {
            "task": "softmax",
            "description": "Row softmax.",
            "source": "kernelcast",
            "correctness_cases": ({"M": 3, "N": 5, "seed": 1},),
            "benchmark_cases": [{"M": 4096, "N": 4096, "seed": 1}],
            "tolerances": {"rtol": 0.02, "atol": 0.02},
        },
        {"task": "matmul", "description": "GEMM.", "contract_version": 2},
    ]
    assert warehouse.upsert_tasks(con, rows) == 2
    tasks = warehouse.read_tasks(con)
    assert tasks["task"].to_list() == ["matmul", "softmax"]
    soft = tasks.filter(pl.col("task") == "softmax").row(0, named=True)
    assert soft["contract_version"] == 1
    assert '"M": 3' in soft["correctness_cases"]
    assert tasks.filter(pl.col("task") == "matmul")["contract_version"].item() == 2

    assert (
        warehouse.upsert_tasks(con, [{"task": "softmax", "description": "Row-wise softmax."}]) == 1
    )
    tasks = warehouse.read_tasks(con)
    assert tasks.height == 2
    assert tasks.filter(pl.col("task") == "softmax")["description"].item() == "Row-wise softmax."


def test_upsert_tasks_needs_description(con):
    with pytest.raises(ValidationError, match="'task' and 'description'"):
        warehouse.upsert_tasks(con, [{"task": "x"}])


def test_add_kernels_is_idempotent_by_id(con):
    rows = [kernel_row(i) for i in range(3)]
    assert warehouse.add_kernels(con, pl.DataFrame(rows)) == 3
    assert warehouse.add_kernels(con, kernel_table(rows)) == 0  # Arrow input, same ids
    more = rows + [kernel_row(3, parent=0)]
    assert warehouse.add_kernels(con, pl.DataFrame(more)) == 1
    kernels = warehouse.read_kernels(con, task="softmax")
    assert kernels.height == 4
    child = kernels.filter(pl.col("kernel_id") == more[3]["kernel_id"]).row(0, named=True)
    assert child["parent_kernel_id"] == rows[0]["kernel_id"]
    assert child["mutation"] == "BLOCK:64->256"
    subset = warehouse.read_kernels(con, kernel_ids=[rows[1]["kernel_id"]], with_source=False)
    assert (
        subset["kernel_id"].to_list() == [rows[1]["kernel_id"]] and "source" not in subset.columns
    )


def test_add_kernels_minimal_columns_and_reference(con):
    src = kernel_source(7)
    frame = pl.DataFrame(
        {
            "kernel_id": [warehouse.kernel_id(src)],
            "task": ["softmax"],
            "source": [src],
            "generator": ["reference"],
        }
    )
    assert warehouse.add_kernels(con, frame) == 1
    row = warehouse.read_kernels(con).row(0, named=True)
    assert (
        row["generator"] == "reference"
        and row["language"] is None
        and row["created_at"] is not None
    )


def test_kernel_id_mismatch_is_rejected_and_nothing_written(con):
    good = kernel_row(0)
    bad = {**kernel_row(1), "source": kernel_source(2)}  # id of kernel 1, source of kernel 2
    with pytest.raises(ValidationError, match="does not match its source") as err:
        warehouse.add_kernels(con, pl.DataFrame([good, bad]))
    assert "\n" not in str(err.value)
    assert execute(con, "SELECT count(*) FROM kernels") == [(0,)]


def test_same_source_other_whitespace_is_one_kernel(con):
    src = kernel_source(0)
    variant = src.replace("\n", "\r\n") + "\n\n"
    frame = pl.DataFrame(
        {
            "kernel_id": [warehouse.kernel_id(src), warehouse.kernel_id(variant)],
            "task": ["softmax"] * 2,
            "source": [src, variant],
        }
    )
    assert warehouse.add_kernels(con, frame) == 1


def test_kernel_features_and_checks_upsert(con):
    kid = kernel_row(0)["kernel_id"]
    feats = pl.DataFrame(
        {
            "kernel_id": [kid],
            "target": ["sm_90"],
            "status": ["compiled"],
            "n_regs": [40],
            "n_spills": [0],
            "shared_bytes": [4096],
        }
    )
    assert warehouse.add_kernel_features(con, feats) == 1
    assert warehouse.add_kernel_features(con, feats.with_columns(pl.lit(64).alias("n_regs"))) == 1
    assert execute(con, "SELECT n_regs, shared_bytes FROM kernel_features") == [(64, 4096)]
    with pytest.raises(ValidationError, match="status='exploded'"):
        warehouse.add_kernel_features(con, feats.with_columns(pl.lit("exploded").alias("status")))

    checks = pl.DataFrame(
        {
            "kernel_id": [kid],
            "check_kind": ["cpu_interpreter"],
            "ok": [False],
            "failure_kind": ["incorrect"],
            "seconds": [0.4],
        }
    )
    assert warehouse.add_kernel_checks(con, checks) == 1
    assert (
        warehouse.add_kernel_checks(
            con, checks.with_columns(pl.lit(True).alias("ok"), pl.lit(None).alias("failure_kind"))
        )
        == 1
    )
    assert execute(con, "SELECT ok, failure_kind, seconds FROM kernel_checks") == [
        (True, None, 0.4)
    ]
    with pytest.raises(ValidationError, match="missing required column 'ok'"):
        warehouse.add_kernel_checks(con, checks.drop("ok"))


def test_read_only_refuses_a_schema_behind(tmp_path, monkeypatch):
    path = tmp_path / "w.duckdb"
    connect(path).close()
    shipped = db.load_migrations()
    newer = Migration(len(shipped) + 1, "newer", "CREATE TABLE later_table (a INTEGER);")
    monkeypatch.setattr(db, "load_migrations", lambda: [*shipped, newer])
    with pytest.raises(MigrationError, match="needs migration .*_newer; open it once read-write"):
        connect(path, read_only=True)
    c = connect(path)  # a writer brings it up to date
    assert "later_table" in table_names(c)
    c.close()
    connect(path, read_only=True).close()
