"""Dataset versions (frozen snapshots of measurements) and their forecasting pairs.

A dataset version names a digest, counts, the measurement ids it was built from and its pairs.
Versions are immutable: registering the same version with the same digest is a no-op, with
another digest an error. `write_dataset` does both parts in one transaction.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa

from warehouse.db import execute, query_frame, registered, transaction
from warehouse.errors import ValidationError
from warehouse.frames import (
    Frame,
    check_in,
    check_positive_finite,
    conform,
    insert_frame,
    json_text,
    to_polars,
)

PAIR_TYPES = ("reference", "parent", "cross")
SPLITS = ("train", "eval", "discovery")
PAIR_COLUMNS = (
    "pair_id",
    "dataset_version",
    "task",
    "hardware_id",
    "anchor_kernel_id",
    "candidate_kernel_id",
    "anchor_measurement_id",
    "candidate_measurement_id",
    "speedup",
    "true_bin",
    "pair_type",
    "split",
)
_PAIR_REQUIRED = (
    "task",
    "hardware_id",
    "anchor_kernel_id",
    "candidate_kernel_id",
    "speedup",
    "true_bin",
    "pair_type",
    "split",
)


def make_pair_id(
    dataset_version: str, hardware_id: str, anchor_kernel_id: str, candidate_kernel_id: str
) -> str:
    """Deterministic pair id: the same pair in the same dataset version has the same id.

    >>> len(make_pair_id("v1", "nvidia-h200-sm90", "a" * 64, "b" * 64))
    24
    """
    key = f"{dataset_version}:{hardware_id}:{anchor_kernel_id}:{candidate_kernel_id}"
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def _pair_rows(frame: Frame, dataset_version: str) -> pl.DataFrame:
    """Validated pair rows for one version; fills pair_id where absent."""
    rows = to_polars(frame, "pairs")
    if "S" in rows.columns and "speedup" not in rows.columns:
        rows = rows.rename({"S": "speedup"})
    if "dataset_version" in rows.columns:
        other = rows.filter(pl.col("dataset_version") != dataset_version).height
        if other:
            raise ValidationError(
                f"pairs: {other} row(s) carry a dataset_version other than {dataset_version!r}"
            )
    rows = rows.with_columns(pl.lit(dataset_version).alias("dataset_version"))
    rows = conform(rows, PAIR_COLUMNS, _PAIR_REQUIRED, "pairs")
    computed = [
        make_pair_id(dataset_version, h, a, c)
        for h, a, c in rows.select(
            "hardware_id", "anchor_kernel_id", "candidate_kernel_id"
        ).iter_rows()
    ]
    rows = (
        rows.with_columns(pl.Series("_computed", computed, dtype=pl.String))
        .with_columns(
            pl.coalesce(pl.col("pair_id").cast(pl.String), pl.col("_computed")).alias("pair_id"),
            pl.col("speedup").cast(pl.Float64),
        )
        .drop("_computed")
    )
    check_positive_finite(rows, "speedup", "pairs")
    check_in(rows, "true_bin", range(1, 9), "pairs")
    check_in(rows, "pair_type", PAIR_TYPES, "pairs")
    check_in(rows, "split", SPLITS, "pairs")
    dup = rows.filter(pl.col("pair_id").is_duplicated())
    if dup.height:
        raise ValidationError(
            f"pairs: pair_id {dup['pair_id'][0]} appears {dup.height} times; dedupe pairs first"
        )
    return rows


def write_pairs(con: duckdb.DuckDBPyConnection, frame: Frame, dataset_version: str) -> int:
    """Add pairs to a dataset version; pairs already present (same pair_id) are kept as they are.

    Args:
        con: a writable connection.
        frame: task, hardware_id, anchor_kernel_id, candidate_kernel_id, speedup (or S),
            true_bin (1..8), pair_type (reference|parent|cross), split (train|eval|discovery),
            optional pair_id (default `make_pair_id`), anchor/candidate_measurement_id.
        dataset_version: the version these pairs belong to.
    Returns:
        Pairs newly added.
    Raises:
        ValidationError: a missing column, S not finite and > 0, a bad bin, type or split,
            a repeated pair_id; nothing is written.
    """
    rows = _pair_rows(frame, dataset_version)
    with transaction(con):
        return insert_frame(con, "pairs", rows, ["pair_id"], "nothing")


def read_pairs(
    con: duckdb.DuckDBPyConnection, dataset_version: str, split: str | None = None
) -> pl.DataFrame:
    """Pairs of one dataset version, optionally one split, ordered by pair_id.

    Args:
        con: an open connection.
        dataset_version: the version.
        split: "train" | "eval" | "discovery", or None for all.
    Returns:
        The pairs table's rows.
    """
    sql, params = "SELECT * FROM pairs WHERE dataset_version = ?", [dataset_version]
    if split is not None:
        if split not in SPLITS:
            raise ValidationError(f"split {split!r} is not one of {list(SPLITS)}")
        sql += " AND split = ?"
        params.append(split)
    return query_frame(con, sql + " ORDER BY pair_id", params)


def _register(
    con: duckdb.DuckDBPyConnection,
    version: str,
    digest: str,
    counts: Mapping[str, Any] | None,
    measurement_ids: Iterable[str],
) -> bool:
    """register_dataset_version without its own transaction."""
    ids = sorted(set(measurement_ids))
    known = execute(
        con, "SELECT content_digest FROM dataset_versions WHERE dataset_version = ?", [version]
    )
    if known:
        if known[0][0] != digest:
            raise ValidationError(
                f"dataset version {version!r} exists with digest {known[0][0][:12]}, not {digest[:12]}; versions are immutable"
            )
        return False
    ids_table = pa.table(
        {
            "dataset_version": pa.array([version] * len(ids), pa.string()),
            "measurement_id": pa.array(ids, pa.string()),
        }
    )
    with registered(con, "_dataset_ids", ids_table):
        missing = execute(
            con,
            "SELECT count(*), min(measurement_id) FROM _dataset_ids "
            "WHERE measurement_id NOT IN (SELECT measurement_id FROM measurements)",
        )[0]
        if missing[0]:
            raise ValidationError(
                f"dataset version {version!r}: {missing[0]} unknown measurement id(s), e.g. {missing[1]}"
            )
        execute(
            con,
            "INSERT INTO dataset_versions (dataset_version, content_digest, counts, n_measurements) VALUES (?, ?, ?, ?)",
            [version, digest, json_text(dict(counts or {}), "dataset_versions.counts"), len(ids)],
        )
        execute(
            con,
            "INSERT INTO dataset_measurements SELECT dataset_version, measurement_id FROM _dataset_ids",
        )
    return True


def register_dataset_version(
    con: duckdb.DuckDBPyConnection,
    version: str,
    digest: str,
    counts: Mapping[str, Any] | None,
    measurement_ids: Iterable[str],
) -> bool:
    """Record a dataset version and the measurements behind it.

    Args:
        con: a writable connection.
        version: the dataset version name.
        digest: content digest of the snapshot.
        counts: JSON-serialisable summary counts.
        measurement_ids: every measurement the version was built from (all must exist).
    Returns:
        True when newly registered, False when it already existed with this digest.
    Raises:
        ValidationError: the version exists with another digest, or an unknown measurement id;
            nothing is written.
    """
    with transaction(con):
        return _register(con, version, digest, counts, measurement_ids)


def write_dataset(
    con: duckdb.DuckDBPyConnection,
    version: str,
    digest: str,
    counts: Mapping[str, Any] | None,
    measurement_ids: Iterable[str],
    pairs: Frame,
) -> int:
    """Register a dataset version and write its pairs in one transaction.

    Args:
        con: a writable connection.
        version, digest, counts, measurement_ids: as `register_dataset_version`.
        pairs: as `write_pairs`.
    Returns:
        Pairs newly added (0 when the version already existed with this digest).
    Raises:
        ValidationError: as `register_dataset_version` and `write_pairs`; nothing is written.
    """
    rows = _pair_rows(pairs, version)
    with transaction(con):
        _register(con, version, digest, counts, measurement_ids)
        return insert_frame(con, "pairs", rows, ["pair_id"], "nothing")


def read_dataset_version(con: duckdb.DuckDBPyConnection, version: str) -> dict[str, Any] | None:
    """One dataset version's record with decoded counts, or None if unknown.

    Returns:
        dict with dataset_version, content_digest, counts (dict), n_measurements, created_at.
    """
    rows = query_frame(
        con, "SELECT * FROM dataset_versions WHERE dataset_version = ?", [version]
    ).to_dicts()
    if not rows:
        return None
    row = rows[0]
    row["counts"] = json.loads(row["counts"]) if row["counts"] else {}
    return row


def list_dataset_versions(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Every dataset version, newest first, with its pair count."""
    return query_frame(
        con,
        """
        SELECT d.*, (SELECT count(*) FROM pairs p WHERE p.dataset_version = d.dataset_version) AS pairs
        FROM dataset_versions d ORDER BY d.created_at DESC, d.dataset_version DESC
        """,
    )


