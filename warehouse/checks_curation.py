"""Queries behind the curation assets and their checks."""

from __future__ import annotations

import duckdb

from warehouse.db import execute


def reference_kernel_ids(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """task -> kernel id of the task's PyTorch reference (generator 'reference')."""
    rows = execute(con, "SELECT task, min(kernel_id) FROM kernels WHERE generator = 'reference' GROUP BY task")
    return {t: k for t, k in rows}


def pairs_without_two_correct_measurements(con: duckdb.DuckDBPyConnection, dataset_version: str, limit: int = 20) -> list[str]:
    """Pairs of a version whose candidate, or whose anchor, has no correct measurement on the
    pair's hardware. The task reference needs none of its own: every measurement times it
    (a candidate's speedup IS its ratio to the reference)."""
    rows = execute(
        con,
        """
        WITH ok AS (
            SELECT DISTINCT kernel_id, hardware_id FROM measurements
            WHERE status = 'ok' AND protocol = 'kernelcast'
        ), refs AS (SELECT kernel_id FROM kernels WHERE generator = 'reference')
        SELECT p.pair_id FROM pairs p
        WHERE p.dataset_version = ?
          AND (NOT EXISTS (SELECT 1 FROM ok WHERE ok.kernel_id = p.candidate_kernel_id AND ok.hardware_id = p.hardware_id)
               OR (p.anchor_kernel_id NOT IN (SELECT kernel_id FROM refs)
                   AND p.anchor_kernel_id NOT LIKE 'reference:%'
                   AND NOT EXISTS (SELECT 1 FROM ok WHERE ok.kernel_id = p.anchor_kernel_id AND ok.hardware_id = p.hardware_id)))
        ORDER BY p.pair_id LIMIT ?
        """,
        [dataset_version, limit],
    )
    return [r[0] for r in rows]
