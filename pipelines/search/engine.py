"""The search as pure functions over its event log.

    state = replay(events)            # fold: apply(state, event) for each event
    action = next_action(state)       # pure: what happens next

`next_action` returns one of
    Emit(events)         decisions (parents picked, mutations drawn, candidates selected, step
                         closed): the driver appends them to the log and folds them in
    NeedForecast(...)    the forecaster must score one parent's mutations
    NeedMeasure(...)     the GPU (or the measured table) must measure these kernels
    Done()               the run is over
Nothing here reads a clock or keeps a random generator between calls: each draw is seeded by
(run seed, step, parent position, purpose), so the same log always leads to the same next
action, and a resumed run ends exactly where an uninterrupted one does.

Budget accounting: every kernel sent to the GPU costs one measurement, failed or not, and the
search goes on until `budget` measurements are spent (the root's measurement is outside the
budget: every mode starts from the same measured seed kernel). A parent with fewer mutations
left than its slots leaves the rest to later steps, so all modes end on the same count unless
the reachable space runs dry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from models.bins import NUM_BINS
from pipelines.forecasting.base import expected_log2
from pipelines.search import puct, space
from pipelines.search.config import SearchConfig
from pipelines.search.events import (
    Child,
    Event,
    Finished,
    Forecasted,
    Measured,
    Outcome,
    Proposed,
    Selected,
    Started,
    StepCompleted,
    StepStarted,
)
from pipelines.search.forecasters import confidence

# Purposes of the seeded draws: distinct streams, so e.g. the random control's choice and the
# filtered mode's tie-breaking are independent draws of the same distribution.
_DRAW_PROPOSE, _DRAW_RANDOM, _DRAW_TIES = 1, 2, 3
_SCORE_DECIMALS = 9  # scores equal to this precision tie (float noise is not a preference)


class LogError(ValueError):
    """The event log does not describe a valid run (wrong order, foreign config, bad outcome)."""


# ---- actions ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Emit:
    events: tuple[Event, ...]


@dataclass(frozen=True)
class NeedForecast:
    step: int
    parent: str
    anchor: Child | None  # None: the task's reference kernel
    candidates: tuple[Child, ...]


@dataclass(frozen=True)
class NeedMeasure:
    step: int  # -1: the root
    kernels: tuple[tuple[Child, str | None], ...]  # (kernel, parent id)


@dataclass(frozen=True)
class Done:
    reason: str


Action = Emit | NeedForecast | NeedMeasure | Done


# ---- state --------------------------------------------------------------------------------
@dataclass(frozen=True)
class MeasuredRow:
    """One GPU measurement of the run, in the order they were spent."""

    index: int  # measurements spent after this one, 1..budget
    step: int
    kernel_id: str
    parent: str
    outcome: Outcome
    parent_speedup: float  # the parent's speedup as the search knew it (forecast if trusted)

    @property
    def improved(self) -> bool:
        return self.outcome.ok and self.outcome.speedup > self.parent_speedup


@dataclass
class StepContext:
    step: int
    parents: tuple[str, ...]
    proposals: dict[str, tuple[Child, ...]] = field(default_factory=dict)
    forecasts: dict[str, np.ndarray] = field(default_factory=dict)
    selected: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)
    outcomes: dict[str, Outcome] | None = None

    def to_measure(self) -> list[tuple[str, str]]:
        """(kernel id, parent id) of the step's measurements, parent by parent."""
        return [(kid, p) for p in self.parents for kid in self.selected[p][0]]


@dataclass
class SearchState:
    """Everything the log says so far."""

    config: SearchConfig | None = None
    root: Child | None = None
    root_outcome: Outcome | None = None
    archive: list[puct.Node] = field(default_factory=list)
    kernels: dict[str, Child] = field(default_factory=dict)  # every kernel named so far
    visits: dict[str, int] = field(default_factory=dict)
    best_child: dict[str, float] = field(default_factory=dict)
    expansions: int = 0
    next_step: int = 0
    current: StepContext | None = None
    spent: int = 0
    forecasts: int = 0
    forecast_errors: int = 0
    considered: set[str] = field(default_factory=set)
    closed: set[str] = field(default_factory=set)  # measured or trusted: never drawn again
    measured: list[MeasuredRow] = field(default_factory=list)
    trusted: list[tuple[str, str, float]] = field(default_factory=list)  # (id, parent, forecast speedup)
    best_curve: list[float] = field(default_factory=list)  # best true speedup after i measurements
    best_kernel: str | None = None
    finished: str | None = None

    def node(self, kernel_id: str) -> puct.Node | None:
        for n in self.archive:
            if n.kernel_id == kernel_id:
                return n
        return None


