"""What the inbox sensor asks the warehouse: which file contents are ingested already."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import duckdb

from warehouse.db import execute


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, the key `ingested_files` records (read in 1 MiB chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def already_ingested(con: duckdb.DuckDBPyConnection, digests: Iterable[str]) -> set[str]:
    """The digests among `digests` whose file is recorded in `ingested_files`.

    Args:
        con: an open (read-only is enough) connection.
        digests: sha256 hex digests of file contents.
    Returns:
        The subset already ingested, under whatever name.
    """
    wanted = sorted(set(digests))
    if not wanted:
        return set()
    rows = execute(con, "SELECT file_sha256 FROM ingested_files WHERE list_contains(?, file_sha256)", [wanted])
    return {r[0] for r in rows}
