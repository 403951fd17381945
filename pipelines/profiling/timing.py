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
below are generators that yield the input of each call and receive its output. No name in the
frames of a call leads to those generators, and so to the timer's state (clock readings, CUDA
events, recorded times) or the feed: `drive` holds them only in its loop (see `drive`). A `Feed`
gives each call its input values (values no earlier call of the case had: fresh_values.py,
written into the same buffers outside the timed window) and keeps, by a draw from the operating
system's CSPRNG made AFTER each call, a sample of the outputs for the verifier, with what it
needs to rebuild their inputs (runner.Measurer ships them).

Only the standard library, numpy and torch are used (the worker runs on bare hosts).
"""

from __future__ import annotations

import contextlib
import gc
import math
import secrets
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pipelines.profiling.fresh_values import (
    DRAW_BITS,
    draw_transform,
    tensors,
    transform_plan,
    write_leaves,
)
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


# Wall-clock cross-checks (seconds / factors): a synchronised call may take longer than its
# events by the host's enqueue and the synchronisation, never by more than this.
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


# A call at least this long (its first warm-up call's wall time) is a slow call: one warm-up call
# (its checks already ran it on this case), and every timed call synchronised on its own and held
# to the wall clock as the probe's calls are, so no probe calls follow. At 5 ms the host's few
# microseconds between synchronised calls are under 1% of the GPU's time; trimul's generated
# kernels (37 ms a call on average) made 2 warm-up and 2 probe calls a case beside 3-9 timed ones.
SLOW_CALL_S = 5e-3
FIRST_CHUNK = 16  # timed calls in the first chunk of a case (at least min_reps)
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


def host_ms_of(enqueue_s: list[float], synced_wall_s: list[float]) -> float:
    """The host's time per call (ms): the median time the host took to issue a timed call while
    the launch cover kept the GPU busy ahead of it, or, where less, the median wall time of a call
    synchronised on its own from an idle GPU (a callable that waits for the GPU inside the call
    waits for the cover too when it is issued; alone, it waits for its own work only).

    The events of a kernelcast call cover device time alone; a program that calls the kernel
    back to back is held to the slower of the two, so a Python wrapper that takes 0.47 ms to
    launch 0.05 ms of GPU work runs at one call per 0.47 ms (audit.program_ms).

    >>> host_ms_of([20e-6, 30e-6, 40e-6], [90e-6, 95e-6])
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
# an input whose only tensors cannot be rolled or scaled (a single row of integers) has few.
FRESH_TRIES = 64


@dataclass(frozen=True)
class KeptOutput:
    """An output of a call kept for the verifier, with what rebuilds the call's input: the salt of
    its base values and the draw of its transform (fresh_values.py; None: the base values as they are)."""

    salt: int
    draw: int | None
    output: Any


