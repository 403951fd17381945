"""Which card a dataset version's headline is about, and the short name each card goes by.

A dataset version may hold the pairs of several GPU types (one hardware partition each). The
in-distribution setting, its splits and every figure the report compares across versions are
those of one card, the reference: the configured one (`CurationSettings.reference_hardware`,
the card the committed data was first measured on) when it has eval pairs, else the card with
the most. Every other card is a target of the cross-hardware settings
(pipelines.surrogates.cross_hardware). The choice is recorded in the version's counts, so every
reader of the version agrees on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

DEFAULT_REFERENCE_HARDWARE = "nvidia-h200-sm90"


def reference_hardware(eval_pairs: pl.DataFrame, preferred: str | None = DEFAULT_REFERENCE_HARDWARE) -> str | None:
    """The reference card of some eval pairs: `preferred` when it has any, else the card with the
    most (ties: the smallest id); None without eval pairs.

    >>> ev = pl.DataFrame({"hardware_id": ["b", "b", "a", "c", "c"]})
    >>> reference_hardware(ev, "a"), reference_hardware(ev, "z"), reference_hardware(ev.head(0), "a")
    ('a', 'b', None)
    """
    if eval_pairs.is_empty():
        return None
    counts = dict(eval_pairs.group_by("hardware_id").len().rows())
    if preferred in counts:
        return preferred
    return min(counts, key=lambda hw: (-counts[hw], hw))


def version_reference_hardware(counts: Mapping[str, Any], eval_pairs: pl.DataFrame) -> str | None:
    """The reference card a dataset version recorded, else (a version curated before it was
    recorded: one card) the card with the most eval pairs."""
    recorded = counts.get("reference_hardware")
    if recorded and (eval_pairs.is_empty() or recorded in set(eval_pairs["hardware_id"].to_list())):
        return str(recorded)
    return reference_hardware(eval_pairs, None)


def on_card(pairs: pl.DataFrame, hardware_id: str | None) -> pl.DataFrame:
    """The pairs of one card (None: all of them).

    >>> on_card(pl.DataFrame({"hardware_id": ["a", "b"]}), "b").height
    1
    """
    return pairs if hardware_id is None else pairs.filter(pl.col("hardware_id") == hardware_id)


def other_hardware(pairs: pl.DataFrame, reference: str | None) -> list[str]:
    """The cards of some pairs other than the reference, sorted."""
    return sorted(set(pairs["hardware_id"].to_list()) - {reference}) if pairs.height else []
