"""curated_pairs and its splits: a versioned, leakage-free pair dataset in DuckDB `pairs`."""


import dagster as dg

from assets._checks import offending_ids_result
from assets._metadata import markdown_table
from orchestration.resources import SettingsResource, WarehouseResource

GROUP = "curation"
NO_EVAL_TRAIN_LEAKAGE = "no_eval_train_leakage"
EVERY_BIN_POPULATED = "every_bin_populated"
PAIRS_NEED_TWO_CORRECT_MEASUREMENTS = "pairs_need_two_correct_measurements"

CURATION_OUTPUTS = {
    "curated_pairs": "Every pair of the current dataset version (reference, parent, cross), DuckDB `pairs`.",
    "eval_set": "Bin-balanced evaluation pairs (candidate vs task reference), split 'eval' of `pairs`.",
    "rl_training_pool": "Training pairs with no eval candidate within k mutations, split 'train' of `pairs`.",
    "discovery_pairs": "Parent -> child pairs of search lineages, split 'discovery' of `pairs`.",
}


@dg.multi_asset(
    specs=[
        dg.AssetSpec(name, group_name=GROUP, kinds={"duckdb", "polars"}, description=desc,
                     deps=["kernel_measurements"] if name == "curated_pairs" else ["curated_pairs"])
        for name, desc in CURATION_OUTPUTS.items()
    ],
    check_specs=[
        dg.AssetCheckSpec(NO_EVAL_TRAIN_LEAKAGE, asset="rl_training_pool", blocking=True,
                          description="No training pair shares a candidate, anchor or near lineage with an eval candidate."),
        dg.AssetCheckSpec(EVERY_BIN_POPULATED, asset="eval_set",
                          description="Every (task, bin) of the eval set reaches its target per bin. The selection "
                                      "takes every candidate a bin has, so a shortfall is a limit of the measured data "
                                      "(e.g. no matmul_bias_gelu kernel measured in bins 7-8), reported as a warning "
                                      "that names each task's short bins, never a curation fault."),
        dg.AssetCheckSpec(PAIRS_NEED_TWO_CORRECT_MEASUREMENTS, asset="curated_pairs", blocking=True),
    ],
    pool="duckdb_writer",
)
def curated_pairs(context: dg.AssetExecutionContext, settings: SettingsResource, warehouse: WarehouseResource):
    """Pairs from the measurements of every hardware, split without leakage and versioned."""
    from pipelines.curation.stored import REPORT_SPLITS, curate_and_store

    cur = settings.get().curation
    stored = curate_and_store(warehouse.path, cur)
    ds, rows, short = stored.dataset, stored.rows, stored.shortfall
    by_split = {s: stored.split_rows(s) for s in REPORT_SPLITS}
    common = {"table": "pairs", "dataset_version": stored.version}
    yield dg.MaterializeResult(asset_key="curated_pairs", metadata={**common, "rows": rows.height, "rows_added": stored.rows_added,
                               "measurements": len(ds.measurement_ids), "digest": ds.version.digest, "preview": _md(rows)})
    for asset_key, split in (("eval_set", "eval"), ("rl_training_pool", "train"), ("discovery_pairs", "discovery")):
        yield dg.MaterializeResult(asset_key=asset_key, metadata={**common, "rows": by_split[split].height,
                                                                  "preview": _md(by_split[split])})
    yield offending_ids_result(NO_EVAL_TRAIN_LEAKAGE, ds.leakage, asset_key="rl_training_pool")
    yield _every_bin_populated(short, cur.eval_per_bin, by_split["eval"].height)
    yield offending_ids_result(PAIRS_NEED_TWO_CORRECT_MEASUREMENTS, stored.unsupported, asset_key="curated_pairs")


def _md(df) -> dg.MetadataValue:
    """Pairs and bins per task of `df` (polars), the preview each curation output shows."""
    import polars as pl

    if df.is_empty():
        return dg.MetadataValue.md("(empty)")
    t = df.group_by("task").agg(pl.len().alias("pairs"), pl.col("true_bin").n_unique().alias("bins")).sort("task")
    return dg.MetadataValue.md(markdown_table(["task", "pairs", "bins"], t.iter_rows()))


def _every_bin_populated(short, per_bin: int, eval_rows: int) -> dg.AssetCheckResult:
    """The warning that names the eval set's short (task, bin) cells, from the shortfall frame."""
    return dg.AssetCheckResult(
        asset_key="eval_set", check_name=EVERY_BIN_POPULATED, passed=short.is_empty() and eval_rows > 0,
        severity=dg.AssetCheckSeverity.WARN,
        description=bins_short_text(short.iter_rows(named=True), per_bin, eval_rows),
        metadata={"cells_short": short.height, "target_per_bin": per_bin, "data_limitation": not short.is_empty(),
                  "bins_short_by_task": bins_short_text(short.iter_rows(named=True), per_bin, eval_rows, brief=True),
                  "shortfall": dg.MetadataValue.md(markdown_table(
                      ["task", "hardware", "bin", "available", "shortfall"],
                      short.head(40).select("task", "hardware_id", "bin", "available", "shortfall").iter_rows()))},
    )


def bins_short_text(short_rows, per_bin: int, eval_rows: int, brief: bool = False) -> str:
    """What the measured data lacks for the eval set, per task: its short bins with the candidates
    each has (the selection takes them all, so this is the data's limit, not curation's).

    >>> rows = [{"task": "matmul_bias_gelu", "hardware_id": "h200", "bin": 7, "available": 0},
    ...         {"task": "matmul_bias_gelu", "hardware_id": "h200", "bin": 8, "available": 0},
    ...         {"task": "softmax", "hardware_id": "h200", "bin": 1, "available": 2}]
    >>> bins_short_text(rows, 12, 100)
    'data limitation: fewer than 12 measured candidates in matmul_bias_gelu bins 7 (0), 8 (0); softmax bin 1 (2)'
    >>> bins_short_text([], 12, 100)
    'every (task, bin) cell has 12 eval candidates'
    """
    if eval_rows == 0:
        return "no eval pairs at all: nothing measured correctly beside a task reference"
    rows = list(short_rows)
    several_hw = len({r["hardware_id"] for r in rows}) > 1  # name the hardware only when it tells them apart
    by_task: dict[str, list[str]] = {}
    for r in rows:
        key = f"{r['task']} on {r['hardware_id']}" if several_hw else r["task"]
        by_task.setdefault(key, []).append(f"{r['bin']} ({r['available']})")
    if not by_task:
        return f"every (task, bin) cell has {per_bin} eval candidates"
    parts = [f"{task} bin{'s' if len(b) > 1 else ''} {', '.join(b)}" for task, b in by_task.items()]
    return ("; ".join(parts) if brief else
            f"data limitation: fewer than {per_bin} measured candidates in " + "; ".join(parts))


defs = dg.Definitions(assets=[curated_pairs])
