"""Timing one callable on one input: CUDA events on a GPU, perf_counter on the CPU.

Three protocols (the `protocol` column of a result; docs/protocols.md compares them):

kernelcast (default)
    Before EVERY timed call the L2 is flushed by writing a buffer of at least twice its size
    (so no call finds its inputs in cache from the previous one); then a GPU-side spin
    (`torch.cuda._sleep`, `LaunchCover`) keeps the device busy while the host enqueues the
    call, so the events bracket device work only, not the host's launch latency. Without the
    cover, a launch-bound callable (a PyTorch reference of a few small ops) is timed as slow as
    the host is busy: compile workers loading the CPU made one more than twice as slow in one
    run as in the next. Each call is
    bracketed by its own pair of CUDA events; each call runs on new values in the same buffers
    (Feed). Reps run in chunks until the 95% confidence interval of the MEDIAN is within
    `rse_target` (1%) of it (order statistics, `median_ci_relative`), with a minimum number of
    reps and caps on reps and on wall time per case. A call of 5 ms or more (SLOW_CALL_S) gets
    one warm-up call and is timed one synchronised call at a time. The statistic used for
    speedups is the MEDIAN of the per-call times.
paper
    As the paper's harness: no L2 flush, no launch cover, the input is cloned INSIDE the
    timed window (the clone's cost is part of every call), and the statistic is the MEAN of
    reps. Reps stop once the relative standard error of the mean is under `rse_target`.
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

Every call of a kernel, whether checked, warm-up or timed, is made by `drive` from the same
place, so a kernel that walks its stack sees the same frames whatever the call is for; the loops
are generators that yield the input of each call and receive its output. No name in the
frames of a call leads to those generators, and so to the timer's state (clock readings, CUDA
events, recorded times) or the feed: `drive` holds them only in its loop (see `drive`). A `Feed`
gives each call its input values (values no earlier call of the case had: fresh_values.py,
written into the same buffers outside the timed window) and keeps, by a draw from the operating
system's CSPRNG made AFTER each call, a sample of the outputs for the verifier, with what it
needs to rebuild their inputs (runner.Measurer ships them).

This module holds what every loop shares: the settings, the `Timing` record and its errors, the
statistics and stopping rule, copies of inputs and outputs, and `drive`. The loops and their checks
live beside it, one module each, so each reads on its own: cuda_timing (kernelcast and paper on a
GPU), gpumode_timing (GPU MODE's loop and loops by turns), cpu_timing (the CPU loop), clock_checks
(times held to a second clock) and call_feed (each call's input values and the outputs kept). All of
them are harness code the integrity watch covers (integrity.HARNESS_MODULES).

Only the standard library, numpy and torch are used (the worker runs on bare hosts).
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pipelines.profiling.results import PROTOCOLS  # noqa: F401 - re-exported; torch-free home


@dataclass(frozen=True)
class TimingSettings:
    """How hard to try per case. Defaults are for the GPU; `for_cpu()` gives CI-sized ones."""

    # Never stop before this many timed calls (unless the time cap hits). Fast kernels make at
    # least a first chunk of FIRST_CHUNK calls anyway; this bounds slow ones (a 37 ms trimul
    # call), whose interval is tight after three.
    min_reps: int = 3
    max_reps: int = 1000  # hard cap on timed calls per case
    max_case_s: float = 0.3  # wall-clock cap per case for the timed loop, seconds
    # Stop once the median's 95% interval is within this fraction of it (kernelcast; the mean's
    # standard error for paper), or within `floor_ms` in absolute terms: CUDA events resolve
    # about half a microsecond, so 1% of a 15 us kernel is a width few reps reach. Tighter
    # targets cost calls without moving labels: a run at 0.5% and one at 1% put kernels in the
    # same bins as two runs of one setting do (docs/results/harness.md).
    rse_target: float = 0.01
    floor_ms: float = 0.0005
    # Untimed calls until this much wall time has passed (at least 2 calls: the enqueue time of
    # the second sizes the launch cover). The kernel was already run by its checks, in a child
    # that keeps the GPU busy, so this only settles caches.
    warmup_ms: float = 2.0

    @staticmethod
    def for_cpu(max_reps: int = 5) -> TimingSettings:
        return TimingSettings(min_reps=2, max_reps=max_reps, max_case_s=2.0, rse_target=0.05, floor_ms=0.0, warmup_ms=0.0)


@dataclass(frozen=True)
class Timing:
    """Per-call times of one callable on one case, in milliseconds."""

    median_ms: float
    mean_ms: float
    stderr_ms: float  # standard error of the mean, std(ddof=1) / sqrt(reps)
    reps: int
    # The host's time per call (kernelcast on a GPU; None elsewhere): see host_ms_of.
    host_ms: float | None = None

    def stat(self, protocol: str) -> float:
        """The number speedups are made of: the median (kernelcast) or the mean (paper, gpumode)."""
        return self.mean_ms if protocol in ("paper", "gpumode") else self.median_ms

    def as_dict(self) -> dict:
        d = {"median_ms": self.median_ms, "mean_ms": self.mean_ms, "stderr_ms": self.stderr_ms, "reps": self.reps}
        if self.host_ms is not None:
            d["host_ms"] = self.host_ms
        return d


class TimingTampered(Exception):
    """CUDA-event times that the wall clock contradicts."""


class GpuShared(Exception):
    """The wall clock contradicts the events of a trusted call too: another process is using the
    GPU (its work is time-sliced with ours), so no timing here can be trusted or blamed."""


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


def host_ms_of(enqueue_s: list[float], synced_wall_s: list[float]) -> float:
    """The host's time per call (ms): the median time the host took to issue a timed call while
    the launch cover kept the GPU busy ahead of it, or, where less, the median wall time of a call
    synchronised on its own from an idle GPU (a callable that waits for the GPU inside the call
    waits for the cover too when it is issued; alone, it waits for its own work only).

    The events of a kernelcast call cover device time alone; a program whose host does not keep
    ahead of the GPU is held to the slower of the two, so a Python wrapper that takes 0.47 ms to
    launch 0.05 ms of GPU work runs at one call per 0.47 ms there (audit.program_ms). Measured in
    the worker, beside compile children that load the host, it is an upper bound.

    >>> round(host_ms_of([20e-6, 30e-6, 40e-6], [90e-6, 95e-6]), 6)
    0.03
    >>> round(host_ms_of([3e-3, 3e-3], [1e-3]), 6)
    1.0
    """
    return float(min(np.median(enqueue_s), np.median(synced_wall_s)) * 1e3)


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


def clone_data(data: Any, detach: bool = False) -> Any:
    """A deep copy of a task input: tensors cloned (same device, dtype, strides), containers rebuilt;
    `detach`: the copies carry no autograd history."""
    if isinstance(data, torch.Tensor):
        return (data.detach() if detach else data).clone()
    if isinstance(data, tuple):
        items = [clone_data(x, detach) for x in data]
        return type(data)(*items) if hasattr(data, "_fields") else tuple(items)  # namedtuples too
    if isinstance(data, list):
        return [clone_data(x, detach) for x in data]
    if isinstance(data, dict):
        return {k: clone_data(v, detach) for k, v in data.items()}
    return data


def keep_output(out: Any) -> Any:
    """A copy of a kernel's output kept for the verifier: its values, not how they were computed.

    A kernel that builds an nn.Module from the weights (GPU MODE's TriMul template does) returns
    outputs whose autograd graph holds every intermediate of the call; a plain clone kept that
    graph alive as long as the copy, and the measuring child of an 80 GB card ran out of memory
    on such submissions (docs/results/harness.md).
    """
    return clone_data(out, detach=True)


def data_nbytes(data: Any) -> int:
    """Total bytes of the tensors inside a task input."""
    if isinstance(data, torch.Tensor):
        return data.numel() * data.element_size()
    if isinstance(data, (tuple, list)):
        return sum(data_nbytes(x) for x in data)
    if isinstance(data, dict):
        return sum(data_nbytes(v) for v in data.values())
    return 0


def median_ci_relative(times_ms: list[float], z: float = 1.96) -> float:
    """Half the width of the distribution-free 95% confidence interval of the median (order
    statistics), over the median; inf for fewer than three samples.

    >>> median_ci_relative([1.0] * 30 + [50.0]), median_ci_relative([1.0, 2.0])
    (0.0, inf)
    """
    n = len(times_ms)
    if n < 3:
        return math.inf
    a = np.sort(np.asarray(times_ms, dtype=np.float64))
    half = z * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half) - 1)
    hi = min(n - 1, math.ceil(1 + n / 2 + half) - 1)
    med = float(np.median(a))
    return float(a[hi] - a[lo]) / 2 / med if med > 0 else math.inf


def _should_stop(times: list[float], elapsed_s: float, s: TimingSettings, median: bool = False) -> bool:
    """Whether a timed loop has enough calls. With `median` (the protocol's statistic is the
    median) it stops once the median's confidence interval is tight (median_ci_relative below
    rse_target, or its half-width below floor_ms), so a few outliers, which keep the mean's error
    high, do not hold it to the caps."""
    n = len(times)
    if n >= s.max_reps:
        return True
    if elapsed_s >= s.max_case_s and n >= 3:
        return True  # time cap beats min_reps, so one slow kernel cannot stall the batch
    if n < s.min_reps:
        return False
    if not median:
        return relative_stderr(times) < s.rse_target
    rel = median_ci_relative(times)
    return rel < s.rse_target or rel * float(np.median(times)) < s.floor_ms


Steps = Generator[Any, Any, Any]  # yields a call's input, receives its output, returns a result


class CallTurn:
    """What the call site and the loop it serves pass each other: the reply of the last call, or
    the exception it raised, and at the end the loop's result. Nothing else: a kernel that finds
    this object in the call site's frame learns nothing about the call it is in."""

    __slots__ = ("reply", "error", "result")

    def __init__(self) -> None:
        self.reply: Any = None
        self.error: Exception | None = None
        self.result: Any = None


