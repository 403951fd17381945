"""Registered forecasters inside the budgeted search (pipelines.search.forecasters).

Two names resolve here once `register_search_forecasters()` ran:
- "models:/<name>@<alias>" or "models:/<name>/<version>": a registered classical version;
- "kind:cost_model" / "kind:text_model": the newest registered version of that kind.
The kernels the search proposes are looked up in the warehouse for their compile features
(the simulation's kernel records carry only what the generator knows). An LLM version is
refused in one line: on a CPU it forecasts a pair in seconds, and a simulation asks thousands.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


class WithCompileFeatures:
    """A classical forecaster whose kernel records get their compile features filled in."""

    def __init__(self, model: Any, features: Mapping[str, Mapping[str, Any]], name: str):
        self.model, self.features, self.name = model, dict(features), name

    def predict_kernels(self, anchor: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]],
                        hardware_id: str) -> np.ndarray:
        from models.classical.features import with_compile_features

        return self.model.predict_kernels(with_compile_features(anchor, self.features),
                                          [with_compile_features(c, self.features) for c in candidates], hardware_id)


def _features(warehouse_path: Path) -> dict[str, dict[str, Any]]:
    from warehouse.db import connect
    from warehouse.kernels import forecast_features

    if not warehouse_path.exists():
        return {}
    with connect(warehouse_path, read_only=True) as con:
        return forecast_features(con)  # compile and source features, as the fit's kernel records


def _factory(name: str, ctx: Any) -> WithCompileFeatures:
    from models.classical.registry import load_classical
    from models.registry import alias_version, find_versions, parse_model_uri, version_info

    if not ctx.tracking_uri:
        raise ValueError(f"forecaster {name!r} needs the MLflow tracking URI")
    if name.startswith("kind:"):
        kind = name.removeprefix("kind:")
        found = find_versions(ctx.tracking_uri, "kernelcast-surrogate", kind=kind)
        if not found:
            raise ValueError(f"no registered version of kind {kind!r}: run `kernelcast run` first")
        model_name, version = "kernelcast-surrogate", found[0]["version"]
    else:
        model_name, alias, version = parse_model_uri(name)
        version = alias_version(ctx.tracking_uri, alias, model_name) if alias else version
        if version is None:
            raise ValueError(f"{name} points at no version")
    kind = (version_info(ctx.tracking_uri, version, model_name) or {}).get("tags", {}).get("kind", "llm")
    if kind not in ("cost_model", "text_model"):
        raise ValueError(f"{name} is a {kind} version; the simulation needs a classical one (e.g. kind:cost_model)")
    home = Path(ctx.home) if ctx.home else Path(".")
    return WithCompileFeatures(load_classical(ctx.tracking_uri, model_name, version),
                               _features(home / "warehouse.duckdb"), f"{model_name}/{version} ({kind})")


def register_search_forecasters() -> None:
    """Make registered versions resolvable by name in the search (idempotent)."""
    from pipelines.search.forecasters import MODEL_REF_PREFIX, register_forecaster

    register_forecaster(MODEL_REF_PREFIX, _factory)
    register_forecaster("kind:", _factory)


def portable_forecaster(name: str, tracking_uri: str, home: Path, compile_workers: int = 12) -> Any:
    """The registered cost model `name` ("kind:cost_model", "models:/...") as a
    models.classical.portable.PortableCostModel: numpy and pandas only, carrying the compile
    features the warehouse knows and compiling the rest where it runs (`compile_workers`).

    Raises:
        ValueError: `name` resolves to no version, or to one that is not a cost model (one line).
    """
    from models.classical.cost_model import CostModel
    from models.classical.portable import PortableCostModel

    found = _factory(name, type("Ctx", (), {"tracking_uri": tracking_uri, "home": home})())
    if not isinstance(found.model, CostModel):
        raise ValueError(f"{found.name} is not a cost model: only cost models export (the text model needs scikit-learn)")
    return PortableCostModel.from_cost_model(found.model, found.features, found.name, compile_workers)
