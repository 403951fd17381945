"""DuckDB connections, numbered migrations, transactions and small SQL helpers.

The warehouse is one DuckDB file. DuckDB 2.x lets one process write it at a time and refuses
other processes (readers too) while it does, so writers open it briefly and callers serialise
writes. `connect` brings the schema up to date: every `migrations/NNN_name.sql` not yet recorded
in `schema_migrations` is applied in its own transaction, in version order.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa

from warehouse.errors import MigrationError, WarehouseError, WarehouseLockedError, one_line

MEMORY = ":memory:"
_MIGRATION_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")

_SCHEMA_MIGRATIONS_DDL = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    name VARCHAR NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    checksum VARCHAR NOT NULL  -- sha256 of the .sql text; a changed file is refused
)
"""


@dataclass(frozen=True)
class Migration:
    """One numbered migration shipped as package data."""

    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        """sha256 hex digest of the migration text."""
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def load_migrations() -> list[Migration]:
    """The migrations shipped in `warehouse/migrations`, in version order.

    Returns:
        One Migration per `NNN_name.sql` file.
    Raises:
        MigrationError: two files share a version number.
    """
    folder = importlib.resources.files("warehouse").joinpath("migrations")
    found: dict[int, Migration] = {}
    for entry in folder.iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if not match:
            continue
        version = int(match.group(1))
        if version in found:
            raise MigrationError(f"two migrations share version {version:03d}")
        found[version] = Migration(version, match.group(2), entry.read_text(encoding="utf-8"))
    return [found[v] for v in sorted(found)]


def connect(path: str | Path, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open the warehouse, creating its folder and applying pending migrations.

    Args:
        path: the DuckDB file, or ":memory:" for a throwaway database.
        read_only: open without write access; the schema must already be current.
    Returns:
        An open connection; close it when done so other processes can open the file.
    Raises:
        WarehouseLockedError: another process holds the file.
        MigrationError: a migration failed, changed after being applied, or (read-only)
            the file needs migrations.
        WarehouseError: the file is missing (read-only) or cannot be opened.
    """
    target = str(path)
    if target != MEMORY:
        file = Path(path)
        if read_only and not file.exists():
            raise WarehouseError(f"no warehouse at {file}; run an ingest or `kernelcast run` first")
        file.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = duckdb.connect(target, read_only=read_only)
    except duckdb.IOException as exc:
        if "lock" in str(exc).lower():
            raise WarehouseLockedError(
                f"warehouse {target} is in use by another process; retry when it finishes"
            ) from exc
        raise WarehouseError(f"cannot open warehouse {target}: {one_line(exc)}") from exc
    try:
        if read_only:
            pending = pending_migrations(con)
            if pending:
                raise MigrationError(
                    f"warehouse {target} needs migration {pending[0].version:03d}_{pending[0].name}; "
                    "open it once read-write"
                )
        else:
            apply_migrations(con)
    except BaseException:
        con.close()
        raise
    return con


def applied_versions(con: duckdb.DuckDBPyConnection) -> dict[int, str]:
    """Version -> checksum of every migration recorded in this database (empty if none)."""
    exists = execute(
        con,
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_migrations'",
    )[0][0]
    if not exists:
        return {}
    return dict(execute(con, "SELECT version, checksum FROM schema_migrations"))


def pending_migrations(con: duckdb.DuckDBPyConnection) -> list[Migration]:
    """Shipped migrations not yet applied, after checking applied ones are unchanged.

    Raises:
        MigrationError: an applied migration's file changed since.
    """
    applied = applied_versions(con)
    pending = []
    for migration in load_migrations():
        checksum = applied.get(migration.version)
        if checksum is None:
            pending.append(migration)
        elif checksum != migration.checksum:
            raise MigrationError(
                f"migration {migration.version:03d}_{migration.name} changed after it was applied; "
                "add a new numbered migration instead"
            )
    return pending


def apply_migrations(con: duckdb.DuckDBPyConnection) -> list[Migration]:
    """Apply every pending migration, each in one transaction with its bookkeeping row.

    Returns:
        The migrations applied now (empty when the schema was already current).
    Raises:
        MigrationError: a migration's SQL failed (that migration is rolled back).
    """
    execute(con, _SCHEMA_MIGRATIONS_DDL)
    done = []
    for migration in pending_migrations(con):
        try:
            with transaction(con):
                execute(con, migration.sql)
                execute(
                    con,
                    "INSERT INTO schema_migrations (version, name, checksum) VALUES (?, ?, ?)",
                    [migration.version, migration.name, migration.checksum],
                )
        except duckdb.Error as exc:
            raise MigrationError(
                f"migration {migration.version:03d}_{migration.name} failed: {one_line(exc)}"
            ) from exc
        done.append(migration)
    return done


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """BEGIN ... COMMIT, or ROLLBACK when the body raises.

    Args:
        con: an open connection with no transaction in progress.
    Returns:
        A context manager yielding the same connection.
    """
    con.begin()
    try:
        yield con
    except BaseException:
        con.rollback()
        raise
    con.commit()


def execute(
    con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | None = None
) -> list[tuple]:
    """Run SQL and fetch every row.

    DuckDB 2.x refuses further work on a connection whose last `execute` result was not read
    to the end, so every statement here is drained at once.

    Args:
        con: an open connection.
        sql: one or more statements; parameters bind to the last.
        params: positional `?` parameters.
    Returns:
        The rows of the (last) statement; an INSERT gives [(rows_inserted,)].
    """
    return (
        con.execute(sql, params).fetchall() if params is not None else con.execute(sql).fetchall()
    )


def query_frame(
    con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | None = None
) -> pl.DataFrame:
    """Run a SELECT and return a polars frame (`.pl()` exists only on `con.sql` relations).

    Args:
        con: an open connection.
        sql: a single SELECT.
        params: positional `?` parameters.
    Returns:
        The result as a polars DataFrame.
    """
    return con.sql(sql, params=list(params) if params is not None else None).pl()


def where_clause(conditions: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """`" WHERE c1 AND c2"` of the conditions whose value is given, and their parameters.

    Args:
        conditions: an SQL condition with one `?` -> its value; a None value leaves it out.
    Returns:
        ("" when no condition applies, the parameters in order); e.g.
        {"task = ?": "softmax", "hardware_id = ?": None} -> (" WHERE task = ?", ["softmax"]).
    """
    kept = [(sql, value) for sql, value in conditions.items() if value is not None]
    return (" WHERE " + " AND ".join(sql for sql, _ in kept) if kept else ""), [value for _, value in kept]


@contextmanager
def registered(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table) -> Iterator[str]:
    """Expose an Arrow table to SQL under `name` for the duration of the block.

    Args:
        con: an open connection.
        name: the view name to use in SQL.
        table: the data.
    Returns:
        A context manager yielding the name.
    """
    con.register(name, table)
    try:
        yield name
    finally:
        con.unregister(name)


def table_names(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Names of the base tables in the main schema, sorted."""
    rows = execute(
        con,
        "SELECT table_name FROM information_schema.tables "
        "WHERE table_schema = 'main' AND table_type = 'BASE TABLE' ORDER BY table_name",
    )
    return [r[0] for r in rows]
