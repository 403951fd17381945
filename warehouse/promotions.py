"""Promotion decisions: what model_promotion decided, on which pairs and scores (migrations 002, 006).

One row per champion alias and run: `alias` is "champion" (decided on in_distribution) or
"champion-external" (on external, or source_only while external is empty: `decided_on_split`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import duckdb
import polars as pl

from warehouse.db import execute, query_frame, transaction

OUTCOMES = ("promoted", "kept", "held_back", "no_candidates")
DECISION_ALIASES = ("champion", "champion-external")


def record_promotion_decision(
    con: duckdb.DuckDBPyConnection,
    model_name: str,
    dataset_version: str | None,
    outcome: str,
    reason: str,
    n_pairs: int,
    policy: Mapping[str, Any],
    scores: Sequence[Mapping[str, Any]],
    champion_before: int | None = None,
    champion_after: int | None = None,
    candidate: int | None = None,
    dagster_run_id: str | None = None,
    alias: str = "champion",
    split: str = "in_distribution",
    challenger_after: int | None = None,
) -> str:
    """Write one decision and the score row of every version it weighed, in one transaction.

    Args:
        con: a writable connection.
        model_name: the registered model.
        dataset_version: whose eval pairs the versions were scored on (None: no dataset yet).
        outcome: one of OUTCOMES.
        reason: the rule's one-line reason.
        n_pairs: the common eval pairs of the comparison.
        policy: the thresholds (stored as JSON).
        scores: one mapping per version: model_version, kind, role ("champion" or
            "challenger"), n_pairs, parse_rate, brier, uniform_brier, failed_gates (list).
        champion_before, champion_after, candidate: versions, or None.
        dagster_run_id: the run that decided.
        alias: the champion alias decided (DECISION_ALIASES).
        split: the split it was decided on.
        challenger_after: the version its challenger alias names afterwards, or None.
    Returns:
        The decision id.
    Raises:
        ValueError: an unknown outcome or alias (nothing is written).
    """
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
    if alias not in DECISION_ALIASES:
        raise ValueError(f"alias must be one of {DECISION_ALIASES}, got {alias!r}")
    now = datetime.now(UTC)
    # The alias is part of the id: one run decides both aliases within the same microsecond range.
    decision_id = hashlib.sha256(f"{model_name}:{alias}:{dagster_run_id}:{now.isoformat()}".encode()).hexdigest()[:24]

    def text(v: int | None) -> str | None:
        return None if v is None else str(v)

    with transaction(con):
        execute(
            con,
            """INSERT INTO promotion_decisions (decision_id, model_name, dataset_version, outcome, champion_before,
                   champion_after, candidate, reason, n_pairs, policy_json, dagster_run_id, decided_at, alias,
                   decided_on_split, challenger_after)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            [decision_id, model_name, dataset_version, outcome, text(champion_before), text(champion_after),
             text(candidate), reason, int(n_pairs), json.dumps(dict(policy), sort_keys=True), dagster_run_id, now,
             alias, split, text(challenger_after)],
        )
        for s in scores:
            execute(
                con,
                """INSERT INTO promotion_scores (decision_id, model_version, kind, role, n_pairs, parse_rate, brier,
                       uniform_brier, failed_gates) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                [decision_id, str(s["model_version"]), s.get("kind"), s["role"], int(s["n_pairs"]),
                 _finite(s.get("parse_rate")), _finite(s.get("brier")), _finite(s.get("uniform_brier")),
                 list(s.get("failed_gates") or [])],
            )
    return decision_id


def _finite(value: Any) -> float | None:
    """NaN (a version with no scored pairs) is stored as NULL."""
    return None if value is None or value != value else float(value)


def read_promotion_decisions(con: duckdb.DuckDBPyConnection, model_name: str | None = None,
                             alias: str | None = "champion") -> pl.DataFrame:
    """Decisions, newest first (optionally of one model), of one champion alias (None: both)."""
    clauses = [c for c, v in (("model_name = ?", model_name), ("alias = ?", alias)) if v]
    params = [v for v in (model_name, alias) if v] or None
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    return query_frame(con, f"SELECT * FROM promotion_decisions {where} ORDER BY decided_at DESC", params)


def read_promotion_scores(con: duckdb.DuckDBPyConnection, decision_id: str) -> pl.DataFrame:
    """The score rows of one decision, ordered by version."""
    return query_frame(
        con,
        "SELECT * FROM promotion_scores WHERE decision_id = ? ORDER BY try_cast(model_version AS BIGINT)",
        [decision_id],
    )
