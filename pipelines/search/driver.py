"""Running searches: the loop that turns `engine.next_action` into log events.

`SearchRun` is one run with its log and forecaster. `drive` advances several runs in lockstep:
each goes on by itself until it needs measurements, then the requests of all runs go to the
measurer in ONE call (one worker batch on a GPU host) and each run gets its outcomes back. A
run whose log already holds events resumes from them; a stop (an exception, Ctrl-C, a
deadline) loses nothing that was logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from models.bins import NUM_BINS
from pipelines.forecasting.base import PairForecaster, checked_probs
from pipelines.search import engine, space
from pipelines.search.config import SearchConfig
from pipelines.search.events import EventLog, Forecasted, Measured, Started
from pipelines.search.measure import MeasureItem, Measurer

log = logging.getLogger(__name__)


@dataclass
class SearchRun:
    """One search: its config, its log (replayed on creation) and its forecaster (if it needs one)."""

    config: SearchConfig
    log: EventLog = field(default_factory=EventLog)
    forecaster: PairForecaster | None = None
    features: dict[str, dict[str, Any]] | None = None  # compile features for kernel mappings
    state: engine.SearchState = field(init=False)

    def __post_init__(self) -> None:
        self.config.validate()
        if self.config.forecasts and self.forecaster is None:
            raise ValueError(f"mode {self.config.mode} needs a forecaster")
        self.state = engine.replay(self.log.read())
        if self.state.config is None:
            self._append(Started(self.config.to_dict(), space.root_child(self.config.task)))
        elif self.state.config != self.config:
            raise engine.LogError(f"the log belongs to another run ({self.state.config.run_name()})")

    def _append(self, event) -> None:
        self.log.append(event)
        engine.apply(self.state, event)

    def _forecast(self, need: engine.NeedForecast) -> Forecasted:
        task, hw = self.config.task, self.config.hardware_id
        anchor = space.reference_kernel(task) if need.anchor is None else space.kernel_record(task, need.anchor)
        cands = [space.kernel_record(task, c, parent_id=need.parent, features=self.features) for c in need.candidates]
        try:
            probs = checked_probs(self.forecaster.predict_kernels(anchor, cands, hw), len(cands))
            error = None
        except Exception as exc:  # noqa: BLE001 - a failing forecaster is a recorded outcome
            probs = np.full((len(cands), NUM_BINS), 1.0 / NUM_BINS)
            error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            log.warning("%s step %d: forecaster failed (%s); uniform used", self.config.run_name(), need.step, error)
        return Forecasted(need.step, need.parent, tuple(tuple(float(x) for x in row) for row in probs), error)

    def advance(self) -> engine.NeedMeasure | engine.Done:
        """Apply decisions and forecasts until the run needs measurements or is done."""
        while True:
            action = engine.next_action(self.state)
            if isinstance(action, engine.Emit):
                for e in action.events:
                    self._append(e)
            elif isinstance(action, engine.NeedForecast):
                self._append(self._forecast(action))
            else:
                return action

    def deliver(self, need: engine.NeedMeasure, outcomes: dict) -> None:
        """Log the measurements a NeedMeasure asked for."""
        self._append(Measured(need.step, tuple(outcomes[c.kernel_id] for c, _ in need.kernels)))


Progress = Callable[[int, int], None]  # (runs finished, runs)


def drive(
    runs: Sequence[SearchRun],
    measurer: Measurer,
    progress: Progress | None = None,
    deadline: float | None = None,
) -> int:
    """Advance `runs` to their end, measuring the requests of all of them together per round.

    Args:
        runs: the runs (fresh or resumed).
        measurer: answers each round's requests (one call per round).
        progress: called after each round with (finished runs, all runs).
        deadline: time.monotonic() value after which no new round starts (runs stay resumable).

    Returns:
        The number of measurement rounds made.
    """
    rounds = 0
    while True:
        pending: list[tuple[SearchRun, engine.NeedMeasure]] = []
        done = 0
        for run in runs:
            action = run.advance()
            if isinstance(action, engine.NeedMeasure):
                pending.append((run, action))
            else:
                done += 1
        if progress:
            progress(done, len(runs))
        if not pending or (deadline is not None and time.monotonic() > deadline):
            return rounds
        items = [MeasureItem(run.config.task, child, parent) for run, need in pending for child, parent in need.kernels]
        outcomes = measurer.measure(items)
        for run, need in pending:
            run.deliver(need, outcomes)
        rounds += 1