class _Calls:
    """The inputs `steps` yields, as an iterator that hands each call's reply (or exception) in
    `turn` back to them; when they return, their result goes into `turn.result`."""

    __slots__ = ("_steps", "_turn", "_started")

    def __init__(self, steps: Steps, turn: CallTurn) -> None:
        self._steps, self._turn, self._started = steps, turn, False

    def __iter__(self) -> _Calls:
        return self

    def __next__(self) -> Any:
        turn, steps = self._turn, self._steps
        if steps is None:
            raise StopIteration
        try:
            if not self._started:
                self._started = True
                return next(steps)
            if turn.error is not None:
                error, turn.error = turn.error, None
                return steps.throw(error)
            reply, turn.reply = turn.reply, None  # the step keeps what it needs; the output is not held here
            return steps.send(reply)
        except StopIteration as stop:
            turn.result, self._steps = stop.value, None
            raise StopIteration from None


def drive(fn: Callable[[Any], Any], steps: Steps) -> Any:
    """Run `steps`, calling `fn` on every input it yields and sending back the output; its result.

    The one place the measuring child calls a kernel from: checks, warm-up calls, timed calls
    and re-checks all come through here, so the kernel's stack is the same in each. The loop
    below holds the steps (the generators that time, check and feed the calls) on the
    interpreter's stack alone, not under a name: the call's frame has `fn`, the input, and a
    CallTurn, the same in every call, and nothing a kernel can walk from it leads to a clock
    reading, a CUDA event or the feed. A kernel that found them could forge the time of its call
    (a clock reading rewritten in a suspended frame measured 26x its honest twin) or read what the
    call is for. An exception of the kernel is thrown into `steps` at the call it came from.
    """
    turn = CallTurn()
    for data in _Calls(steps, turn):
        steps = None  # from here on only the loop holds them
        try:
            turn.reply = fn(data)
        except Exception as e:  # noqa: BLE001 - handed to the step that made the call
            turn.error = e
    return turn.result


# Tries at a draw whose transform no earlier call of the feed had, before one is taken as it comes:


@contextlib.contextmanager
def collector_paused():
    """Python's cycle collector off while a case is timed.

    The measuring child's heap beyond the frozen baseline (the kernel's module, Triton's compiled
    objects, the harness's caches) makes a full collection take milliseconds; one that falls in a
    timed call lengthens it by that much, and under gpumode, whose statistic is the mean of at most
    100 calls, one such call moves a case's mean while its median stays (docs/results/harness.md).
    GPU MODE's own process has a far smaller heap. Cycles made while timing are collected after the case.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
