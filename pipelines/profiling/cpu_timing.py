"""The CPU timed loop (CPU mode and the Triton interpreter: CI-sized settings), for every protocol.

Calls are timed by perf_counter, each also bracketed by time.monotonic_ns and held to it
(clock_checks.check_recorded_cpu); under gpumode the loop is gpumode_timing's. Harness code the
integrity watch covers (integrity.HARNESS_MODULES).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pipelines.profiling.call_feed import Feed, plain_feed
from pipelines.profiling.clock_checks import check_recorded_cpu
from pipelines.profiling.gpumode_timing import Turns, gpumode_steps
from pipelines.profiling.timing import (
    Steps,
    Timing,
    TimingSettings,
    _should_stop,
    clone_data,
    drive,
    summarize,
)


def cpu_steps(feed: Feed, settings: TimingSettings, *, protocol: str = "kernelcast", turns: Turns | None = None) -> Steps:
    """The CPU timed loop of `protocol` as steps (see time_cpu); returns a Timing.

    Each call's wall time is read a second way, by `time.monotonic_ns` around it, and held to
    the recorded times (check_recorded_cpu). `turns`: gpumode only (gpumode_steps)."""
    if protocol == "gpumode":
        return (yield from gpumode_steps(feed, device="cpu", max_repeats=settings.max_reps, turns=turns))
    clone_inside = protocol == "paper"
    data = feed.fill()
    out = yield (clone_data(data) if clone_inside else data)  # one warm-up call
    feed.took(out)
    del out
    times: tuple[float, ...] = ()
    brackets: tuple[float, ...] = ()
    start = time.perf_counter()
    while True:
        data = feed.fill()
        m0 = time.monotonic_ns()
        t0 = time.perf_counter()
        out = yield (clone_data(data) if clone_inside else data)  # paper: the clone inside the window
        took = time.perf_counter() - t0
        brackets = brackets + ((time.monotonic_ns() - m0) / 1e6,)
        times = times + (took * 1e3,)  # ms
        feed.took(out)
        del out
        if _should_stop(list(times), time.perf_counter() - start, settings, median=protocol == "kernelcast"):
            break
    check_recorded_cpu(times, brackets)
    return summarize(times)


def time_cpu(
    fn: Callable[[Any], Any], data: Any, settings: TimingSettings, *, protocol: str = "kernelcast"
) -> Timing:
    """Time `fn(data)` with perf_counter (CPU mode, Triton interpreter): few reps, for CI."""
    return drive(fn, cpu_steps(plain_feed(data), settings, protocol=protocol))
