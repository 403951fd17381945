"""One forecast for one (anchor, candidate) pair: what `kernelcast forecast` answers.

The model is the registered surrogate once one exists; until then the base model (the embedded
SmolLM2 by default, or any local checkpoint) with the logprob readout, which always yields a
distribution over the eight bins.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from models.backends import ForecastRequest
from models.forecast import Forecast
from models.prompts import build_prompt

# The measured H200's fingerprint fields the prompt shows, for when no warehouse is at hand.
DEFAULT_HARDWARE: dict[str, Any] = {
    "device_name": "NVIDIA H200",
    "capability": "9.0",
    "sm_count": 132,
    "memory_gb": 139.8,
    "l2_bytes": 60 * 2**20,
}


def fingerprints_or_default(con: Any, hardware_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """hardware_id -> its stored fingerprint (warehouse.hardware.fingerprints), DEFAULT_HARDWARE
    for an id the warehouse does not know."""
    from warehouse.hardware import fingerprints

    ids = list(hardware_ids)
    found = fingerprints(con, ids)
    return {hw: found.get(hw) or dict(DEFAULT_HARDWARE) for hw in ids}


def hardware_or_default(warehouse_path: Path, hardware_id: str) -> dict[str, Any]:
    """The stored fingerprint of `hardware_id`, or DEFAULT_HARDWARE (no warehouse, unknown id)."""
    if not warehouse_path.exists():
        return dict(DEFAULT_HARDWARE)
    from warehouse.db import connect

    with connect(warehouse_path, read_only=True) as con:
        return fingerprints_or_default(con, [hardware_id])[hardware_id]


def forecast_pair(task_name: str, task_description: str, anchor_source: str, candidate_source: str,
                  hardware: dict[str, Any], model_path: Path, *, readout: str = "logprob",
                  style: str = "diff", cache_dir: Path | None = None) -> tuple[Forecast, str]:
    """Forecast one pair with a local checkpoint. Returns (forecast, model_ref)."""
    from models.backends.transformers_backend import TransformersAnswerer
    from models.cache import ForecastCache

    cache = ForecastCache(cache_dir) if cache_dir else None
    forecaster = TransformersAnswerer(str(model_path), readout=readout, batch_size=1, cache=cache)
    messages = build_prompt(task_name, task_description, anchor_source, candidate_source, hardware, style=style)
    (result,) = forecaster.forecast([ForecastRequest(messages)])
    return result, forecaster.model_ref
