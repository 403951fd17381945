"""Evaluation of forecasts: proper scores, calibration, selective prediction, utility under a
measurement budget, discovery moments, bootstrap intervals, figures and an HTML report
(method.md sections 3 and 4). Pure numpy/polars; no Dagster, no SQL.

The package names below are loaded on first use: a submodule (the CLI's forecaster table, the
scores) is imported without matplotlib and the report's figures, which `kernelcast --help`
and every CLI start would otherwise pay for.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"evaluate_file": "evaluate", "evaluate_forecasts": "evaluate", "write_report": "report"}

__all__ = ["evaluate_file", "evaluate_forecasts", "write_report"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
