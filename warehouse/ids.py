"""Content-addressed ids. A kernel id is the sha256 of its normalised source, so the same code
written twice (other line endings, trailing spaces, blank lines at the ends) is one kernel."""

from __future__ import annotations

import hashlib
from typing import Any


def normalise_source(source: str) -> str:
    """Line endings to \\n, trailing whitespace per line dropped, blank lines at both ends dropped."""
    lines = [line.rstrip() for line in source.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    return "\n".join(lines).strip("\n") + "\n"


def kernel_id(source: str) -> str:
    """sha256 hex digest of the normalised source.

    >>> kernel_id("x = 1\\r\\n") == kernel_id("\\nx = 1   \\n\\n")
    True
    """
    return hashlib.sha256(normalise_source(source).encode("utf-8")).hexdigest()


def kernel_record(source: str, task: str, language: str, generator: str, generator_version: str,
                  algorithm: str | None = None, knobs_json: str | None = None,
                  parent_kernel_id: str | None = None, mutation: str | None = None) -> dict[str, Any]:
    """A kernel batch row (warehouse.formats.KERNEL_BATCH_SCHEMA's columns, in order), its id
    the source's. Every generator builds its records here, so none can drift from the schema."""
    return {"kernel_id": kernel_id(source), "task": task, "source": source, "language": language,
            "generator": generator, "generator_version": generator_version, "algorithm": algorithm,
            "knobs_json": knobs_json, "parent_kernel_id": parent_kernel_id, "mutation": mutation}
