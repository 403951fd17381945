"""A kernelcast forecaster inside `@triton.autotune`: measure only the configs it ranks highest.

    configs = [triton.Config({"BLOCK_N": b}, num_warps=w, num_stages=s) for ...]
    prune = surrogate_pruning(forecaster, "softmax", "online_two_pass", configs, top_k=12,
                              fixed_knobs={"eviction": "none", "online_state": "vector"})
    kernel = triton.autotune(configs, key=["M", "N"], prune_configs_by=prune)(softmax_kernel)

Triton 3.6's autotuner (triton/runtime/autotuner.py, `Autotuner.prune_configs`) calls
`perf_model(**named_args, **call_kwargs, **config.all_kwargs())` once per config when there are
more configs than `top_k`, and benchmarks the `top_k` configs of lowest returned value; an int
`top_k` is a count, a float <= 1.0 a share of the configs. So the hook returns an estimated
relative run time.

A config names a point of the task's kernel space: each UPPER_CASE knob of the family comes
from the config's kwargs (NUM_WARPS and NUM_STAGES from num_warps/num_stages), every other
knob from `fixed_knobs`. The forecaster sees that point's rendered kernel (what
pipelines/generation measures) against the task reference; the estimate is 2 ** -E[log2 S],
with E[log2 S] = sum_b p_b r_b. All configs are forecast in one call, at the first one
Triton asks about. A config outside the family's valid points gets an infinite estimate.

Where the registry is at hand, `registered_autotune_forecaster(tracking_uri, home)` gives the
forecaster for kernels from files (@champion-external, else @champion) through the one
forecasting interface (pipelines.forecasting); on a GPU host without MLflow, a pickled
portable cost model (`kernelcast export-forecaster`) plugs in the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pipelines.forecasting.base import PairForecaster, checked_probs, expected_log2
from pipelines.generation import registry
from pipelines.generation.registry import KernelPoint
from pipelines.search import space
from pipelines.search.config import DEFAULT_HARDWARE

# Launch options that stand for family knobs of these names.
LAUNCH_KNOBS = {"NUM_WARPS": "num_warps", "NUM_STAGES": "num_stages"}


def _config_kwargs(config: Any) -> dict[str, Any]:
    return dict(config.all_kwargs()) if hasattr(config, "all_kwargs") else dict(config)


class ForecastPerfModel:
    """The `perf_model` of `prune_configs_by`: estimated relative time of a config's kernel.

    Args:
        forecaster: asked through `predict_kernels` (a forecaster file's: pipelines.search.forecasters.file_forecaster).
        task, algorithm: the family whose points the configs are.
        configs: the autotuner's configs (triton.Config, or mappings of their all_kwargs()).
        fixed_knobs: values of the family's knobs no config sets (algorithm choices).
        hardware_id: passed to the forecaster.
    """

    def __init__(self, forecaster: PairForecaster, task: str, algorithm: str,
                 configs: Sequence[Any] = (), fixed_knobs: Mapping[str, Any] | None = None,
                 hardware_id: str = DEFAULT_HARDWARE):
        self.forecaster, self.task, self.algorithm = forecaster, task, algorithm
        self.family = registry.family(task, algorithm)
        self.fixed = dict(fixed_knobs or {})
        self.hardware_id = hardware_id
        self.pending = [_config_kwargs(c) for c in configs]
        self.scores: dict[str, float] = {}  # knobs_json -> expected log2 speedup (-inf: invalid)
        self.calls = 0  # perf_model calls answered
        self.forecast_rows = 0  # candidates sent to the forecaster

    def point(self, kwargs: Mapping[str, Any]) -> KernelPoint:
        """The space point a config's keyword arguments stand for."""
        knobs = {}
        for k in self.family.knobs:
            if k.name in kwargs:
                knobs[k.name] = kwargs[k.name]
            elif k.name in LAUNCH_KNOBS and LAUNCH_KNOBS[k.name] in kwargs:
                knobs[k.name] = kwargs[LAUNCH_KNOBS[k.name]]
            elif k.name in self.fixed:
                knobs[k.name] = self.fixed[k.name]
            else:
                raise ValueError(f"{self.task}/{self.algorithm}: no value for knob {k.name} in the config "
                                 "or fixed_knobs")
        return KernelPoint(self.task, self.algorithm, knobs)

    def _forecast(self, kwargs_list: Sequence[Mapping[str, Any]]) -> None:
        points, todo = [], []
        for kw in kwargs_list:
            p = self.point(kw)
            key = p.knobs_json()
            if key in self.scores or key in todo:
                continue
            if not registry.is_valid_point(p):
                self.scores[key] = -math.inf
                continue
            points.append(p)
            todo.append(key)
        if not points:
            return
        anchor = space.reference_kernel(self.task)
        records = [space.kernel_record(self.task, space.child_of(p)) for p in points]
        probs = checked_probs(self.forecaster.predict_kernels(anchor, records, self.hardware_id), len(records))
        self.forecast_rows += len(records)
        for key, score in zip(todo, expected_log2(probs), strict=True):
            self.scores[key] = float(score)

    def score(self, **kwargs: Any) -> float:
        """Expected log2 speedup vs the reference of the config's kernel (-inf if not a valid point)."""
        if self.pending:
            batch, self.pending = self.pending, []
            self._forecast(batch)
        key = self.point(kwargs).knobs_json()
        if key not in self.scores:
            self._forecast([kwargs])
        return self.scores[key]

    def __call__(self, **kwargs: Any) -> float:
        self.calls += 1
        s = self.score(**kwargs)
        return math.inf if s == -math.inf else 2.0 ** (-s)


def registered_autotune_forecaster(tracking_uri: str, home: Any, ref: str | None = None,
                                   **load_kwargs: Any) -> PairForecaster:
    """The registered forecaster `ref` (default: the file champion, @champion-external when the
    registry has it, else @champion) as the autotuner's forecaster, any kind, with the
    warehouse's compile features filled into the records it sees.

    Raises:
        ValueError: nothing registered, or `ref` names nothing loadable (one line).
    """
    from pathlib import Path

    from pipelines.forecasting import file_champion_uri, load_forecaster
    from pipelines.search.registered import warehouse_compile_features

    ref = ref or file_champion_uri(tracking_uri)
    if ref is None:
        raise ValueError("no registered @champion-external or @champion: run `kernelcast run` first")
    forecaster = load_forecaster(ref, tracking_uri=tracking_uri, home=home, **load_kwargs)
    return forecaster.with_known_features(warehouse_compile_features(Path(home) / "warehouse.duckdb"))


def surrogate_pruning(forecaster: PairForecaster, task: str, algorithm: str, configs: Sequence[Any],
                      top_k: int | float, fixed_knobs: Mapping[str, Any] | None = None,
                      hardware_id: str = DEFAULT_HARDWARE) -> dict[str, Any]:
    """`prune_configs_by` for @triton.autotune: benchmark only the forecaster's top_k configs.

    Returns:
        {"perf_model": ForecastPerfModel, "top_k": top_k}
    """
    if isinstance(top_k, bool) or not (isinstance(top_k, int) and top_k >= 1
                                       or isinstance(top_k, float) and 0.0 < top_k <= 1.0):
        raise ValueError(f"top_k must be an int >= 1 or a float in (0, 1], got {top_k!r}")
    model = ForecastPerfModel(forecaster, task, algorithm, configs, fixed_knobs, hardware_id)
    return {"perf_model": model, "top_k": top_k}
