"""Data checks on the measurements of one hardware partition, as SQL the asset checks call.

Each returns the offending ids (empty = the check passes), so a check's metadata can show a few.
"""

from __future__ import annotations

import duckdb

from warehouse.db import execute


def ok_without_every_case(con: duckdb.DuckDBPyConnection, hardware_id: str, limit: int = 20) -> list[str]:
    """Measurements with a speedup whose cases do not cover every benchmark case of their task.

    "No speedup without correctness" means every benchmark case was run, checked and timed; a
    row that timed fewer cases (or whose per-case lists disagree) cannot carry a speedup.
    """
    rows = execute(
        con,
        """
        SELECT m.measurement_id
        FROM measurements m LEFT JOIN tasks t USING (task)
        WHERE m.hardware_id = ? AND m.status = 'ok' AND m.protocol = 'kernelcast'
          AND (t.task IS NULL
               OR len(m.case_ids) <> json_array_length(t.benchmark_cases)
               OR len(m.case_speedups) <> len(m.case_ids)
               OR list_min(m.case_speedups) <= 0)
        ORDER BY m.measurement_id LIMIT ?
        """,
        [hardware_id, limit],
    )
    return [r[0] for r in rows]


def nonfinite_speedups(con: duckdb.DuckDBPyConnection, hardware_id: str, limit: int = 20) -> list[str]:
    """Measurements whose speedup (or a per-case speedup) is NaN, infinite or not positive."""
    rows = execute(
        con,
        """
        SELECT measurement_id FROM measurements
        WHERE hardware_id = ? AND status = 'ok'
          AND (NOT isfinite(speedup) OR speedup <= 0
               OR list_bool_or(list_transform(case_speedups, lambda x: NOT isfinite(x))))
        ORDER BY measurement_id LIMIT ?
        """,
        [hardware_id, limit],
    )
    return [r[0] for r in rows]


def batches_with_several_fingerprints(con: duckdb.DuckDBPyConnection, hardware_id: str) -> list[str]:
    """Batches whose measurements do not all point at one recorded fingerprint of this hardware."""
    rows = execute(
        con,
        """
        SELECT m.batch_id
        FROM measurements m LEFT JOIN batches b USING (batch_id)
        WHERE m.hardware_id = ?
        GROUP BY m.batch_id
        HAVING count(DISTINCT b.hardware_json) <> 1 OR bool_or(b.hardware_id <> m.hardware_id)
        ORDER BY m.batch_id
        """,
        [hardware_id],
    )
    return [r[0] for r in rows]


def partition_counts(con: duckdb.DuckDBPyConnection, hardware_id: str) -> dict[str, int]:
    """Rows, correct rows and batches of one hardware partition."""
    n, ok, batches = execute(
        con,
        "SELECT count(*), count(*) FILTER (WHERE status = 'ok'), count(DISTINCT batch_id) "
        "FROM measurements WHERE hardware_id = ?",
        [hardware_id],
    )[0]
    return {"measurements": int(n), "correct": int(ok or 0), "batches": int(batches)}
