"""GPU MODE's benchmark loop, and two such loops timed by turns (the kernel's and the reference's).

The loop reproduces GPU MODE's eval.py (timing.py's module docstring gives its rules), on a GPU and on
the CPU; `Turns` and `interleaved_steps` let the kernel's and the reference's loops of a case take
turns, so both meet the same state of the host (docs/results/harness.md). Harness code the integrity
watch covers (integrity.HARNESS_MODULES).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pipelines.profiling.call_feed import Feed, plain_feed
from pipelines.profiling.clock_checks import check_recorded_cpu, wall_check_calls, wall_check_steps
from pipelines.profiling.timing import Steps, Timing, drive, summarize

# GPU MODE's eval.py (problems/bioml/trimul): benchmark mode limits.
GPUMODE_MAX_REPEATS = 100
GPUMODE_MAX_TIME_NS = 10e9  # stop once mean * calls passes this
GPUMODE_WALL_NS = 120e9  # or this much wall time has passed
GPUMODE_REL_ERR = 0.001  # or the standard error of the mean is under 0.1% of it
GPUMODE_WARMUP_NS = 1e8  # the warm-up run's max_time_ns


def gpumode_should_stop(durations_ns: list[float], wall_ns: float, max_time_ns: float = GPUMODE_MAX_TIME_NS) -> bool:
    """GPU MODE's stopping rule, checked after each call from the third on.

    >>> gpumode_should_stop([1e6, 1e6], 0.0), gpumode_should_stop([1e6] * 3, 0.0)
    (False, True)
    >>> gpumode_should_stop([1e6, 2e6, 1e6], 0.0), gpumode_should_stop([4e9, 3e9, 4e9], 0.0)
    (False, True)
    """
    n = len(durations_ns)
    if n < 3:
        return False
    mean = sum(durations_ns) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in durations_ns) / (n - 1))
    err = std / math.sqrt(n)
    return err / mean < GPUMODE_REL_ERR or mean * n > max_time_ns or wall_ns > GPUMODE_WALL_NS


class Turns:
    """Two gpumode loops timed by turns (interleaved_steps): how many timed calls a turn has, and
    which loops' stopping rules have been met. A loop whose rule is met goes on until the other's
    is too (or its own call cap): the side that stopped first would not meet the other's noisier
    stretch, and identical code would measure apart (docs/results/harness.md)."""

    def __init__(self, calls: int, loops: int = 2, log: list | None = None):
        self.calls = calls
        self.ready = [False] * loops  # all loops count from the start, before the later ones make a call
        self.joined = 0
        # Diagnostics (the worker's --call-times): every timed call of the loops in the order
        # made, as (loop, ms since the first, event or perf_counter ms, wall ms, first of a turn).
        self.log = log
        self._t0: float | None = None

    def record(self, loop: int, t0: float, took_ms: float, wall_ms: float, resumed: bool) -> None:
        if self.log is None:
            return
        if self._t0 is None:
            self._t0 = t0
        self.log.append((loop, round((t0 - self._t0) * 1e3, 4), round(took_ms, 5), round(wall_ms, 5), resumed))

    def join(self) -> int:
        self.joined += 1
        return self.joined - 1


def gpumode_steps(feed: Feed, *, device: str, max_repeats: int = GPUMODE_MAX_REPEATS,
                  max_time_ns: float = GPUMODE_MAX_TIME_NS, turns: Turns | None = None) -> Steps:
    """GPU MODE's timed loop (module docstring) as steps; returns a Timing.

    With `turns`: after every `turns.calls` timed calls the loop yields PAUSE, so that
    `interleaved_steps` can run the other loop's calls, and on resuming makes one untimed call
    (what the other loop's calls evicted from the caches is back, as GPU MODE's loop has it); it
    stops once its own rule and the other loop's have been met. Time paused does not count
    towards the loop's wall-time limit.
    """
    durations_ms: tuple[float, ...] = ()
    walls: list[float] = []
    brackets_ms: tuple[float, ...] = ()  # CPU: each call's time by a second clock, to hold the records to
    start_ns = time.perf_counter_ns()
    paused_ns = 0
    turns = turns or Turns(calls=max(1, max_repeats) + 1, loops=1)  # alone: no pause, its own rule stops it
    me = turns.join()
    hand_over = False  # this loop's rule was just met: the other loop's turn now, to meet its own
    for i in range(max(1, max_repeats)):
        resumed = False
        if i > 0 and (hand_over or i % turns.calls == 0):
            hand_over, resumed = False, True
            p0 = time.perf_counter_ns()
            yield PAUSE
            paused_ns += time.perf_counter_ns() - p0
            if turns.ready[me] and all(turns.ready):
                break  # the other loop's rule was met in its turn
            out = yield feed.fill()  # untimed
            del out
        data = feed.fill()
        if device == "cuda":
            torch.cuda.synchronize()
            ev_start, ev_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            ev_start.record()
            out = yield data
            ev_end.record()
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
            durations_ms = durations_ms + (ev_start.elapsed_time(ev_end),)
        else:
            m0 = time.monotonic_ns()
            t0 = time.perf_counter()
            out = yield data
            took = time.perf_counter() - t0
            brackets_ms = brackets_ms + ((time.monotonic_ns() - m0) / 1e6,)
            durations_ms = durations_ms + (took * 1e3,)
            walls.append(took)
        turns.record(me, t0, durations_ms[-1], walls[-1] * 1e3, resumed)
        feed.took(out)
        del out
        if not turns.ready[me] and gpumode_should_stop([d * 1e6 for d in durations_ms],
                                                       time.perf_counter_ns() - start_ns - paused_ns, max_time_ns):
            turns.ready[me] = hand_over = True
        if turns.ready[me] and all(turns.ready):
            break
    turns.ready[me] = True  # out of calls: the other loop need not wait for this one
    if device == "cuda":
        yield from wall_check_steps(feed, float(np.median(durations_ms)), float(np.median(walls)), 0.0,
                                    wall_check_calls(float(np.median(walls))))
    else:
        check_recorded_cpu(durations_ms, brackets_ms)
    return summarize(durations_ms)


class PAUSE:  # noqa: N801 - a sentinel: a loop's sign that another loop may make calls now
    """Yielded by a loop timed by `Turns`; never passed to a callable."""


class ReferenceFailed(Exception):
    """The harness's own callable (the reference) raised in `interleaved_steps`: not the kernel's failure."""


def interleaved_steps(kernel: Steps, reference: Steps, call_reference: Callable[[Any], Any],
                      turn: Callable[[str], None] | None = None, seconds: dict | None = None) -> Steps:
    """Two loops' steps by turns, switching at each PAUSE: the kernel's calls are yielded (drive
    makes them, from its one call site), the reference's made here by `call_reference`.
    Returns (the kernel loop's result, the reference loop's result).

    Under gpumode, timed one loop after the other, identical code measured far from 1 on single
    short cases: GPU MODE's loop times the host's launch work with every call, and the host's
    speed moves between the two loops (docs/results/harness.md). Taken by turns of a few calls,
    both loops meet the same host. `turn(side)` runs before each turn ("kernel" | "reference"), out of
    any timed window (the reference's torch switches go in and out there); `seconds` adds up
    each side's wall time.
    """
    loops = {"kernel": kernel, "reference": reference}
    nxt: dict[str, Any] = {}
    results: dict[str, Any] = {}

    def step(side: str, value: Any = None, error: BaseException | None = None) -> None:
        try:
            nxt[side] = loops[side].throw(error) if error is not None else (
                next(loops[side]) if side not in nxt else loops[side].send(value))
        except StopIteration as stop:
            results[side] = stop.value

    while len(results) < 2:
        for side in ("kernel", "reference"):
            if side in results:
                continue
            t0 = time.perf_counter()
            if turn is not None:
                turn(side)
            if nxt.get(side) is PAUSE or side not in nxt:
                step(side)  # start, or resume after the pause
            while side not in results and nxt[side] is not PAUSE:
                if side == "kernel":
                    try:
                        out = yield nxt[side]
                    except Exception as e:  # noqa: BLE001 - the kernel's: thrown into its loop
                        step(side, error=e)
                        continue
                else:
                    try:
                        out = call_reference(nxt[side])
                    except Exception as e:  # noqa: BLE001
                        raise ReferenceFailed(str(e)) from e
                step(side, out)
                out = None
            if seconds is not None:
                seconds[side] = seconds.get(side, 0.0) + time.perf_counter() - t0
    return results["kernel"], results["reference"]


def time_gpumode(fn: Callable[[Any], Any], data: Any, *, device: str, max_repeats: int = GPUMODE_MAX_REPEATS,
                 max_time_ns: float = GPUMODE_MAX_TIME_NS) -> Timing:
    """GPU MODE's timed loop (module docstring) on `data`, reused by every call.

    On a GPU each call is synchronised before and after and bracketed by CUDA events; on the
    CPU by perf_counter. Raises TimingTampered when the wall clock contradicts the events.
    """
    return drive(fn, gpumode_steps(plain_feed(data), device=device, max_repeats=max_repeats, max_time_ns=max_time_ns))


def gpumode_warmup_steps(feed: Feed, device: str) -> Steps:
    """GPU MODE's warm-up: the benchmark loop on the first case with a 0.1 s budget, untimed."""
    yield from gpumode_steps(feed, device=device, max_time_ns=GPUMODE_WARMUP_NS)
