"""Dataset curation: measurements -> labelled kernels -> pairs -> splits -> versions.

Pure functions over polars frames; the warehouse reads and writes the tables, and
`stored.curate_and_store` (what the `curated_pairs` asset calls) reads and writes them in one call.
"""

from pipelines.curation.pairs import build_pairs, labels, pair_id
from pipelines.curation.splits import (
    SplitConfig,
    Splits,
    find_leakage,
    make_splits,
    select_eval_candidates,
)
from pipelines.curation.summary import dataset_summary, summary_markdown
from pipelines.curation.versions import DatasetVersion, dataset_version

__all__ = [
    "DatasetVersion", "SplitConfig", "Splits", "build_pairs", "dataset_summary", "dataset_version",
    "find_leakage", "labels", "make_splits", "pair_id", "select_eval_candidates", "summary_markdown",
]
