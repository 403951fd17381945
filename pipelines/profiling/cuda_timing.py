"""The CUDA timed loop of the kernelcast and paper protocols (timing.py describes both).

kernelcast flushes the L2 (`L2Flusher`) and spins the GPU (`LaunchCover`) before each call, times
each call with its own pair of CUDA events, in chunks until the median's confidence interval is
tight; paper clones the input inside the timed window and stops on the mean's standard error. A
call of SLOW_CALL_S or more is timed one synchronised call at a time. Under gpumode `cuda_steps`
hands over to gpumode_timing. Every loop ends with the wall-clock checks of clock_checks.py.
Harness code the integrity watch covers (integrity.HARNESS_MODULES).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pipelines.profiling.call_feed import Feed, plain_feed
from pipelines.profiling.clock_checks import (
    _probe_steps,
    check_chunk_wall,
    wall_check_calls,
    wall_check_steps,
)
from pipelines.profiling.gpumode_timing import GPUMODE_MAX_REPEATS, Turns, gpumode_steps
from pipelines.profiling.timing import (
    Steps,
    Timing,
    TimingSettings,
    _should_stop,
    clone_data,
    drive,
    host_ms_of,
    summarize,
)

# A call at least this long (its first warm-up call's wall time) is a slow call: one warm-up call
# (its checks already ran it on this case), and every timed call synchronised on its own and held
# to the wall clock as the probe's calls are, so no probe calls follow. At 5 ms the host's few
# microseconds between synchronised calls are under 1% of the GPU's time; trimul's generated
# kernels (37 ms a call on average) made 2 warm-up and 2 probe calls a case beside 3-9 timed ones.
SLOW_CALL_S = 5e-3
FIRST_CHUNK = 16  # timed calls in the first chunk of a case (at least min_reps)


class L2Flusher:
    """A device buffer of at least 2x the L2 size; `flush()` enqueues a write over all of it.

    Writing (zero_) rather than reading evicts every line the previous call left in L2, and the
    write is stream-ordered before the start event, so it is never inside a timed window.
    """

    def __init__(self, l2_bytes: int, device: str = "cuda", min_bytes: int = 128 * 2**20):
        self.nbytes = max(2 * int(l2_bytes), int(min_bytes))  # H200: L2 60 MB -> 128 MiB buffer
        self.buf = torch.empty(self.nbytes // 4, dtype=torch.int32, device=device)

    def flush(self) -> None:
        self.buf.zero_()


class LaunchCover:
    """A device-side spin of a chosen length, enqueued just before a timed call's start event.

    The host needs some microseconds per launch; if the GPU is idle meanwhile, a callable of
    several launches is timed with the host's gaps inside it, and those gaps grow whenever the
    CPU is busy. Spinning the GPU for longer than the enqueue takes means every launch of the
    call is queued before its start event fires, so the events measure device time alone.
    `torch.cuda._sleep` counts clock cycles; one calibration converts seconds to cycles.
    """

    MAX_S = 5e-3  # never spin longer than this per call

    def __init__(self) -> None:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 2_000_000
        torch.cuda._sleep(cycles)  # first call of the spin kernel loads it; untimed
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize()
        # Calibrated while clocks may still be ramping: a low estimate only lengthens spins.
        self.cycles_per_s = cycles / max(start.elapsed_time(end) * 1e-3, 1e-6)

    def cover(self, seconds: float) -> None:
        torch.cuda._sleep(int(min(seconds, self.MAX_S) * self.cycles_per_s))


def cover_seconds(enqueue_s: list[float]) -> float:
    """How long to spin before each timed call: twice the slowest host enqueue seen in
    warm-up (the first call, which may JIT-compile, excluded) plus 20 us of margin.

    >>> round(cover_seconds([1.0, 10e-6, 30e-6]) * 1e6)
    80
    """
    rest = enqueue_s[1:] or enqueue_s
    return min(2 * max(rest) + 20e-6, LaunchCover.MAX_S)


def cuda_steps(feed: Feed, settings: TimingSettings, *, protocol: str = "kernelcast",
               flusher: L2Flusher | None = None, launch_cover: LaunchCover | None = None, turns: Turns | None = None) -> Steps:
    """The CUDA timed loop of `protocol` as steps (see time_cuda); returns a Timing.
    `turns`: gpumode only (gpumode_steps)."""
    if protocol == "gpumode":
        return (yield from gpumode_steps(feed, device="cuda", max_repeats=min(settings.max_reps, GPUMODE_MAX_REPEATS),
                                         turns=turns))
    flush = flusher.flush if (protocol == "kernelcast" and flusher is not None) else None
    cover = launch_cover if protocol == "kernelcast" else None
    clone_inside = protocol == "paper"

    # Warm-up: JIT compilation, autotuning, allocator growth, clocks ramping up. Untimed.
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n_warm = 0
    enqueue_s: list[float] = []  # host time to enqueue one call (the GPU may still be running it)
    while True:
        data = feed.fill()
        if flush:
            flush()
        t_call = time.perf_counter()
        out = yield (clone_data(data) if clone_inside else data)
        enqueue_s.append(time.perf_counter() - t_call)
        feed.took(out)
        del out
        torch.cuda.synchronize()
        n_warm += 1
        warm_s = time.perf_counter() - t0
        if n_warm == 1 and warm_s >= SLOW_CALL_S:
            break
        if n_warm >= 2 and (warm_s * 1e3 >= settings.warmup_ms or n_warm >= 100):
            break
    per_call_s = max(warm_s / n_warm, 1e-6)
    spin_s = cover_seconds(enqueue_s) if cover else 0.0
    if per_call_s >= SLOW_CALL_S:
        return (yield from _slow_timed_calls(feed, settings, protocol, flush, cover, spin_s, clone_inside, enqueue_s))

    times: tuple[float, ...] = ()  # a tuple: what was recorded cannot be rewritten in place
    issued_s: list[float] = []  # the host's time to issue each timed call (the cover runs meanwhile)
    start = time.perf_counter()
    size = max(settings.min_reps, FIRST_CHUNK)
    while True:
        # Chunks of at most ~50 ms keep the host ahead of the GPU while stop checks stay
        # frequent; the first is small and each next one twice as large, so a case whose
        # median is tight after a few dozen calls stops there instead of after 100.
        chunk = int(min(max(1, 0.05 / per_call_s), settings.max_reps - len(times), size, 100))
        size *= 2
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(chunk)]
        t_chunk = time.perf_counter()
        for ev_start, ev_end in events:
            out, host_s = yield from _timed_call(feed, flush, cover, spin_s, clone_inside, ev_start, ev_end)
            issued_s.append(host_s)
            feed.took(out)
            del out
        torch.cuda.synchronize()  # device-wide: work the kernel left on other streams is done too
        chunk_ms = tuple(ev_start.elapsed_time(ev_end) for ev_start, ev_end in events)
        check_chunk_wall(list(chunk_ms), time.perf_counter() - t_chunk)
        times = times + chunk_ms  # ms
        if _should_stop(list(times), time.perf_counter() - start, settings, median=protocol == "kernelcast"):
            break
    n_probe = wall_check_calls(per_call_s)
    probe_events, probe_walls = yield from _probe_steps(feed, n_probe, clone_inside)
    yield from wall_check_steps(feed, float(np.median(probe_events)), float(np.median(probe_walls)),
                                float(np.median(enqueue_s[1:] or enqueue_s)), n_probe, clone_inside)
    return _with_host(summarize(times), cover, issued_s, probe_walls)


def _with_host(timing: Timing, cover: LaunchCover | None, issued_s: list[float], synced_wall_s: list[float]) -> Timing:
    """`timing` with the host's time per call where the calls were covered (kernelcast)."""
    if cover is None or not issued_s or not synced_wall_s:
        return timing
    return Timing(timing.median_ms, timing.mean_ms, timing.stderr_ms, timing.reps, host_ms_of(issued_s, synced_wall_s))


