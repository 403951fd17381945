"""Registered forecasters inside the budgeted search (pipelines.search.forecasters).

Three kinds of names resolve here once `register_search_forecasters()` ran, all through the
one forecasting interface (pipelines.forecasting.load_forecaster):
- "models:/<name>@<alias>" or "models:/<name>/<version>": a registered classical version;
- "kind:cost_model" / "kind:text_model": the newest registered version of that kind;
- "champion": the version for kernels from files, @champion-external when the registry has it,
  else @champion (what `kernelcast forecast` on files answers from).
The kernels the search proposes are looked up in the warehouse for their compile features
(the simulation's kernel records carry only what the generator knows). An LLM version is
refused in one line, before its weights load: on a CPU it forecasts a pair in seconds, and a
simulation asks thousands.

`portable_forecaster` writes a version as a forecaster file for a GPU host without MLflow: a
cost model, or a code-embed version (its head; the base model read where it runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FILE_CHAMPION = "champion"  # the search's name for the file champion (pipelines.forecasting.file_champion_uri)


def warehouse_compile_features(warehouse_path: Path) -> dict[str, dict[str, Any]]:
    """kernel_id -> its compile features of every compiled kernel the warehouse holds."""
    from warehouse.db import connect
    from warehouse.kernels import forecast_features

    if not warehouse_path.exists():
        return {}
    with connect(warehouse_path, read_only=True) as con:
        return forecast_features(con)  # compile and source features, as the fit's kernel records


def search_forecaster(name: str, tracking_uri: str | None, home: Path | str | None) -> Any:
    """The registered classical forecaster `name` names, with the warehouse's compile features.

    Raises:
        ValueError: no tracking URI, a name that points at no version, or an LLM version (one line).
    """
    from pipelines.forecasting import load_forecaster
    from pipelines.forecasting.load import CLASSICAL_KINDS, WrongKind

    if not tracking_uri:
        raise ValueError(f"forecaster {name!r} needs the MLflow tracking URI")
    ref = _reference(name, tracking_uri)
    home = Path(home) if home else Path(".")
    try:
        adapter = load_forecaster(ref, tracking_uri=tracking_uri, home=home, kinds=CLASSICAL_KINDS)
    except WrongKind as exc:
        raise ValueError(f"{exc}; the simulation needs a classical one (e.g. kind:cost_model)") from None
    return adapter.with_known_features(warehouse_compile_features(home / "warehouse.duckdb"))


def _factory(name: str, ctx: Any) -> Any:
    return search_forecaster(name, ctx.tracking_uri, ctx.home)


def register_search_forecasters() -> None:
    """Make registered versions resolvable by name in the search (idempotent)."""
    from pipelines.search.forecasters import MODEL_REF_PREFIX, register_forecaster

    register_forecaster(MODEL_REF_PREFIX, _factory)
    register_forecaster("kind:", _factory)
    register_forecaster(FILE_CHAMPION, _factory)


def portable_forecaster(name: str, tracking_uri: str, home: Path, compile_workers: int = 12) -> Any:
    """The registered version `name` ("kind:cost_model", "models:/...", "champion") as a
    forecaster file's object, compiling the Triton candidates it does not know where it runs
    (`compile_workers`), with the compile features the warehouse knows:
    - a cost model: models.classical.portable.PortableCostModel (numpy and pandas only);
    - a code-embed version registered with its head file:
      pipelines.forecasting.embed_file.PortableEmbedHead (its head, axes and calibrator;
      the base model read where it runs).

    Raises:
        ValueError: `name` resolves to no version, or to one of another kind (one line).
    """
    from pipelines.forecasting.load import resolve_version
    from pipelines.forecasting.source_features import source_features_many

    if not tracking_uri:
        raise ValueError(f"forecaster {name!r} needs the MLflow tracking URI")
    ref = _reference(name, tracking_uri)
    _, _, info = resolve_version(tracking_uri, ref)
    if info.get("tags", {}).get("finetune") == "embed_head":
        return _portable_embed(ref, tracking_uri, Path(home) if home else Path("."), compile_workers)
    from models.classical.cost_model import CostModel
    from models.classical.portable import PortableCostModel

    found = search_forecaster(ref, tracking_uri, home)
    if not isinstance(found.model, CostModel):
        raise ValueError(f"{found.name} is not a cost model: cost models and code-embed versions export "
                         "(the text model needs scikit-learn)")
    return PortableCostModel.from_cost_model(found.model, found.known_features, found.name, compile_workers,
                                             source_features_many)


def _portable_embed(ref: str, tracking_uri: str, home: Path, compile_workers: int) -> Any:
    """The code-embed version `ref` as a PortableEmbedHead (ValueError: no head file)."""
    from pipelines.forecasting import load_forecaster
    from pipelines.forecasting.embed import EmbedHeadForecaster
    from pipelines.forecasting.embed_file import PortableEmbedHead
    from pipelines.forecasting.source_features import source_features_many

    adapter = load_forecaster(ref, tracking_uri=tracking_uri, home=home, use_committed=False, cache=False)
    if not isinstance(adapter, EmbedHeadForecaster):
        raise ValueError(f"{ref}: a code-embed version without its head file answers only the pairs of its run; "
                         "it does not export")
    return PortableEmbedHead(adapter, f"{adapter.model_ref} (code-embed)",
                                   warehouse_compile_features(home / "warehouse.duckdb"), compile_workers,
                                   source_features_many if compile_workers > 0 else None)


def _reference(name: str, tracking_uri: str) -> str:
    """The registry reference `name` stands for ("champion": the file champion's alias)."""
    from pipelines.forecasting import file_champion_uri

    if name != FILE_CHAMPION:
        return name
    ref = file_champion_uri(tracking_uri)
    if ref is None:
        raise ValueError("no registered @champion-external or @champion: run `kernelcast run` first")
    return ref
