"""What is left to measure: kernels of the warehouse not yet measured on a hardware type."""

from __future__ import annotations

import duckdb
import polars as pl

from warehouse.db import query_frame


def unmeasured_kernels(con: duckdb.DuckDBPyConnection, hardware_id: str, limit: int) -> pl.DataFrame:
    """Triton kernels with no measurement on `hardware_id`, oldest first (kernel_id breaks ties).

    Kernels that failed the CPU interpreter check or were rejected by the sm_90 compile are
    skipped: measuring them only spends GPU time on a known failure.
    """
    return query_frame(
        con,
        """
        SELECT k.kernel_id, k.task, k.source
        FROM kernels k
        WHERE k.language = 'triton'
          AND NOT EXISTS (SELECT 1 FROM measurements m WHERE m.kernel_id = k.kernel_id AND m.hardware_id = ?)
          AND NOT EXISTS (SELECT 1 FROM kernel_checks c WHERE c.kernel_id = k.kernel_id AND NOT c.ok)
          AND NOT EXISTS (SELECT 1 FROM kernel_features f WHERE f.kernel_id = k.kernel_id AND f.status = 'rejected')
        ORDER BY k.created_at, k.kernel_id
        LIMIT ?
        """,
        [hardware_id, limit],
    )
