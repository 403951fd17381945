"""Timings held to a second clock: CUDA events against the wall clock, CPU records against brackets.

A kernel runs in the process that times it, so it could patch the timer, work on a stream the events
do not see, or rewrite the times a loop recorded. Every timed loop (cuda_timing, gpumode_timing,
cpu_timing) ends with these checks: events cannot add up to more than the wall time that passed, a
synchronised call far slower than its events ran work they did not see (`TimingTampered`), unless a
call of our own is as slow (`GpuShared`: another process uses the GPU), and on the CPU each recorded
time must match a monotonic-clock bracket of the same call. Harness code the integrity watch covers
(integrity.HARNESS_MODULES).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pipelines.profiling.call_feed import Feed, plain_feed
from pipelines.profiling.timing import GpuShared, Steps, TimingTampered, clone_data, drive

# Wall-clock cross-checks (seconds / factors): a synchronised call may take longer than its
# events by the host's enqueue and the synchronisation, never by more than this.
WALL_SLACK_S = 200e-6
WALL_FACTOR = 2.0
WALL_CHECK_CALLS = 5
WALL_CHECK_S = 0.05  # ... fewer (at least 2) where 5 calls would take longer than this


def wall_check_calls(per_call_s: float) -> int:
    """Synchronised calls the wall-clock check of a case makes: 5, or as many as fit in 50 ms
    (at least 2). A generated trimul kernel of 300 ms a call spent 1.5 s a case on them (harness
    5); at that length the host's enqueue and synchronisation are far inside the check's slack,
    so two calls tell work outside the events as well as five.

    >>> wall_check_calls(20e-6), wall_check_calls(0.02), wall_check_calls(0.3)
    (5, 2, 2)
    """
    return max(2, min(WALL_CHECK_CALLS, int(WALL_CHECK_S / max(per_call_s, 1e-9))))


def _events_beyond_wall(event_ms: float, wall_s: float) -> bool:
    """More device time than wall time passed: only a patched timer makes that."""
    return event_ms * 1e-3 > wall_s * 1.05 + 1e-3


def check_chunk_wall(event_ms: list[float], wall_s: float) -> None:
    """Events recorded in one go cannot add up to more than the wall time around them."""
    if _events_beyond_wall(sum(event_ms), wall_s):
        raise TimingTampered(f"CUDA events report {sum(event_ms):.3f} ms in {wall_s * 1e3:.3f} ms of wall time")


def check_call_wall(event_ms: float, wall_s: float, enqueue_s: float = 0.0) -> None:
    """A synchronised call's wall time against its event time (medians over a few calls)."""
    if wall_s > WALL_FACTOR * event_ms * 1e-3 + enqueue_s + WALL_SLACK_S:
        raise TimingTampered(f"a call takes {wall_s * 1e3:.3f} ms of wall time but its CUDA events say "
                             f"{event_ms:.3f} ms (work outside the timed stream, or a patched timer)")
    if _events_beyond_wall(event_ms, wall_s):
        raise TimingTampered(f"CUDA events report {event_ms:.3f} ms for a call of {wall_s * 1e3:.3f} ms")

def trusted_call_times() -> tuple[float, float]:
    """(event ms, synchronised wall s), medians of a few calls of a small torch op of our own."""
    torch.cuda.synchronize()  # whatever the kernel left on any stream is done first
    x = torch.empty(1 << 20, device="cuda")
    events, walls = _wall_probe(lambda d: d.add_(1.0), x, WALL_CHECK_CALLS)
    return float(np.median(events)), float(np.median(walls))


