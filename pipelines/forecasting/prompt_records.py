"""What a language model's prompt shows of a kernel record and of a device, without polars.

The prompt of a pair (models.training.rows) shows each side's compile features in the
"+features" styles and the device's fingerprint. Both are looked up here, apart from the
language-model adapters (pipelines.forecasting.language), so the code-embed reader that a GPU
host runs from a forecaster file (pipelines.forecasting.embed_reader) needs neither polars nor
the warehouse.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from models.training.gpu_host.job import PROMPT_FEATURES


def record_features(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The compile features a "+features" prompt shows for a record (None: never compiled)."""
    if all(record.get(f) is None for f in PROMPT_FEATURES):
        return None
    return {f: record.get(f) for f in PROMPT_FEATURES}


class HardwareTable:
    """hardware_id -> fingerprint for prompts: given ones, else the warehouse's, else the H200 default."""

    def __init__(self, warehouse_path: Any = None, given: Mapping[str, Mapping[str, Any]] | None = None):
        self.warehouse_path, self.known = warehouse_path, {k: dict(v) for k, v in (given or {}).items()}

    def __call__(self, hardware_id: str) -> dict[str, Any]:
        if hardware_id not in self.known:
            from pathlib import Path

            from models.service import DEFAULT_HARDWARE, hardware_or_default

            self.known[hardware_id] = (hardware_or_default(Path(self.warehouse_path), hardware_id)
                                       if self.warehouse_path else dict(DEFAULT_HARDWARE))
        return self.known[hardware_id]
