"""The parent's own account of a measurement: wall-clock windows, reference timings, speedups.

The measuring child runs kernel code, so what it reports is a claim. The parent, which never
runs kernel code, checks the claim against what it saw:

* `PhaseClock`: the child announces each phase ("timing <case>", "timing reference <case>") as it
  starts; the parent stamps each announcement with the earliest and the latest time its own clock
  allows (a message read now arrived after the parent last finished reading its channels). A
  phase's timed calls cannot add up to more device time than the longest the phase can have
  lasted (`audit_claims`), so a patched timer that inflates the reference (and with it the
  speedup) is caught, and a parent busy for a moment never makes an honest phase look short.
* `ReferenceBook`: reference timings are kept here, per task and case, as the child takes them;
  a row uses the middle of the last few the parent accepted, never the child's cache.
* `timing_fields`: the row's per-case lists and speedups are computed here from the kernel's
  timings and the book: the label is over device times; beside it, under kernelcast, the speedup
  over the slower of device and host time per case (`program_ms`).

Imports only the standard library.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from statistics import geometric_mean

WALL_FACTOR = 1.05  # timed device time may reach the wall time, with clock granularity to spare
WALL_SLACK_S = 0.02
REF_KEEP = 5
TIMING_KEYS = ("median_ms", "mean_ms", "stderr_ms", "reps")


@dataclass
class PhaseClock:
    """When (parent clock, seconds: earliest, latest) each phase of the job in flight was announced."""

    marks: list[tuple[str, float, float]] = field(default_factory=list)

    def mark(self, phase: str, earliest: float | None = None, latest: float | None = None) -> None:
        now = time.monotonic()
        latest = now if latest is None else latest
        self.marks.append((phase, latest if earliest is None else min(earliest, latest), latest))

    def windows(self, phase: str, end: float) -> list[float]:
        """The longest each announcement of `phase` can have lasted: from its earliest time to
        the latest time of the next announcement (or `end`)."""
        out = []
        for i, (p, earliest, _) in enumerate(self.marks):
            if p == phase:
                nxt = self.marks[i + 1][2] if i + 1 < len(self.marks) else end
                out.append(nxt - earliest)
        return out


def _valid_timing(t: object) -> bool:
    if not isinstance(t, dict) or not all(k in t for k in TIMING_KEYS):
        return False
    try:
        med, mean, se, reps = (float(t["median_ms"]), float(t["mean_ms"]), float(t["stderr_ms"]), int(t["reps"]))
        host = None if t.get("host_ms") is None else float(t["host_ms"])
    except (TypeError, ValueError):
        return False
    if host is not None and not (math.isfinite(host) and host >= 0):
        return False
    return med > 0 and mean > 0 and math.isfinite(med) and math.isfinite(mean) and reps >= 1 and not se < 0


def claimed_s(timings: list[dict]) -> float:
    """Device seconds a list of timings says it spent in timed calls."""
    return sum(float(t["mean_ms"]) * int(t["reps"]) for t in timings) / 1e3


def audit_claims(result: dict, clock: PhaseClock, end: float) -> str | None:
    """A reason to call the timings tampered, or None: every phase's timed device time must fit
    in the wall time the parent saw for that phase."""
    for entry in result.get("kernel_timings") or []:
        if not _valid_timing(entry):
            return "malformed kernel timing in the result"
    for entry in result.get("ref_new") or []:
        if not _valid_timing(entry) or not isinstance(entry.get("case_id"), str):
            return "malformed reference timing in the result"
    by_phase: dict[str, list[dict]] = {}
    for cid, t in zip(result.get("case_ids") or [], result.get("kernel_timings") or []):
        by_phase.setdefault(f"timing {cid}", []).append(t)
    for t in result.get("ref_new") or []:
        # A reference timed in a phase of its own, or by turns with the kernel's case (gpumode):
        # then both claims must fit in that case's one phase together, a tighter bound.
        phase = f"timing reference {t['case_id']}"
        if not clock.windows(phase, end) and clock.windows(f"timing {t['case_id']}", end):
            phase = f"timing {t['case_id']}"
        by_phase.setdefault(phase, []).append(t)
    for phase, timings in by_phase.items():
        windows = clock.windows(phase, end)
        if not windows:
            return f"timings of phase {phase!r}, which was never announced"
        seen = max(windows)
        claim = claimed_s(timings)
        if claim > seen * WALL_FACTOR + WALL_SLACK_S:
            return (f"{phase}: the timed calls claim {claim * 1e3:.1f} ms of device time in {seen * 1e3:.1f} ms "
                    "of wall time")
    return None


class ReferenceBook:
    """Reference timings per (task, case id): the last REF_KEEP the parent accepted."""

    def __init__(self, keep: int = REF_KEEP):
        self.keep = keep
        self.timings: dict[tuple[str, str], list[dict]] = {}

    def add(self, task: str, timings: list[dict]) -> None:
        for t in timings:
            key = (task, t["case_id"])
            kept = {k: t[k] for k in TIMING_KEYS}
            if t.get("host_ms") is not None:
                kept["host_ms"] = t["host_ms"]
            self.timings[key] = (self.timings.get(key, []) + [kept])[-self.keep:]

    def middle(self, task: str, case_id: str) -> dict | None:
        """The kept timing with the median median_ms (the lower middle for an even count).

        >>> b = ReferenceBook()
        >>> b.add("t", [{"case_id": "c", "median_ms": m, "mean_ms": m, "stderr_ms": 0.0, "reps": 3} for m in (3.0, 1.0, 2.0)])
        >>> b.middle("t", "c")["median_ms"], b.middle("t", "x")
        (2.0, None)
        """
        kept = self.timings.get((task, case_id))
        if not kept:
            return None
        ordered = sorted(kept, key=lambda t: t["median_ms"])
        return ordered[(len(ordered) - 1) // 2]


def stat(t: dict, protocol: str) -> float:
    """The number speedups are made of: the mean (paper, gpumode) or the median (kernelcast)."""
    return float(t["mean_ms"] if protocol in ("paper", "gpumode") else t["median_ms"])


def program_ms(t: dict, protocol: str) -> float:
    """A case's time as a program whose host does not keep ahead of the GPU sees it, calling the
    callable back to back: under kernelcast the slower of the device time (`stat`) and the host's
    time per call (timing.host_ms_of), the device time alone where no host time was taken; the
    protocol's statistic otherwise (gpumode's and paper's events already cover the host's work).

    >>> program_ms({"median_ms": 0.05, "mean_ms": 0.05, "host_ms": 0.47}, "kernelcast")
    0.47
    >>> program_ms({"median_ms": 0.9, "mean_ms": 0.9, "host_ms": 0.02}, "kernelcast")
    0.9
    """
    device = stat(t, protocol)
    host = t.get("host_ms")
    return max(device, float(host)) if protocol == "kernelcast" and host is not None else device


def timing_fields(result: dict, book: ReferenceBook, task: str, protocol: str, timed: list[str],
                  recheck_above: float) -> dict | str:
    """The row's timing columns and speedups, or a reason the claim cannot stand.

    Args:
        result: the measuring child's result (case_ids, kernel_timings).
        book: reference timings the parent accepted.
        task: the task name.
        protocol: the timing protocol.
        timed: the case ids the verifier's plan times, in order.
        recheck_above: speedups above this are flagged for a re-measure.
    """
    case_ids, kt = list(result.get("case_ids") or []), list(result.get("kernel_timings") or [])
    if case_ids != list(timed) or len(kt) != len(case_ids):
        return f"timed cases {case_ids} are not the task's {list(timed)}"
    refs = [book.middle(task, cid) for cid in case_ids]
    if any(r is None for r in refs):
        missing = next(c for c, r in zip(case_ids, refs) if r is None)
        return f"no reference timing of case {missing} was taken in view of the parent"
    speedups = [stat(r, protocol) / stat(k, protocol) for r, k in zip(refs, kt)]
    program = [program_ms(r, protocol) / program_ms(k, protocol) for r, k in zip(refs, kt)]
    if not all(s > 0 and math.isfinite(s) for s in speedups + program):
        return f"non-positive or non-finite speedups {speedups}"
    speedup = geometric_mean(speedups)
    hosts = [t.get("host_ms") for t in kt]
    return {
        "case_ids": case_ids,
        "kernel_median_ms": [float(t["median_ms"]) for t in kt],
        "kernel_mean_ms": [float(t["mean_ms"]) for t in kt],
        "kernel_stderr_ms": [float(t["stderr_ms"]) for t in kt],
        "kernel_reps": [int(t["reps"]) for t in kt],
        "ref_median_ms": [float(r["median_ms"]) for r in refs],
        "ref_mean_ms": [float(r["mean_ms"]) for r in refs],
        "ref_stderr_ms": [float(r["stderr_ms"]) for r in refs],
        "ref_reps": [int(r["reps"]) for r in refs],
        "case_speedups": speedups,
        "speedup": speedup,
        "needs_recheck": speedup > recheck_above,
        "kernel_host_ms": None if all(h is None for h in hosts) else [None if h is None else float(h) for h in hosts],
        "ref_host_ms": (None if all(r.get("host_ms") is None for r in refs)
                        else [None if r.get("host_ms") is None else float(r["host_ms"]) for r in refs]),
        "program_speedup": geometric_mean(program),
        "launch_bound": any(h is not None and float(h) > stat(k, protocol) for h, k in zip(hosts, kt)),
    }