def check_kernel_wall(event_ms: float, wall_s: float, enqueue_s: float = 0.0,
                      trusted: Callable[[], tuple[float, float]] | None = None) -> None:
    """`check_call_wall` for a kernel's calls, telling a shared GPU from a kernel that cheats.

    When a kernel's calls take far longer than their events, a call of our own is timed the same
    way right after (the device synchronised first, so a kernel's leftover work is finished): if it
    is off by as much, the GPU is shared (`GpuShared`: the row is `infrastructure`, retried by a
    resumed run); if it is not, the kernel worked outside its timed stream (`TimingTampered`).
    """
    try:
        check_call_wall(event_ms, wall_s, enqueue_s)
    except TimingTampered as e:
        if _events_beyond_wall(event_ms, wall_s):
            raise  # whoever else runs on the GPU
        ours_ms, ours_wall_s = (trusted or trusted_call_times)()
        try:
            check_call_wall(ours_ms, ours_wall_s)
        except TimingTampered:
            raise GpuShared(f"{e}; a call of our own right after takes {ours_wall_s * 1e3:.3f} ms of wall time "
                            f"for {ours_ms:.3f} ms of events: another process is using the GPU") from None
        raise


def _probe_steps(feed: Feed, n: int, clone_inside: bool = False) -> Steps:
    """(event ms, synchronised wall s) of `n` calls, each on its own, with no cover or flush."""
    events, walls = [], []
    for _ in range(n):
        data = feed.fill()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        out = yield (clone_data(data) if clone_inside else data)
        end.record()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
        events.append(start.elapsed_time(end))
        feed.took(out)
        del out
    return events, walls


def wall_check_steps(feed: Feed, event_ms: float, wall_s: float, enqueue_s: float, n: int,
                     clone_inside: bool = False) -> Steps:
    """`check_kernel_wall` on a kernel's calls (medians), and when it fails, once more on `n` new
    synchronised calls, which decide. A cheat that works outside its events does so on every call
    it cannot tell apart, and fails again; a stall of the host or the GPU that passed does not:
    on the H200 the reference itself, as a kernel, once read 2.2 ms of wall time for 0.48 ms of
    events over a whole case, while the call of our own timed right after was normal."""
    try:
        check_kernel_wall(event_ms, wall_s, enqueue_s)
    except TimingTampered:
        events, walls = yield from _probe_steps(feed, n, clone_inside)
        check_kernel_wall(float(np.median(events)), float(np.median(walls)), enqueue_s)


def _wall_probe(fn: Callable[[Any], Any], data: Any, n: int) -> tuple[list[float], list[float]]:
    """(event ms, synchronised wall s) of `n` calls of `fn` (our own callables only)."""
    return drive(fn, _probe_steps(plain_feed(data), n))


# The CPU loop's recorded times against a second clock around the same calls, call by call:
# a record is the call's own perf_counter difference, so it can fall short of its bracket only
# by clock granularity, never by a factor. A busy host may deschedule the process inside one
# bracket but outside the record (a 12 ms gap on a loaded 2-core machine has been seen), so one
# call off is noise; a rewrite of what the loop recorded changes most of the calls.
CPU_RECORD_FACTOR = 1.5
CPU_RECORD_SLACK_S = 2e-4  # per call


def check_recorded_cpu(times_ms: tuple[float, ...], brackets_ms: tuple[float, ...]) -> None:
    """Raise TimingTampered when most recorded times fall far short of their calls' brackets (a
    kernel that rewrote what the loop had recorded), or exceed them (a patched clock)."""
    if len(times_ms) != len(brackets_ms):
        raise TimingTampered(f"{len(times_ms)} times are recorded for {len(brackets_ms)} timed calls")
    slack_ms = CPU_RECORD_SLACK_S * 1e3
    short = sum(t * CPU_RECORD_FACTOR + slack_ms < b for t, b in zip(times_ms, brackets_ms, strict=True))
    long = sum(t > b * CPU_RECORD_FACTOR + slack_ms for t, b in zip(times_ms, brackets_ms, strict=True))
    half = len(times_ms) / 2
    if short > half:
        raise TimingTampered(f"the timed calls took {sum(brackets_ms):.3f} ms but {sum(times_ms):.3f} ms are recorded "
                             f"({short} of {len(times_ms)} calls short)")
    if long > half:
        raise TimingTampered(f"{sum(times_ms):.3f} ms are recorded for calls of {sum(brackets_ms):.3f} ms "
                             f"({long} of {len(times_ms)} calls long)")
