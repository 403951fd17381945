"""The `library` split: published kernels of public libraries and model code, measured from a
folder outside the repository (`KERNELCAST_LIBRARY_DIR`), read at evaluation time, never
committed and never learned from. It is a split's pairs like the others
(pipelines.surrogates.roles.LIBRARY_SPLIT), read where the forecasts are planned.

The folder holds what the worker writes (pipelines/profiling/formats.py) for the set that
`python -m pipelines.generation.library build` assembles: `kernels*.parquet` (KERNEL_BATCH_SCHEMA:
kernel_id, task, source, language, generator, ...) and `results*.parquet` (RESULT_SCHEMA). Labels
follow the curation's rule (pipelines.curation.pairs.labels: every measurement of a kernel on a
hardware ok, speedup the geometric mean, protocol kernelcast only); each correct kernel becomes a
reference pair against its task's reference kernel of the warehouse (the anchor the worker timed
it against). A missing generator is recorded as "library:<folder name>". A folder holding a
kernel the dataset version learns from (fit, calibration or eval pairs) is refused: the split
would no longer measure kernels a forecaster never saw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from models.bins import speedups_to_bins

ENV = "KERNELCAST_LIBRARY_DIR"
KERNEL_COLUMNS = ("kernel_id", "task", "source")
RESULT_COLUMNS = ("kernel_id", "task", "status", "speedup", "hardware_id")


def _read(files: list[Path], needed: tuple[str, ...], what: str) -> pl.DataFrame:
    frames = []
    for f in files:
        try:
            frame = pl.read_parquet(f)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is one line
            raise ValueError(f"library {what} file {f} unreadable: {str(exc).splitlines()[0]}") from None
        missing = [c for c in needed if c not in frame.columns]
        if missing:
            raise ValueError(f"library {what} file {f} lacks column(s) {', '.join(missing)}")
        frames.append(frame)
    return pl.concat(frames, how="diagonal_relaxed")


def read_library_dir(folder: str | Path, reference_ids: dict[str, str],
                     learned_ids: set[str] | frozenset[str] = frozenset()
                     ) -> tuple[pl.DataFrame, dict[str, dict[str, Any]]]:
    """(reference pairs, kernel records) of the published kernels in `folder`.

    Args:
        folder: the folder of kernels*/results* Parquet files.
        reference_ids: task -> the warehouse's reference kernel id (the pairs' anchor); a task
            without one is left out.
        learned_ids: the kernel ids the dataset version's forecasters learn from or are
            calibrated or scored on; none may be in the folder.
    Returns:
        Pairs (pair_id "library:<hash>", task, hardware_id, anchor_kernel_id,
        candidate_kernel_id, speedup, true_bin, pair_type 'reference', split 'library') and the
        candidates' records (RECORD_FIELDS of pipelines.surrogates.classical).
    Raises:
        ValueError: one line, on a missing folder, no files, an unreadable file, missing columns,
            or a kernel of the folder that the version learns from.
    """
    from pipelines.curation.pairs import labels, pair_id
    from pipelines.surrogates.classical import RECORD_FIELDS

    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"{ENV}={root} is not a folder")
    kernel_files, result_files = sorted(root.rglob("kernels*.parquet")), sorted(root.rglob("results*.parquet"))
    if not kernel_files or not result_files:
        raise ValueError(f"{ENV}={root} holds no kernels*.parquet and results*.parquet files")
    kernels = _read(kernel_files, KERNEL_COLUMNS, "kernels").unique("kernel_id", keep="first")
    leaked = sorted(set(kernels["kernel_id"].to_list()) & set(learned_ids))
    if leaked:
        raise ValueError(f"{ENV}={root} holds {len(leaked)} kernel(s) the dataset version learns from "
                         f"(e.g. {leaked[0][:12]}): a library kernel must never be learned from")
    results = _read(result_files, RESULT_COLUMNS, "results")
    default_gen = f"library:{root.name}"
    gen = pl.col("generator").cast(pl.Utf8) if "generator" in kernels.columns else pl.lit(None, dtype=pl.Utf8)
    kernels = kernels.with_columns(pl.when(gen.is_null() | gen.is_in(["kernelcast-space", "reference"]))
                                   .then(pl.lit(default_gen)).otherwise(gen).alias("generator"))
    results = results.with_row_index("_i").with_columns(
        pl.format("library:{}:{}", pl.col("kernel_id"), pl.col("_i")).alias("measurement_id")).drop("_i")
    attrs = [c for c in ("generator", "algorithm", "parent_kernel_id", "mutation") if c in kernels.columns]
    measured = results.drop([c for c in attrs if c in results.columns]).join(
        kernels.select("kernel_id", *attrs), on="kernel_id", how="inner")
    lab = labels(measured).filter(pl.col("correct") & pl.col("speedup").is_not_null())
    lab = lab.filter(pl.col("task").is_in(list(reference_ids)))
    s = lab["speedup"].to_numpy()
    anchors = [reference_ids[t] for t in lab["task"].to_list()]
    pairs = pl.DataFrame({
        "pair_id": [f"library:{pair_id(h, a, c)}" for h, a, c in zip(lab["hardware_id"], anchors, lab["kernel_id"])],
        "task": lab["task"], "hardware_id": lab["hardware_id"], "anchor_kernel_id": anchors,
        "candidate_kernel_id": lab["kernel_id"], "speedup": s,
        "true_bin": speedups_to_bins(s).astype("int64") if len(s) else [], "pair_type": "reference",
        "split": "library"}, schema_overrides={"true_bin": pl.Int64, "speedup": pl.Float64})
    keep = set(lab["kernel_id"].to_list())
    records = {}
    for k in kernels.filter(pl.col("kernel_id").is_in(list(keep))).to_dicts():
        records[k["kernel_id"]] = {f: k.get(f) for f in RECORD_FIELDS}
    return pairs.sort("pair_id"), records
