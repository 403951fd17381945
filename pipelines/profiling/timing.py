"""Timing one callable on one input: CUDA events on a GPU, perf_counter on the CPU.

Three protocols (the `protocol` column of a result; docs/protocols.md compares them):

kernelcast (default)
    Before EVERY timed call the L2 is flushed by writing a buffer of at least twice its size
    (so no call finds its inputs in cache from the previous one); then a GPU-side spin
    (`torch.cuda._sleep`, `LaunchCover`) keeps the device busy while the host enqueues the
    call, so the events bracket device work only, not the host's launch latency. Without the
    cover, launch-bound callables (a PyTorch reference of four small ops on a 256x4096
    input) were timed 2.6x slower in one H200 run than in the next, because compile
    workers were loading the CPU at the moment (harness 1, 2026-11-29). Each call is
    bracketed by its own pair of CUDA events; inputs are generated once per case and reused. Reps run in
    chunks until the relative standard error of the mean is under `rse_target` (0.5%), with a
    minimum number of reps and caps on reps and on wall time per case. The statistic used for
    speedups is the MEDIAN of the per-call times.
paper
    As the paper's harness: no L2 flush, no launch cover, the input is cloned INSIDE the
    timed window (the clone's cost is part of every call), and the statistic is the MEAN of
    reps. Same adaptive stopping.
gpumode
    GPU MODE's benchmark loop (reference-kernels, problems/bioml/trimul/eval.py): per call,
    synchronize, a pair of CUDA events around the whole call (host overhead included), no L2
    flush, no launch cover, the same input object every call; at most 100 calls, stopping after
    the third once the standard error of the mean is under 0.1% of it, or mean * calls passes
    10 s, or 120 s of wall time have gone by. Once per kernel, a warm-up run of the same loop on
    the first case with a 0.1 s budget; before each case, one untimed call (GPU MODE's obligatory
    correctness call). The statistic is the MEAN.

Every protocol checks its CUDA-event times against the wall clock (`TimingTampered`): events
cannot add up to more than the time that passed, and a call whose synchronised wall time is far
above its event time ran work the events did not see (a side stream, a patched timer).

Only the standard library, numpy and torch are used (the worker runs on bare hosts).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pipelines.profiling.results import PROTOCOLS  # noqa: F401 - re-exported; torch-free home


@dataclass(frozen=True)
class TimingSettings:
    """How hard to try per case. Defaults are for the GPU; `for_cpu()` gives CI-sized ones."""

    min_reps: int = 8  # never stop before this many timed calls (unless the time cap hits)
    max_reps: int = 1000  # hard cap on timed calls per case
    max_case_s: float = 0.3  # wall-clock cap per case for the timed loop, seconds
    rse_target: float = 0.005  # stop once stderr(mean)/mean is below this (0.5%)
    warmup_ms: float = 10.0  # untimed calls until this much GPU time has passed (and >= 2 calls)

    @staticmethod
    def for_cpu(max_reps: int = 5) -> TimingSettings:
        return TimingSettings(min_reps=2, max_reps=max_reps, max_case_s=2.0, rse_target=0.05, warmup_ms=0.0)


@dataclass(frozen=True)
class Timing:
    """Per-call times of one callable on one case, in milliseconds."""

    median_ms: float
    mean_ms: float
    stderr_ms: float  # standard error of the mean, std(ddof=1) / sqrt(reps)
    reps: int

    def stat(self, protocol: str) -> float:
        """The number speedups are made of: the median (kernelcast) or the mean (paper, gpumode)."""
        return self.mean_ms if protocol in ("paper", "gpumode") else self.median_ms

    def as_dict(self) -> dict:
        return {"median_ms": self.median_ms, "mean_ms": self.mean_ms, "stderr_ms": self.stderr_ms, "reps": self.reps}


class TimingTampered(Exception):
    """CUDA-event times that the wall clock contradicts."""


class GpuShared(Exception):
    """The wall clock contradicts the events of a trusted call too: another process is using the
    GPU (its work is time-sliced with ours), so no timing here can be trusted or blamed."""


# Wall-clock cross-checks (seconds / factors): a synchronised call may take longer than its
# events by the host's enqueue and the synchronisation, never by more than this.
WALL_CHECK_CALLS = 5
WALL_SLACK_S = 200e-6
WALL_FACTOR = 2.0


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


def summarize(times_ms: list[float] | np.ndarray) -> Timing:
    """Median, mean and standard error of the mean of per-call times (ms).

    >>> t = summarize([1.0, 2.0, 3.0])
    >>> (t.median_ms, t.mean_ms, round(t.stderr_ms, 4), t.reps)
    (2.0, 2.0, 0.5774, 3)
    """
    a = np.asarray(times_ms, dtype=np.float64)
    if a.size == 0:
        raise ValueError("no timed calls")
    stderr = float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else float("inf")
    return Timing(float(np.median(a)), float(a.mean()), stderr, int(a.size))


def relative_stderr(times_ms: list[float]) -> float:
    """stderr(mean)/mean; inf for fewer than two samples or a non-positive mean."""
    if len(times_ms) < 2:
        return math.inf
    t = summarize(times_ms)
    return t.stderr_ms / t.mean_ms if t.mean_ms > 0 else math.inf


def geomean(values: list[float]) -> float:
    """Geometric mean of positive numbers (the speedup over cases).

    >>> round(geomean([2.0, 8.0]), 6)
    4.0
    """
    if not values or any(not (v > 0 and math.isfinite(v)) for v in values):
        raise ValueError(f"geomean needs positive finite values, got {values}")
    return float(math.exp(sum(math.log(v) for v in values) / len(values)))


def clone_data(data: Any) -> Any:
    """A deep copy of a task input: tensors cloned (same device, dtype, strides), containers rebuilt."""
    if isinstance(data, torch.Tensor):
        return data.clone()
    if isinstance(data, tuple):
        items = [clone_data(x) for x in data]
        return type(data)(*items) if hasattr(data, "_fields") else tuple(items)  # namedtuples too
    if isinstance(data, list):
        return [clone_data(x) for x in data]
    if isinstance(data, dict):
        return {k: clone_data(v) for k, v in data.items()}
    return data


def data_nbytes(data: Any) -> int:
    """Total bytes of the tensors inside a task input."""
    if isinstance(data, torch.Tensor):
        return data.numel() * data.element_size()
    if isinstance(data, (tuple, list)):
        return sum(data_nbytes(x) for x in data)
    if isinstance(data, dict):
        return sum(data_nbytes(v) for v in data.values())
    return 0


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


def _should_stop(times: list[float], elapsed_s: float, s: TimingSettings) -> bool:
    n = len(times)
    if n >= s.max_reps:
        return True
    if elapsed_s >= s.max_case_s and n >= 3:
        return True  # time cap beats min_reps, so one slow kernel cannot stall the batch
    return n >= s.min_reps and relative_stderr(times) < s.rse_target


def _wall_probe(fn: Callable[[Any], Any], data: Any, n: int) -> tuple[list[float], list[float]]:
    """(event ms, synchronised wall s) of `n` calls, each on its own, with no cover or flush."""
    events, walls = [], []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        fn(data)
        end.record()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
        events.append(start.elapsed_time(end))
    return events, walls


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
    if protocol == "gpumode":
        return time_gpumode(fn, data, device="cuda", max_repeats=min(settings.max_reps, GPUMODE_MAX_REPEATS))
    flush = flusher.flush if (protocol == "kernelcast" and flusher is not None) else None
    cover = launch_cover if protocol == "kernelcast" else None
    clone_inside = protocol == "paper"

    def one_call() -> None:
        fn(clone_data(data) if clone_inside else data)

    # Warm-up: JIT compilation, autotuning, allocator growth, clocks ramping up. Untimed.
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n_warm = 0
    enqueue_s: list[float] = []  # host time to enqueue one call (the GPU may still be running it)
    while n_warm < 3 or ((time.perf_counter() - t0) * 1e3 < settings.warmup_ms and n_warm < 100):
        if flush:
            flush()
        t_call = time.perf_counter()
        one_call()
        enqueue_s.append(time.perf_counter() - t_call)
        torch.cuda.synchronize()
        n_warm += 1
    per_call_s = max((time.perf_counter() - t0) / n_warm, 1e-6)
    spin_s = cover_seconds(enqueue_s) if cover else 0.0

    times: list[float] = []
    start = time.perf_counter()
    while True:
        # Chunks of ~50 ms keep the host ahead of the GPU while stop checks stay frequent.
        chunk = int(min(max(1, 0.05 / per_call_s), settings.max_reps - len(times), 100))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(chunk)]
        t_chunk = time.perf_counter()
        for ev_start, ev_end in events:
            if flush:
                flush()
            if cover:
                cover.cover(spin_s)
            ev_start.record()
            one_call()
            ev_end.record()
        torch.cuda.synchronize()  # device-wide: work the kernel left on other streams is done too
        chunk_ms = [ev_start.elapsed_time(ev_end) for ev_start, ev_end in events]
        check_chunk_wall(chunk_ms, time.perf_counter() - t_chunk)
        times.extend(chunk_ms)  # ms
        if _should_stop(times, time.perf_counter() - start, settings):
            break
    timing = summarize(times)
    probe_events, probe_walls = _wall_probe(one_call_fn(fn, clone_inside), data, WALL_CHECK_CALLS)
    check_kernel_wall(float(np.median(probe_events)), float(np.median(probe_walls)), float(np.median(enqueue_s[1:] or enqueue_s)))
    return timing


def one_call_fn(fn: Callable[[Any], Any], clone_inside: bool) -> Callable[[Any], Any]:
    """`fn`, or `fn` on a fresh clone of its input (the paper protocol clones inside the window)."""
    return (lambda d: fn(clone_data(d))) if clone_inside else fn


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


def time_gpumode(fn: Callable[[Any], Any], data: Any, *, device: str, max_repeats: int = GPUMODE_MAX_REPEATS,
                 max_time_ns: float = GPUMODE_MAX_TIME_NS) -> Timing:
    """GPU MODE's timed loop (module docstring) on `data`, reused by every call.

    On a GPU each call is synchronised before and after and bracketed by CUDA events; on the
    CPU by perf_counter. Raises TimingTampered when the wall clock contradicts the events.
    """
    durations_ms: list[float] = []
    walls: list[float] = []
    start_ns = time.perf_counter_ns()
    for _ in range(max(1, max_repeats)):
        if device == "cuda":
            torch.cuda.synchronize()
            ev_start, ev_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            ev_start.record()
            out = fn(data)
            ev_end.record()
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
            durations_ms.append(ev_start.elapsed_time(ev_end))
        else:
            t0 = time.perf_counter()
            out = fn(data)
            durations_ms.append((time.perf_counter() - t0) * 1e3)
        del out
        if gpumode_should_stop([d * 1e6 for d in durations_ms], time.perf_counter_ns() - start_ns, max_time_ns):
            break
    if device == "cuda":
        check_kernel_wall(float(np.median(durations_ms)), float(np.median(walls)))
    return summarize(durations_ms)


def gpumode_warmup(fn: Callable[[Any], Any], data: Any, device: str) -> None:
    """GPU MODE's warm-up: the benchmark loop on the first case with a 0.1 s budget, untimed."""
    time_gpumode(fn, data, device=device, max_time_ns=GPUMODE_WARMUP_NS)


def time_cpu(
    fn: Callable[[Any], Any], data: Any, settings: TimingSettings, *, protocol: str = "kernelcast"
) -> Timing:
    """Time `fn(data)` with perf_counter (CPU mode, Triton interpreter): few reps, for CI."""
    if protocol == "gpumode":
        return time_gpumode(fn, data, device="cpu", max_repeats=settings.max_reps)
    clone_inside = protocol == "paper"
    fn(clone_data(data) if clone_inside else data)  # one warm-up call
    times: list[float] = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn(clone_data(data) if clone_inside else data)
        times.append((time.perf_counter() - t0) * 1e3)  # ms
        if _should_stop(times, time.perf_counter() - start, settings):
            break
    return summarize(times)
