"""One call from measurements to a versioned, leakage-free dataset (what `curated_pairs` stores)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from pipelines.curation.hardware import reference_hardware
from pipelines.curation.pairs import build_pairs, labels
from pipelines.curation.splits import SplitConfig, Splits, find_leakage, make_splits
from pipelines.curation.versions import DatasetVersion, dataset_version


@dataclass(frozen=True)
class CuratedDataset:
    labels: pl.DataFrame  # one row per (task, hardware, kernel)
    pairs: pl.DataFrame  # every pair of every split, with `split`
    splits: Splits
    version: DatasetVersion
    measurement_ids: list[str]
    leakage: list[str]  # training pair ids that leak eval information; must be empty


def curate(measurements: pl.DataFrame, reference_kernel_ids: dict[str, str], *, per_bin: int, lineage_k: int,
           holdout_tasks: tuple[str, ...], cross_per_task: int, seed: int,
           preferred_hardware: str | None = None) -> CuratedDataset:
    """Labels -> pairs -> splits -> dataset version.

    Args:
        measurements: the warehouse's measurements joined with kernel lineage.
        reference_kernel_ids: task -> kernel id of its PyTorch reference (the anchor).
        per_bin, lineage_k, holdout_tasks: split settings (see SplitConfig).
        cross_per_task: cap of cross pairs per task and hardware.
        seed: seed of every deterministic draw.
        preferred_hardware: the reference hardware when it has eval pairs (else the hardware
            with the most; `pipelines.curation.hardware.reference_hardware`), recorded in the
            version's counts.
    """
    lab = labels(measurements)
    pairs = build_pairs(lab, reference_kernel_ids=reference_kernel_ids, cross_per_task=cross_per_task, seed=seed)
    # The generator names the kernels the template generator did not write (the external split);
    # the hardware, which kernels split each card's pairs (make_splits splits each on its own).
    lineage = measurements.select("hardware_id", "kernel_id", "parent_kernel_id",
                                  *(["generator"] if "generator" in measurements.columns else [])) \
        .unique(["hardware_id", "kernel_id"], keep="first")
    config = SplitConfig(per_bin=per_bin, lineage_k=lineage_k, holdout_tasks=holdout_tasks, seed=seed)
    splits = make_splits(pairs, lineage, config)
    all_pairs = splits.all_pairs()
    ids = sorted({m for ms in all_pairs["measurement_ids"].to_list() for m in (ms or [])})
    version = dataset_version(all_pairs, ids)
    # Which card the in-distribution forecasters are fitted and scored on (not in the digest).
    version = replace(version, counts={**version.counts,
                                       "reference_hardware": reference_hardware(splits.eval_set, preferred_hardware)})
    evals = splits.eval_set if splits.external_set is None else pl.concat([splits.eval_set, splits.external_set])
    leakage = find_leakage(evals, splits.rl_training_pool, lineage, lineage_k=lineage_k, holdout_tasks=holdout_tasks)
    return CuratedDataset(lab, all_pairs, splits, version, ids, leakage)


def warehouse_pairs(dataset: CuratedDataset, make_pair_id) -> pl.DataFrame:
    """Pairs in the warehouse's shape: pair ids qualified by the dataset version."""
    v = dataset.version.version
    return dataset.pairs.with_columns(
        pl.struct("hardware_id", "anchor_kernel_id", "candidate_kernel_id")
        .map_elements(lambda r: make_pair_id(v, r["hardware_id"], r["anchor_kernel_id"], r["candidate_kernel_id"]), return_dtype=pl.String)
        .alias("pair_id")
    ).drop("measurement_ids", strict=False)