class Feed:
    """The inputs of one case's calls and the outputs kept for the verifier.

    Args:
        data: the buffers every call runs on (the same objects each call).
        variant: salt -> the case's base values for that salt (read, never handed to the kernel).
        salts: the salts the calls take their base values from, in turn (in a random order). Before
            each call a transform is drawn from the OS CSPRNG, one no earlier call of the feed had,
            and the base values under it are written into `data`, outside any timed window
            (fresh_values.py): every call runs on values of its own, so an answer kept from an
            earlier call (by address, shape, some values or all of them) is never right again. An
            empty tuple keeps the values as they are.
        keep: how many outputs to keep: a uniform sample of all calls made through the feed,
            drawn after each call (reservoir sampling with the OS CSPRNG, which no kernel can
            seed or predict); each kept output is cloned then (so a buffer the kernel reuses
            cannot change it later). Where `keep` is at least the number of salts, the sample
            covers every salt: keep // len(salts) outputs of each salt's calls (a reservoir per
            salt). With one sample for two variants, a kernel right on one variant's values and
            just past the tolerance on the other's is `ok` or `incorrect` on the draw; covered,
            it is the same every time.
        device: "cuda" | "cpu".
    """

    def __init__(self, data: Any, variant: Callable[[int], Any] | None = None, salts: tuple[int, ...] = (),
                 keep: int = 0, device: str = "cpu"):
        self.data, self.variant, self.salts, self.keep, self.device = data, variant, tuple(salts), keep, device
        self.calls = 0
        self.salt = 0
        self.draw: int | None = None  # the transform of the values now in `data`
        self._rng = secrets.SystemRandom()
        # The salts in a random order, taken in turn.
        self._order = list(self.salts)
        self._rng.shuffle(self._order)
        self._filled = 0
        self._leaves = tensors(data) if variant is not None else []
        # salt -> (its base values' tensors, fresh_values.transform_plan of them)
        self._plans: dict[int, tuple[list, tuple]] = {}
        self._used: set[tuple] = set()  # (salt, transform) of every call so far
        # reservoir key -> [calls seen, [KeptOutput]]: one per salt where the sample covers the salts
        self.per_salt = keep // len(self.salts) if self.salts and variant is not None and keep >= len(self.salts) else 0
        self._reservoirs: dict[int | None, list] = {}

    @property
    def kept(self) -> list[KeptOutput]:
        """The kept outputs, the salts' in salt order."""
        return [k for key in sorted(self._reservoirs, key=lambda k: -1 if k is None else k)
                for k in self._reservoirs[key][1]]

    def take_kept(self) -> list[KeptOutput]:
        """The kept outputs, handed over: the feed keeps no reference to them."""
        kept, self._reservoirs = self.kept, {}
        return kept

    def prepare(self) -> None:
        """Read each salt's base values once for what a transform may do to them (a pass over
        them and a synchronisation), before any call: done inside the first calls, it would
        lengthen the warm-up calls the timed loop sizes its chunks by."""
        if self.variant is not None:
            for salt in self.salts:
                self._plan(salt)

    def _plan(self, salt: int) -> tuple[list, tuple]:
        """(the tensors of `salt`'s base values, their transform plan), computed once: the feed
        holds the base values for the case's calls from then on."""
        if salt not in self._plans:
            base = self.variant(salt)
            self._plans[salt] = (tensors(base), transform_plan(base))
        return self._plans[salt]

    def fill(self, salt: int | None = None) -> Any:
        """The input of the next call: new values from the next salt's base values (or `salt`'s)
        under a transform drawn now, written into the same buffers."""
        if self._order and self.variant is not None:
            if salt is None:
                salt = self._order[self._filled % len(self._order)]
                self._filled += 1
            base_leaves, plan = self._plan(salt)
            self.salt = salt
            self.draw, transform = self._fresh_draw(salt, plan)
            write_leaves(self._leaves, base_leaves, transform)
        return self.data

    def _fresh_draw(self, salt: int, plan: tuple) -> tuple[int, tuple]:
        """A draw whose transform of `salt`'s values no earlier call of the feed had, and that transform."""
        for _ in range(FRESH_TRIES):
            draw = self._rng.getrandbits(DRAW_BITS)
            transform = draw_transform(draw, plan)
            if (salt, transform) not in self._used:
                break
        self._used.add((salt, transform))
        return draw, transform

    def short_salt(self) -> int | None:
        """A salt whose share of the sample is not yet kept (None when the sample is complete):
        where a case made fewer calls than the outputs it keeps (a slow kernel makes four)."""
        if self.keep <= 0:
            return None
        if self.per_salt:
            return next((s for s in sorted(self.salts) if len(self._reservoirs.get(s, (0, []))[1]) < self.per_salt), None)
        if len(self._reservoirs.get(None, (0, []))[1]) < self.keep:
            return self._order[self._filled % len(self._order)] if self._order else self.salt
        return None

    def took(self, out: Any) -> None:
        """After a call: keep its output with probability keep / calls of its reservoir (replacing a kept one)."""
        self.calls += 1
        if self.keep <= 0:
            return
        key, keep = (self.salt, self.per_salt) if self.per_salt else (None, self.keep)
        seen, kept = self._reservoirs.setdefault(key, [0, []])
        seen += 1
        self._reservoirs[key][0] = seen
        if len(kept) < keep:
            slot = len(kept)
            kept.append(None)
        else:
            slot = self._rng.randrange(seen)
            if slot >= keep:
                return
        if self.device == "cuda":
            torch.cuda.synchronize()  # the output is complete before it is copied
        kept[slot] = KeptOutput(self.salt, self.draw, keep_output(out))


def top_up_steps(feed: Feed) -> Steps:
    """Untimed calls, through the same call site, until the feed holds every output the
    verifier's plan asks of the case (verify.timed_draws): without them an honest kernel whose
    case made fewer calls than outputs to keep (many variants, a slow kernel) would be short of
    verdicts, and so `tampered`. Each output is kept (its reservoir is short), and `Feed.took`
    synchronises before it copies one."""
    while (salt := feed.short_salt()) is not None:
        out = yield feed.fill(salt)
        feed.took(out)
        del out


def plain_feed(data: Any) -> Feed:
    """A feed that hands out `data` as it is and keeps nothing (the reference, tests)."""
    return Feed(data)


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
