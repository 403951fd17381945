"""Exceptions of the warehouse layer. Each carries one line a person can act on."""

from __future__ import annotations


class WarehouseError(Exception):
    """Base class: anything the warehouse refuses, with a one-line message."""


class WarehouseLockedError(WarehouseError):
    """Another process holds the DuckDB file (DuckDB allows one writer process per file)."""


class MigrationError(WarehouseError):
    """A migration is missing, changed after it was applied, or failed to apply."""


class IngestError(WarehouseError):
    """A file was refused; nothing from it was written."""


class ValidationError(WarehouseError):
    """A frame handed to a typed write breaks a rule of its table; nothing was written."""


def one_line(exc: BaseException) -> str:
    """First line of an exception's message (or its type name), for one-line errors."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