def _timed_call(feed: Feed, flush: Callable[[], None] | None, cover: LaunchCover | None, spin_s: float,
                clone_inside: bool, ev_start: Any, ev_end: Any) -> Steps:
    """One timed call as a step: its new values, the flush and the spin before it, the events
    around it; returns its output and the host's time to issue it (seconds)."""
    data = feed.fill()
    if flush:
        flush()
    if cover:
        cover.cover(spin_s)
    ev_start.record()
    t_issue = time.perf_counter()
    out = yield (clone_data(data) if clone_inside else data)
    host_s = time.perf_counter() - t_issue
    ev_end.record()
    return out, host_s


def _slow_timed_calls(feed: Feed, settings: TimingSettings, protocol: str, flush: Callable[[], None] | None,
                      cover: LaunchCover | None, spin_s: float, clone_inside: bool, enqueue_s: list[float]) -> Steps:
    """The timed loop of a slow call (SLOW_CALL_S): each call synchronised on its own, with the
    same value copy, flush and cover before it as in chunks. An event recorded before the copy
    tells the device time of what precedes the call, so each call's wall time less that is the
    probe's synchronised wall time; their medians are checked as the probe's are."""
    times: tuple[float, ...] = ()
    walls: list[float] = []
    issued_s: list[float] = []
    start = time.perf_counter()
    while True:
        before, ev_start, ev_end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        t_call = time.perf_counter()
        before.record()
        out, host_s = yield from _timed_call(feed, flush, cover, spin_s, clone_inside, ev_start, ev_end)
        issued_s.append(host_s)
        torch.cuda.synchronize()  # device-wide: work the kernel left on other streams is done too
        wall_s = time.perf_counter() - t_call
        feed.took(out)
        del out
        call_ms = ev_start.elapsed_time(ev_end)
        check_chunk_wall([call_ms], wall_s)
        walls.append(wall_s - before.elapsed_time(ev_start) * 1e-3)
        times = times + (call_ms,)
        if _should_stop(list(times), time.perf_counter() - start, settings, median=protocol == "kernelcast"):
            break
    yield from wall_check_steps(feed, float(np.median(times)), float(np.median(walls)),
                                float(np.median(enqueue_s[1:] or enqueue_s)), wall_check_calls(float(np.median(walls))), clone_inside)
    return _with_host(summarize(times), cover, issued_s, walls)


def time_cuda(
    fn: Callable[[Any], Any],
    data: Any,
    settings: TimingSettings,
    *,
    protocol: str = "kernelcast",
    flusher: L2Flusher | None = None,
    launch_cover: LaunchCover | None = None,
) -> Timing:
    """Time `fn(data)` with CUDA events per call, under `protocol` (see the module docstring).

    Raises:
        TimingTampered: the wall clock contradicts the events.
    """
    return drive(fn, cuda_steps(plain_feed(data), settings, protocol=protocol, flusher=flusher, launch_cover=launch_cover))
