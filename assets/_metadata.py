"""Metadata the asset modules share: markdown tables of counts and outcomes for the UI."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table of `rows` under `header`, each cell as str().

    >>> print(markdown_table(["task", "pairs"], [("softmax", 3), ("rms_norm", 1)]))
    | task | pairs |
    |---|---|
    | softmax | 3 |
    | rms_norm | 1 |
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