def apply(state: SearchState, event: Event) -> SearchState:
    """Fold one event into `state` (in place) and return it.

    Raises:
        LogError: the event does not fit the state (a log written by something else).
    """
    if isinstance(event, Started):
        if state.config is not None:
            raise LogError("a second Started event")
        state.config = SearchConfig.from_dict(event.config)
        state.root = event.root
        state.kernels[event.root.kernel_id] = event.root
        return state
    if state.config is None:
        raise LogError(f"{event.kind} before Started")
    if state.finished is not None:
        raise LogError(f"{event.kind} after Finished")
    if isinstance(event, Measured):
        return _apply_measured(state, event)
    if isinstance(event, Finished):
        state.finished = event.reason
        return state
    if isinstance(event, StepStarted):
        if state.current is not None or event.step != state.next_step:
            raise LogError(f"step {event.step} started out of order")
        state.current = StepContext(event.step, tuple(event.parents))
        return state
    cur = state.current
    if cur is None or getattr(event, "step", None) != cur.step:
        raise LogError(f"{event.kind} outside its step")
    if isinstance(event, Proposed):
        cur.proposals[event.parent] = tuple(event.children)
        for c in event.children:
            state.kernels.setdefault(c.kernel_id, c)
            state.considered.add(c.kernel_id)
    elif isinstance(event, Forecasted):
        probs = np.asarray(event.probs, dtype=np.float64).reshape(len(cur.proposals[event.parent]), NUM_BINS)
        cur.forecasts[event.parent] = probs
        state.forecasts += probs.shape[0]
        state.forecast_errors += event.error is not None
    elif isinstance(event, Selected):
        cur.selected[event.parent] = (tuple(event.measure), tuple(event.trusted))
    elif isinstance(event, StepCompleted):
        _complete_step(state, cur)
    else:  # pragma: no cover - every kind is handled above
        raise LogError(f"unknown event {event!r}")
    return state


def _apply_measured(state: SearchState, event: Measured) -> SearchState:
    cfg = state.config
    if event.step == -1:
        if state.root_outcome is not None or len(event.outcomes) != 1 \
                or event.outcomes[0].kernel_id != state.root.kernel_id:
            raise LogError("the root's measurement does not fit")
        out = event.outcomes[0]
        state.root_outcome = out
        state.closed.add(out.kernel_id)
        if out.ok:
            state.archive = [puct.Node(out.kernel_id, math.log2(out.speedup), None, ())]
            state.best_curve = [out.speedup]
            state.best_kernel = out.kernel_id
        return state
    cur = state.current
    if cur is None or event.step != cur.step or cur.outcomes is not None:
        raise LogError(f"measurements of step {event.step} do not fit")
    expected = cur.to_measure()
    if [o.kernel_id for o in event.outcomes] != [kid for kid, _ in expected]:
        raise LogError(f"step {event.step}: measured kernels differ from the selected ones")
    cur.outcomes = {o.kernel_id: o for o in event.outcomes}
    for out, (kid, parent) in zip(event.outcomes, expected, strict=True):
        state.spent += 1
        pnode = state.node(parent)
        pspeed = 2.0 ** pnode.reward if pnode is not None else float("nan")
        state.measured.append(MeasuredRow(state.spent, event.step, kid, parent, out, pspeed))
        state.closed.add(kid)
        best = state.best_curve[-1]
        if out.ok and out.speedup > best:
            best, state.best_kernel = out.speedup, kid
        state.best_curve.append(best)
    if state.spent > cfg.budget:
        raise LogError(f"{state.spent} measurements spent, budget {cfg.budget}")
    return state


def _anchor_log2(state: SearchState, parent: str) -> float:
    if state.config.anchor == "parent":
        node = state.node(parent)
        return node.reward if node is not None else 0.0
    return 0.0  # the reference's speedup is 1 by definition


def _complete_step(state: SearchState, cur: StepContext) -> None:
    if cur.outcomes is None or any(p not in cur.selected for p in cur.parents):
        raise LogError(f"step {cur.step} completed before its measurements")
    by_id = {n.kernel_id: n for n in state.archive}
    kids: dict[str, list[puct.Node]] = {}
    for p in cur.parents:
        parent = by_id.get(p)
        if parent is None:
            continue
        measure, trusted = cur.selected[p]
        valid: list[puct.Node] = []
        for kid in measure:
            out = cur.outcomes[kid]
            if out.ok:
                valid.append(puct.Node(kid, math.log2(out.speedup), p, (p, *parent.ancestors)))
        if trusted:
            probs = cur.forecasts[p]
            ids = [c.kernel_id for c in cur.proposals[p]]
            scores = expected_log2(probs)
            for kid in trusted:
                reward = _anchor_log2(state, p) + float(scores[ids.index(kid)])
                valid.append(puct.Node(kid, reward, p, (p, *parent.ancestors), measured=False))
                state.trusted.append((kid, p, 2.0 ** reward))
                state.closed.add(kid)
        kids[p] = valid
    best_reward = {p: max(n.reward for n in v) for p, v in kids.items() if v}
    state.expansions = puct.backpropagate(cur.parents, best_reward, by_id, state.visits, state.best_child,
                                          state.expansions)
    puct.admit(state.archive, kids, state.config.admit_per_parent, state.config.capacity, state.root.kernel_id)
    state.next_step = cur.step + 1
    state.current = None


def replay(events: list[Event] | tuple[Event, ...]) -> SearchState:
    """The state after `events` (a fresh state for an empty log)."""
    state = SearchState()
    for e in events:
        apply(state, e)
    return state


