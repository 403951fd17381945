"""The append-only event log of a search run: typed events, one JSON object per line.

A run is its log. The state is a fold of the events (`engine.replay`); the next decision is a
pure function of the state (`engine.next_action`). So a crashed or stopped run resumes by
replaying its log and then goes on exactly as the uninterrupted run would have: every random
draw is seeded by (run seed, step, parent), never by a generator whose state would be lost.

Events (in the order a step writes them):
    Started        the run's config and its root kernel (the task's seed kernel)
    Measured       GPU outcomes of a list of kernels (step -1: the root; outside the budget)
    StepStarted    the parents PUCT picked for this step
    Proposed       the mutations drawn for one parent
    Forecasted     the forecaster's (n, 8) probabilities for those mutations
    Selected       which of them go to the GPU, which are trusted on their forecast
    Measured       the outcomes of the step's measurements
    StepCompleted  archive admission and backpropagation happen when this is folded in
    Finished       the budget is spent (or nothing is left to expand)

Events carry no clock readings, so two runs of the same config give identical logs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar


@dataclass(frozen=True)
class Child:
    """A kernel of the task's space as the log names it (its source is re-rendered on demand)."""

    kernel_id: str
    algorithm: str
    knobs_json: str
    mutation: str | None = None  # the label that produced it from its parent; None for the root


@dataclass(frozen=True)
class Outcome:
    """What the GPU said about one kernel.

    status: "ok" (speedup set), "failed" (failure_kind set) or "unmeasured" (a simulated
    measurement of a kernel the table does not hold: it costs a measurement, yields nothing,
    and counts against coverage).
    """

    kernel_id: str
    status: str
    speedup: float | None = None  # vs the task reference, geometric mean over benchmark cases
    failure_kind: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.speedup is not None and self.speedup > 0


@dataclass(frozen=True)
class Started:
    kind: ClassVar[str] = "started"
    config: dict[str, Any]
    root: Child


@dataclass(frozen=True)
class StepStarted:
    kind: ClassVar[str] = "step_started"
    step: int
    parents: tuple[str, ...]


@dataclass(frozen=True)
class Proposed:
    kind: ClassVar[str] = "proposed"
    step: int
    parent: str
    children: tuple[Child, ...]


@dataclass(frozen=True)
class Forecasted:
    kind: ClassVar[str] = "forecasted"
    step: int
    parent: str
    probs: tuple[tuple[float, ...], ...]  # (n, 8), aligned with the parent's Proposed children
    error: str | None = None  # the forecaster failed: probs are uniform, the error is kept


@dataclass(frozen=True)
class Selected:
    kind: ClassVar[str] = "selected"
    step: int
    parent: str
    measure: tuple[str, ...]  # kernel ids sent to the GPU, in priority order
    trusted: tuple[str, ...] = ()  # selective: ids taken on their forecast, not measured


@dataclass(frozen=True)
class Measured:
    kind: ClassVar[str] = "measured"
    step: int  # -1 for the root
    outcomes: tuple[Outcome, ...]


@dataclass(frozen=True)
class StepCompleted:
    kind: ClassVar[str] = "step_completed"
    step: int


@dataclass(frozen=True)
class Finished:
    kind: ClassVar[str] = "finished"
    reason: str  # "budget spent" | "nothing left to expand" | "root failed"


Event = Started | StepStarted | Proposed | Forecasted | Selected | Measured | StepCompleted | Finished
EVENT_TYPES: dict[str, type] = {
    cls.kind: cls
    for cls in (Started, StepStarted, Proposed, Forecasted, Selected, Measured, StepCompleted, Finished)
}


def to_json(event: Event) -> dict[str, Any]:
    """The event as a JSON-able dict with its "kind"."""
    out: dict[str, Any] = {"kind": event.kind}
    for name, value in vars(event).items():
        if isinstance(value, Child | Outcome):
            value = vars(value)
        elif isinstance(value, tuple) and value and isinstance(value[0], Child | Outcome):
            value = [vars(v) for v in value]
        out[name] = value
    return out


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def from_json(data: dict[str, Any]) -> Event:
    """The event a `to_json` dict came from.

    Raises:
        ValueError: unknown kind or fields.
    """
    data = dict(data)
    kind = data.pop("kind", None)
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        raise ValueError(f"unknown search event kind {kind!r}")
    if "root" in data:
        data["root"] = Child(**data["root"])
    if "children" in data:
        data["children"] = tuple(Child(**c) for c in data["children"])
    if "outcomes" in data:
        data["outcomes"] = tuple(Outcome(**o) for o in data["outcomes"])
    for name in ("parents", "measure", "trusted", "probs"):
        if name in data:
            data[name] = _tuples(data[name])
    try:
        return cls(**data)
    except TypeError as exc:
        raise ValueError(f"bad {kind} event: {exc}") from None


class EventLog:
    """Where a run's events go. In memory by default; `JsonlLog` keeps them in a file."""

    def __init__(self, events: Iterable[Event] = ()):
        self._events: list[Event] = list(events)

    def read(self) -> list[Event]:
        return list(self._events)

    def append(self, event: Event) -> None:
        self._events.append(event)

    def __len__(self) -> int:
        return len(self._events)


class JsonlLog(EventLog):
    """An event log in a JSON-lines file, flushed and fsynced after every event.

    A last line cut short by a crash is ignored on reading (it was never acknowledged), and the
    file is truncated to the last whole line before the next append.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        super().__init__(self._load())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")

    def _load(self) -> Iterator[Event]:
        if not self.path.exists():
            return iter(())
        raw = self.path.read_bytes()
        whole = raw[: raw.rfind(b"\n") + 1]
        if len(whole) != len(raw):
            with open(self.path, "r+b") as fh:  # drop the torn last line
                fh.truncate(len(whole))
        events = []
        for n, line in enumerate(whole.decode("utf-8").splitlines(), 1):
            if line.strip():
                try:
                    events.append(from_json(json.loads(line)))
                except (json.JSONDecodeError, ValueError) as exc:
                    raise ValueError(f"{self.path}:{n}: not a search event ({exc})") from None
        return iter(events)

    def append(self, event: Event) -> None:
        self._fh.write(json.dumps(to_json(event), sort_keys=True) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        super().append(event)

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> JsonlLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