def current_dataset_version(con: duckdb.DuckDBPyConnection) -> str | None:
    """The newest dataset version (what the downstream assets read), or None before the first."""
    rows = execute(con, "SELECT dataset_version FROM dataset_versions ORDER BY created_at DESC, dataset_version DESC LIMIT 1")
    return rows[0][0] if rows else None


def dataset_measurement_ids(con: duckdb.DuckDBPyConnection, version: str) -> list[str]:
    """The measurement ids behind a dataset version, sorted (e.g. for an MLflow artifact)."""
    rows = execute(
        con,
        "SELECT measurement_id FROM dataset_measurements WHERE dataset_version = ? ORDER BY 1",
        [version],
    )
    return [r[0] for r in rows]


def pair_measurement_ids(con: duckdb.DuckDBPyConnection, dataset_version: str, pairs: pl.DataFrame) -> list[str]:
    """The measurements of a dataset version behind some of its pairs, sorted: those of each
    pair's anchor and candidate kernels on the pair's hardware (the measurements their labels
    were averaged from, pipelines.curation.pairs). What a model's fit used, when `pairs` are its
    fit pairs.

    Args:
        con: an open connection.
        dataset_version: the version the pairs belong to.
        pairs: a frame with task, hardware_id, anchor_kernel_id, candidate_kernel_id, or with
            pair_id only (the version's stored pairs of those ids; ids it lacks are ignored).
    Returns:
        Measurement ids, each once.
    """
    if pairs.is_empty():
        return []
    kernel_columns = ("task", "hardware_id", "anchor_kernel_id", "candidate_kernel_id")
    if not set(kernel_columns) <= set(pairs.columns):
        with registered(con, "_pair_ids", pairs.select(pl.col("pair_id").cast(pl.Utf8)).unique().to_arrow()):
            pairs = query_frame(con, f"SELECT {', '.join(kernel_columns)} FROM pairs "
                                     "WHERE dataset_version = ? AND pair_id IN (SELECT pair_id FROM _pair_ids)",
                                [dataset_version])
        if pairs.is_empty():
            return []
    keys = pl.concat([pairs.select("task", "hardware_id", pl.col(side).alias("kernel_id"))
                      for side in ("anchor_kernel_id", "candidate_kernel_id")]).unique()
    with registered(con, "_pair_kernels", keys.to_arrow()):
        rows = execute(
            con,
            "SELECT DISTINCT m.measurement_id FROM dataset_measurements d "
            "JOIN measurements m ON m.measurement_id = d.measurement_id "
            "JOIN _pair_kernels k ON k.task = m.task AND k.hardware_id = m.hardware_id AND k.kernel_id = m.kernel_id "
            "WHERE d.dataset_version = ? ORDER BY 1",
            [dataset_version],
        )
    return [r[0] for r in rows]


def held_measurements(con: duckdb.DuckDBPyConnection, dataset_version: str) -> tuple[bool, list[str] | None]:
    """(whether this warehouse holds `dataset_version`, its measurement ids or None): a model's
    lineage names the dataset it was fitted on, and says so when that version is gone."""
    if read_dataset_version(con, dataset_version) is None:
        return False, None
    return True, dataset_measurement_ids(con, dataset_version)
