"""From measurements to labelled kernels to forecasting pairs (method.md section 1).

A kernel is correct on a hardware only if EVERY one of its measurements there is ok (with a
finite positive speedup); one failure anywhere and it never becomes a label. Its speedup is
the geometric mean of its ok speedups (each already a geomean over benchmark cases against
the task's PyTorch reference, measured in the same process). The task reference has speedup
1 by definition, measured or not. Only measurements of one protocol ('kernelcast') label.

Pairs (anchor A, candidate C, same task and hardware, S = speedup(C) / speedup(A)):
- 'reference': every correct candidate against the task reference (S = speedup(C));
- 'parent': a correct child against its correct parent (discovery moments); a child of
  the reference itself is already a reference pair and is not repeated;
- 'cross': two candidates of one task, drawn deterministically (seeded by task and
  hardware), capped per task and hardware, as the paper's RL pool.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping

import numpy as np
import polars as pl

from models.bins import speedups_to_bins

log = logging.getLogger(__name__)

LABEL_KEYS = ("task", "hardware_id", "kernel_id")
KERNEL_ATTRS = ("generator", "algorithm", "parent_kernel_id", "mutation")
REQUIRED_MEASUREMENT_COLS = ("measurement_id", "kernel_id", "task", "hardware_id", "status", "speedup")
PAIR_COLUMNS = (
    "pair_id", "task", "hardware_id", "anchor_kernel_id", "candidate_kernel_id",
    "anchor_speedup", "candidate_speedup", "speedup", "true_bin", "pair_type", "measurement_ids",
)
DEFAULT_PROTOCOL = "kernelcast"
DEFAULT_CROSS_PER_TASK = 200


def pair_id(hardware_id: str, anchor_kernel_id: str, candidate_kernel_id: str) -> str:
    """sha256 of 'hardware|anchor|candidate', first 24 hex digits.

    >>> pair_id("h", "a", "c") == pair_id("h", "a", "c") != pair_id("h", "c", "a")
    True
    """
    key = f"{hardware_id}|{anchor_kernel_id}|{candidate_kernel_id}"
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def synthetic_reference_id(task: str) -> str:
    """Anchor id for a task whose reference kernel id is unknown."""
    return f"reference:{task}"


def labels(measurements: pl.DataFrame, *, protocol: str = DEFAULT_PROTOCOL) -> pl.DataFrame:
    """One row per (task, hardware_id, kernel_id): correctness, speedup, measurement ids.

    Args:
        measurements: one row per measurement (columns in REQUIRED_MEASUREMENT_COLS, and
            optionally failure_kind, protocol, generator, algorithm, parent_kernel_id,
            mutation).
        protocol: rows of other protocols are left out (they never label).
    Returns:
        Columns task, hardware_id, kernel_id, generator, algorithm, parent_kernel_id,
        mutation, n_measurements, n_ok, correct, speedup (null unless correct; 1.0 for the
        reference), failure_kinds (list), measurement_ids (sorted list). Sorted by key.
    Raises:
        ValueError: on missing columns.
    """
    missing = [c for c in REQUIRED_MEASUREMENT_COLS if c not in measurements.columns]
    if missing:
        raise ValueError(f"measurements are missing column(s): {', '.join(missing)}")
    m = measurements
    if "protocol" in m.columns:
        m = m.filter(pl.col("protocol") == protocol)
    for c in ("failure_kind", *KERNEL_ATTRS):
        if c not in m.columns:
            m = m.with_columns(pl.lit(None, dtype=pl.Utf8).alias(c))
    # An all-null column arrives as dtype Null; joins on it need a string type.
    m = m.with_columns(
        pl.col(c).cast(pl.Utf8)
        for c in ("measurement_id", "kernel_id", "task", "hardware_id", "status", "failure_kind", *KERNEL_ATTRS)
    )
    speedup = pl.col("speedup").cast(pl.Float64)
    # An 'ok' row without a finite positive speedup is a broken measurement, not a label.
    valid_ok = (pl.col("status") == "ok") & speedup.is_not_null() & speedup.is_finite() & (speedup > 0)
    m = m.with_columns(valid_ok.fill_null(False).alias("_ok"), speedup.alias("_s"))
    out = m.group_by(list(LABEL_KEYS)).agg(
        *[pl.col(c).drop_nulls().first().alias(c) for c in KERNEL_ATTRS],
        pl.len().alias("n_measurements"),
        pl.col("_ok").sum().cast(pl.Int64).alias("n_ok"),
        pl.col("_ok").all().alias("correct"),
        pl.col("_s").filter(pl.col("_ok")).log().mean().alias("_log_s"),
        pl.col("failure_kind").filter(~pl.col("_ok")).drop_nulls().unique().sort().alias("failure_kinds"),
        pl.col("measurement_id").cast(pl.Utf8).sort().alias("measurement_ids"),
    )
    is_ref = pl.col("generator").fill_null("") == "reference"
    out = out.with_columns(
        (pl.col("correct") | is_ref).alias("correct"),
        pl.when(is_ref)
        .then(pl.lit(1.0))
        .when(pl.col("correct"))
        .then(pl.col("_log_s").exp())
        .otherwise(None)
        .alias("speedup"),
    ).drop("_log_s")
    n_bad = out.filter(~pl.col("correct")).height
    log.info("labels: %d kernel-hardware rows, %d not correct", out.height, n_bad)
    return out.sort(list(LABEL_KEYS))


def reference_ids(labels_frame: pl.DataFrame, given: Mapping[str, str] | None = None) -> dict[str, str]:
    """Reference kernel id per task: `given`, else the labelled 'reference' kernel, else
    the synthetic 'reference:<task>'."""
    given = dict(given or {})
    found = (
        labels_frame.filter(pl.col("generator").fill_null("") == "reference")
        .group_by("task")
        .agg(pl.col("kernel_id").min())
    )
    from_labels = dict(zip(found["task"].to_list(), found["kernel_id"].to_list()))
    return {
        t: given.get(t) or from_labels.get(t) or synthetic_reference_id(t)
        for t in sorted(set(labels_frame["task"].to_list()) | set(given))
    }


def _finish(df: pl.DataFrame, pair_type: str) -> pl.DataFrame:
    """Add pair_id, S, true bin, type; keep PAIR_COLUMNS."""
    if df.height == 0:
        return _empty_pairs()
    df = df.with_columns(
        (pl.col("candidate_speedup") / pl.col("anchor_speedup")).alias("speedup"),
        pl.lit(pair_type).alias("pair_type"),
    )
    ids = [
        pair_id(h, a, c)
        for h, a, c in zip(df["hardware_id"], df["anchor_kernel_id"], df["candidate_kernel_id"])
    ]
    df = df.with_columns(
        pl.Series("pair_id", ids, dtype=pl.Utf8),
        pl.Series("true_bin", speedups_to_bins(df["speedup"].to_numpy()), dtype=pl.Int64),
    )
    return df.select(PAIR_COLUMNS)


def _empty_pairs() -> pl.DataFrame:
    schema = {c: pl.Utf8 for c in PAIR_COLUMNS}
    schema.update(anchor_speedup=pl.Float64, candidate_speedup=pl.Float64, speedup=pl.Float64,
                  true_bin=pl.Int64, measurement_ids=pl.List(pl.Utf8))
    return pl.DataFrame(schema=schema)


def _seeded_rng(seed: int, *parts: str) -> np.random.Generator:
    digest = hashlib.sha256("|".join([str(seed), *parts]).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _cross_index_pairs(n: int, cap: int, rng: np.random.Generator, skip: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """Up to `cap` distinct ordered (anchor, candidate) index pairs i != j, not in `skip`."""
    total = n * (n - 1) - len(skip)
    want = min(cap, max(total, 0))
    if want <= 0:
        return []
    if n * (n - 1) <= 4 * cap:  # small pool: shuffle the full list
        allp = [(i, j) for i in range(n) for j in range(n) if i != j and (i, j) not in skip]
        perm = rng.permutation(len(allp))
        return [allp[k] for k in perm[:want]]
    chosen: list[tuple[int, int]] = []
    seen = set(skip)
    while len(chosen) < want:  # big pool: rejection sampling terminates fast (density <= 1/4)
        i, j = (int(v) for v in rng.integers(0, n, size=2))
        if i != j and (i, j) not in seen:
            seen.add((i, j))
            chosen.append((i, j))
    return chosen


def build_pairs(
    labels_frame: pl.DataFrame,
    *,
    reference_kernel_ids: Mapping[str, str] | None = None,
    cross_per_task: int = DEFAULT_CROSS_PER_TASK,
    seed: int = 0,
) -> pl.DataFrame:
    """Reference, parent and cross pairs of the correct kernels.

    Args:
        labels_frame: output of `labels`.
        reference_kernel_ids: task -> reference kernel id (default: found or synthetic).
        cross_per_task: cap of cross pairs per task and hardware (0 disables them).
        seed: seed of the cross-pair draw.
    Returns:
        Pairs frame with PAIR_COLUMNS, sorted by pair_type, task, hardware_id, pair_id;
        measurement_ids is the sorted union of both kernels' measurement ids.
    """
    refs = reference_ids(labels_frame, reference_kernel_ids)
    ref_set = set(refs.values())
    ok = labels_frame.filter(pl.col("correct") & pl.col("speedup").is_not_null())
    cand = ok.filter(
        (pl.col("generator").fill_null("") != "reference") & ~pl.col("kernel_id").is_in(list(ref_set))
    )
    ref_frame = pl.DataFrame({"task": list(refs), "anchor_kernel_id": list(refs.values())})
    ref_mids = dict(zip(
        zip(ok["task"], ok["hardware_id"], ok["kernel_id"]), ok["measurement_ids"].to_list()
    ))

    # Reference pairs: S = speedup(C) / 1.
    joined = cand.join(ref_frame, on="task", how="inner")
    # A measured reference contributes its own measurement ids (it anchors the pair).
    mids = [
        sorted(set(m) | set(ref_mids.get((t, h, a), [])))
        for t, h, a, m in zip(
            joined["task"], joined["hardware_id"], joined["anchor_kernel_id"], joined["measurement_ids"].to_list()
        )
    ]
    reference = joined.select(
        "task", "hardware_id", "anchor_kernel_id",
        pl.col("kernel_id").alias("candidate_kernel_id"),
        pl.lit(1.0).alias("anchor_speedup"),
        pl.col("speedup").alias("candidate_speedup"),
    ).with_columns(pl.Series("measurement_ids", mids, dtype=pl.List(pl.Utf8)))

    # Parent pairs: both correct on the same hardware; children of the reference are skipped.
    parent_side = ok.select(
        "task", "hardware_id",
        pl.col("kernel_id").alias("parent_kernel_id"),
        pl.col("speedup").alias("anchor_speedup"),
        pl.col("measurement_ids").alias("_pm"),
    )
    parent = (
        cand.filter(pl.col("parent_kernel_id").is_not_null() & ~pl.col("parent_kernel_id").is_in(list(ref_set)))
        .join(parent_side, on=["task", "hardware_id", "parent_kernel_id"], how="inner")
        .select(
            "task", "hardware_id",
            pl.col("parent_kernel_id").alias("anchor_kernel_id"),
            pl.col("kernel_id").alias("candidate_kernel_id"),
            "anchor_speedup",
            pl.col("speedup").alias("candidate_speedup"),
            pl.concat_list("measurement_ids", "_pm").list.unique().list.sort().alias("measurement_ids"),
        )
    )
    parent_keys = set(zip(parent["hardware_id"], parent["anchor_kernel_id"], parent["candidate_kernel_id"]))

    # Cross pairs: a seeded draw per (task, hardware) over candidates sorted by id.
    rows = []
    if cross_per_task > 0:
        for (task, hw), grp in cand.sort("kernel_id").group_by(["task", "hardware_id"], maintain_order=True):
            ids = grp["kernel_id"].to_list()
            sp = grp["speedup"].to_list()
            mids = grp["measurement_ids"].to_list()
            pos = {k: i for i, k in enumerate(ids)}
            skip = {(pos[a], pos[c]) for h, a, c in parent_keys if h == hw and a in pos and c in pos}
            for i, j in _cross_index_pairs(len(ids), cross_per_task, _seeded_rng(seed, task, hw), skip):
                rows.append({
                    "task": task, "hardware_id": hw,
                    "anchor_kernel_id": ids[i], "candidate_kernel_id": ids[j],
                    "anchor_speedup": sp[i], "candidate_speedup": sp[j],
                    "measurement_ids": sorted(set(mids[i]) | set(mids[j])),
                })
    cross = pl.DataFrame(rows, schema={
        "task": pl.Utf8, "hardware_id": pl.Utf8, "anchor_kernel_id": pl.Utf8,
        "candidate_kernel_id": pl.Utf8, "anchor_speedup": pl.Float64,
        "candidate_speedup": pl.Float64, "measurement_ids": pl.List(pl.Utf8),
    })
    out = pl.concat([_finish(reference, "reference"), _finish(parent, "parent"), _finish(cross, "cross")])
    counts = out.group_by("pair_type").len().sort("pair_type").rows()
    log.info("pairs built: %s", dict(counts))
    return out.sort(["pair_type", "task", "hardware_id", "pair_id"])
