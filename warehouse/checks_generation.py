"""Checks on the generated kernels, as SQL the kernel_candidates asset checks call."""

from __future__ import annotations

import duckdb

from warehouse.db import execute


def orphan_parents(con: duckdb.DuckDBPyConnection, limit: int = 20) -> list[str]:
    """Kernels whose parent_kernel_id names no kernel in the table (lineage broken)."""
    rows = execute(
        con,
        """
        SELECT k.kernel_id FROM kernels k
        WHERE k.parent_kernel_id IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM kernels p WHERE p.kernel_id = k.parent_kernel_id)
        ORDER BY k.kernel_id LIMIT ?
        """,
        [limit],
    )
    return [r[0] for r in rows]


def without_compile_record(con: duckdb.DuckDBPyConnection, kernel_ids: list[str], target: str, limit: int = 20) -> list[str]:
    """Of `kernel_ids`, those with no kernel_features row for `target`."""
    if not kernel_ids:
        return []
    rows = execute(
        con,
        """
        SELECT k.id FROM unnest(?::VARCHAR[]) AS k(id)
        WHERE NOT EXISTS (SELECT 1 FROM kernel_features f WHERE f.kernel_id = k.id AND f.target = ?)
        ORDER BY k.id LIMIT ?
        """,
        [kernel_ids, target, limit],
    )
    return [r[0] for r in rows]


def known_kernels(con: duckdb.DuckDBPyConnection, kernel_ids: list[str], target: str) -> set[str]:
    """Of `kernel_ids`, those already in `kernels` with a compile record for `target`."""
    if not kernel_ids:
        return set()
    rows = execute(
        con,
        """
        SELECT k.id FROM unnest(?::VARCHAR[]) AS k(id)
        WHERE EXISTS (SELECT 1 FROM kernels x WHERE x.kernel_id = k.id)
          AND EXISTS (SELECT 1 FROM kernel_features f WHERE f.kernel_id = k.id AND f.target = ?)
        """,
        [kernel_ids, target],
    )
    return {r[0] for r in rows}