# ---- decisions ----------------------------------------------------------------------------
def _rng(cfg: SearchConfig, step: int, slot: int, purpose: int) -> np.random.Generator:
    return np.random.default_rng([cfg.seed, step, slot, purpose])


def _available(state: SearchState, parent: Child, excluded: set[str]) -> list[Child]:
    return [c for c in space.children(state.config.task, parent) if c.kernel_id not in excluded]


def _propose(state: SearchState, cur: StepContext) -> list[Event]:
    cfg = state.config
    excluded = set(state.closed) | {n.kernel_id for n in state.archive}
    events: list[Event] = []
    for j, p in enumerate(cur.parents):
        if p in cur.proposals:
            excluded |= {c.kernel_id for c in cur.proposals[p]}
            continue
        avail = _available(state, state.kernels[p], excluded)
        m = min(cfg.draws_per_parent, len(avail))
        picks = _rng(cfg, cur.step, j, _DRAW_PROPOSE).choice(len(avail), size=m, replace=False) if m else []
        children = tuple(avail[int(i)] for i in picks)
        excluded |= {c.kernel_id for c in children}
        events.append(Proposed(cur.step, p, children))
    return events


def _ranked(scores: np.ndarray, rng: np.random.Generator) -> list[int]:
    """Indices by score descending; equal scores in a random order."""
    ties = rng.permutation(scores.size)
    rounded = np.round(scores, _SCORE_DECIMALS)
    return sorted(range(scores.size), key=lambda i: (-rounded[i], ties[i]))


def _select(state: SearchState, cur: StepContext) -> list[Event]:
    cfg = state.config
    left = cfg.budget - state.spent
    events: list[Event] = []
    for j, p in enumerate(cur.parents):
        if p in cur.selected:  # a log cut between the Selected events of one step
            left -= len(cur.selected[p][0])
            continue
        kids = cur.proposals[p]
        slots = min(cfg.measure_per_parent, left, len(kids))
        left -= slots
        ids = [c.kernel_id for c in kids]
        trusted: list[str] = []
        if cfg.mode == "standard":
            order = list(range(len(ids)))
        elif cfg.mode == "random":
            order = [int(i) for i in _rng(cfg, cur.step, j, _DRAW_RANDOM).permutation(len(ids))]
        else:
            probs = cur.forecasts[p]
            order = _ranked(expected_log2(probs), _rng(cfg, cur.step, j, _DRAW_TIES))
            if cfg.mode == "selective":
                sure = confidence(probs) >= cfg.confidence
                # uncertain candidates get the GPU first; confident ones only fill what is left
                order = [i for i in order if not sure[i]] + [i for i in order if sure[i]]
                trusted = [ids[i] for i in order[slots:] if sure[i]]
        events.append(Selected(cur.step, p, tuple(ids[i] for i in order[:slots]), tuple(trusted)))
    return events


def _eligible(state: SearchState) -> set[str]:
    """Archive nodes with at least one mutation the run has not measured, trusted or archived."""
    excluded = set(state.closed) | {n.kernel_id for n in state.archive}
    return {n.kernel_id for n in state.archive if _available(state, state.kernels[n.kernel_id], excluded)}


def next_action(state: SearchState) -> Action:
    """What the run does next, from its state alone.

    Raises:
        LogError: the state has no config (the log lacks its Started event).
    """
    cfg = state.config
    if cfg is None:
        raise LogError("the log has no Started event")
    if state.finished is not None:
        return Done(state.finished)
    if state.root_outcome is None:
        return NeedMeasure(-1, ((state.root, None),))
    if not state.root_outcome.ok:
        return Emit((Finished("root failed"),))
    cur = state.current
    if cur is None:
        if state.spent >= cfg.budget:
            return Emit((Finished("budget spent"),))
        # no parent is expanded that the remaining budget could not give a measurement
        batch = min(cfg.batch_size, -(-(cfg.budget - state.spent) // cfg.measure_per_parent))
        parents = puct.select_parents(
            state.archive, state.visits, state.best_child, state.expansions,
            state.root.kernel_id, batch, cfg.c_puct, eligible=_eligible(state),
        )
        if not parents:
            return Emit((Finished("nothing left to expand"),))
        return Emit((StepStarted(state.next_step, tuple(parents)),))
    if any(p not in cur.proposals for p in cur.parents):
        return Emit(tuple(_propose(state, cur)))
    if cfg.forecasts:
        for p in cur.parents:
            if p not in cur.forecasts and cur.proposals[p]:
                anchor = state.kernels[p] if cfg.anchor == "parent" else None
                return NeedForecast(cur.step, p, anchor, cur.proposals[p])
            if p not in cur.forecasts:
                return Emit((Forecasted(cur.step, p, ()),))
    if any(p not in cur.selected for p in cur.parents):
        return Emit(tuple(_select(state, cur)))
    if cur.outcomes is None:
        todo = cur.to_measure()
        if not todo:
            return Emit((Measured(cur.step, ()),))
        return NeedMeasure(cur.step, tuple((state.kernels[kid], p) for kid, p in todo))
    return Emit((StepCompleted(cur.step),))
