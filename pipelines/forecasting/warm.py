"""A forecaster kept warm in process: what a search calls with kernel sources.

    from pipelines.forecasting import forecast_sources, open_forecaster

    p = forecast_sources("softmax", anchor_src, [cand1, cand2])     # the home's file champion
    p.p, p.expected_log2_speedup, p.refused    # (n, 8), (n,), a reason or None per candidate

    with open_forecaster("models:/kernelcast-surrogate@champion", home=home) as f:
        for batch in batches:                                        # a search loop
            f.forecast("softmax", anchor_src, batch)

`open_forecaster` loads the version (any kind: pipelines.forecasting.load) once and wraps it in a
`SourceForecaster` (pipelines.forecasting.sources: a pool of reader children kept up, read
sources cached by digest under <home>/feature-cache); `forecast_sources` keeps one per model
reference for the life of the process.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipelines.forecasting.sources import FEATURE_CACHE_DIR, SourceForecast, SourceForecaster


def open_forecaster(model: str | None = None, *, home: str | Path | None = None, tracking_uri: str | None = None,
                    n_workers: int = 2, hardware: Mapping[str, Mapping[str, Any]] | None = None,
                    device: str | None = None) -> SourceForecaster:
    """The forecaster `model` names, loaded once, as a `SourceForecaster`.

    Args:
        model: what `load_forecaster` takes ("models:/kernelcast-surrogate@champion",
            "models:/kernelcast-surrogate/3", "kind:cost_model", "baseline:uniform", "smollm2",
            ...); None: the file champion (@champion-external, else @champion).
        home: KERNELCAST_HOME (default $KERNELCAST_HOME or ./.kernelcast): its registry, its
            base models, its feature cache.
        tracking_uri: the MLflow registry (default: sqlite:///<home>/mlflow.db).
        n_workers: reader children.
        hardware: hardware_id -> fingerprint for language-model prompts.
        device: where a language model runs (None: cuda when available).
    Raises:
        ValueError: nothing registered to default to, or `model` names nothing loadable (one line).
    """
    from models.base_model import kernelcast_home
    from pipelines.forecasting.load import file_champion_uri, load_forecaster

    home = Path(home) if home is not None else kernelcast_home()
    db = home / "mlflow.db"
    if tracking_uri is None and db.is_file():
        tracking_uri = f"sqlite:///{db.resolve()}"
    ref = model or file_champion_uri(tracking_uri)
    if not ref:
        raise ValueError(f"no registered version to default to in {home}: run `kernelcast run` or name a model")
    adapter = load_forecaster(ref, tracking_uri=tracking_uri, home=home, hardware=hardware, device=device)
    return SourceForecaster(adapter, n_workers=n_workers, cache_dir=home / FEATURE_CACHE_DIR)


_OPEN: dict[tuple, SourceForecaster] = {}
_OPEN_LOCK = threading.Lock()


def forecast_sources(task: str, anchor_source: str, candidate_sources: Sequence[str], *, model: str | None = None,
                     hardware: str | None = None, home: str | Path | None = None,
                     tracking_uri: str | None = None) -> SourceForecast:
    """Forecasts of candidate sources against an anchor source, by `model` (default: the file
    champion of the home's registry), loaded on the first call and kept for the next ones.

    Args:
        task: the task the kernels implement (`kernelcast tasks`).
        anchor_source: the anchor kernel module's source.
        candidate_sources: the candidates' sources.
        model, home, tracking_uri: as `open_forecaster`.
        hardware: the hardware id forecast for (default nvidia-h200-sm90).
    Returns:
        A SourceForecast: `p` (n, 8), `expected_log2_speedup` (n,), `refused` per candidate.
    Raises:
        ValueError: an unknown task, or no model to load (one line).
    """
    key = (model, str(home), tracking_uri)
    with _OPEN_LOCK:
        forecaster = _OPEN.get(key)
        if forecaster is None:
            forecaster = _OPEN[key] = open_forecaster(model, home=home, tracking_uri=tracking_uri)
    return forecaster.forecast(task, anchor_source, candidate_sources, hardware)
