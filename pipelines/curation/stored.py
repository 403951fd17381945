"""The dataset the `curated_pairs` asset stores: curated from the warehouse's measurements and
written back as DuckDB `pairs` under its version."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from pipelines.curation.dataset import CuratedDataset, curate, warehouse_pairs

REPORT_SPLITS = ("eval", "train", "discovery")


@dataclass(frozen=True)
class StoredDataset:
    """A curated dataset as written: its rows, what the write added, and what the checks read."""

    dataset: CuratedDataset
    rows: pl.DataFrame  # the warehouse's `pairs` rows of this version
    rows_added: int
    unsupported: list[str]  # pair ids without two correct measurements behind them

    @property
    def version(self) -> str:
        return self.dataset.version.version

    def split_rows(self, split: str) -> pl.DataFrame:
        return self.rows.filter(pl.col("split") == split)

    @property
    def shortfall(self) -> pl.DataFrame:
        """The (task, hardware, bin) cells of the eval set short of their target."""
        return self.dataset.splits.shortfall.filter(pl.col("shortfall") > 0)


def curate_and_store(warehouse_path: str | Path, curation: Any) -> StoredDataset:
    """Curate every hardware's measurements and write the dataset version.

    Args:
        warehouse_path: the DuckDB file (written: `pairs`, `dataset_versions`).
        curation: the curation settings (eval_per_bin, lineage_k, holdout_tasks,
            cross_pairs_per_task, seed, reference_hardware).
    """
    from warehouse import checks_curation
    from warehouse.datasets import make_pair_id, write_dataset
    from warehouse.db import connect
    from warehouse.measurements import measurements_frame

    with connect(warehouse_path) as con:
        frame = measurements_frame(con)
        refs = checks_curation.reference_kernel_ids(con)
    ds = curate(frame, refs, per_bin=curation.eval_per_bin, lineage_k=curation.lineage_k,
                holdout_tasks=curation.holdout_tasks, cross_per_task=curation.cross_pairs_per_task, seed=curation.seed,
                preferred_hardware=getattr(curation, "reference_hardware", None))
    rows = warehouse_pairs(ds, make_pair_id)
    with connect(warehouse_path) as con:
        added = write_dataset(con, ds.version.version, ds.version.digest, ds.version.counts, ds.measurement_ids, rows)
        unsupported = checks_curation.pairs_without_two_correct_measurements(con, ds.version.version)
    return StoredDataset(ds, rows, added, unsupported)
