"""What a sandboxed child does with one kernel: compile it, check it, time it.

Runs INSIDE the child processes of `child.py`; the parent never imports the kernels. Each
runner takes a job {"job_id", "kernel_id", "task", "path"} (path: the kernel's source file,
written by the parent) and returns a plain dict for the JSON channel.

Correctness, per case (see `check_case`): the kernel runs on its own freshly generated input,
into an allocator whose free memory was just filled with NaN bytes (so an output the kernel
forgets to write is garbage, never a left-over correct answer); what it returned is shipped to
the verifier (verify.py), which generates the same input in its own process, computes the
reference there and judges. After timing, the re-check writes a new seed's input into the very
buffers that were timed and judges again, which catches kernels that cache their result by
shape or by input address. All device work is synchronised device-wide before anything is read.

Timed calls are verified too: each call runs on values no earlier call of the case had, written
into the same buffers (call_feed.Feed, fresh_values.py), and after each call a CSPRNG draw decides
whether its output is among those the verifier judges, on the input it rebuilds from the kept
salt and draw; every call of a kernel (check, warm-up, timed, re-check) is made by timing.drive
from the same place, so its stack says nothing about what the call is for, and no name in its
frames leads to the timer or the feed.

Integrity (integrity.Watch): the identities of torch's, the clock's and the harness's functions
(the methods of its classes included) are recorded once per child, before any kernel exists in
it, and never re-based; before each kernel, after its import, after its checks, after its timing
and after it was unloaded (its finalizers run then) they must be unchanged, else the kernel is
`tampered` and the child is replaced. Timings are checked against the wall clock
(timing.TimingTampered).

This module holds the check role (`run_check`) and the measuring child's `Measurer`; beside it,
kernel_loading (loading a kernel, the integrity watch, failure kinds, the autotune watch),
checked_calls (a checked call and its verdict) and compile_child (the compile role).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from pipelines.profiling import verify
from pipelines.profiling.call_feed import Feed, plain_feed, top_up_steps
from pipelines.profiling.checked_calls import (
    _JUDGE_CLOCK,
    Held,
    check_all,
    check_case,
    check_steps,
    collect_verdicts,
    submit_held,
)
from pipelines.profiling.cpu_timing import cpu_steps
from pipelines.profiling.cuda_timing import L2Flusher, LaunchCover, cuda_steps
from pipelines.profiling.gpumode_timing import (
    ReferenceFailed,
    Turns,
    gpumode_warmup_steps,
    interleaved_steps,
)
from pipelines.profiling.inputs import (
    CACHE,
    input_cache_bytes,
    make_input,
    restore_torch_flags,
    snapshot_torch_flags,
    sync,
)
from pipelines.profiling.kernel_loading import (
    AUTOTUNE,
    KernelFailure,
    _checked_after_unload,
    _describe,
    _failed,
    _imported,
    _task_or_failure,
    check_integrity,
    check_state_before_kernel,
    classify,
    load_kernel,
    unload_kernel,
    use_kernel_cache,
)
from pipelines.profiling.results import CALL_TIMES_TAG, pairs_reference
from pipelines.profiling.sandbox_policy import one_line
from pipelines.profiling.timing import (
    GpuShared,
    Steps,
    Timing,
    TimingSettings,
    collector_paused,
    drive,
)
from pipelines.profiling.verify import RECHECK_SEED_SALT, recheck_salts, timed_cases, timed_draws

NEEDS_RECHECK_ABOVE = 10.0  # speedups above this are flagged for a re-measure
# gpumode: the kernel's and the reference's timed calls of a case go by turns of this many
# (Measurer.paired_case_steps); each turn after the first starts with one untimed call. GPU
# MODE's statistic is a mean, and a stretch of slow calls (a few to a few dozen, host or device)
# that falls on one loop moves that loop's mean alone; taken call by call, a stretch is split
# between both (tests/profiling/test_protocol_fidelity.py: a stretch of 5 to 20 calls at twice the
# time moves identical code past 2% by turns of 10, not by turns of 1). It costs one untimed call
# per timed call, under gpumode only. The runs behind it: docs/results/harness.md, "Settings and
# the runs behind them".
PAIRED_TURN_CALLS = 1
__all__ = ["Measurer", "run_check"]


def run_check(job: dict, device: str) -> dict:
    """Correctness on the task's correctness cases (the `kernelcast check` path)."""
    t0 = time.perf_counter()
    path = job["path"]
    try:
        task, fn = _imported(job)
        first = check_all(task, fn, task.correctness_cases, device)
        # The first case again, on a new seed written into the same buffers: no caching by shape or address.
        check_case(task, fn, task.correctness_cases[0], device, salt=RECHECK_SEED_SALT, into=first)
        check_integrity("after the correctness cases")
        result = {"ok": True, "status": "ok", "failure_kind": None, "error": "ok", "seconds": time.perf_counter() - t0}
    except KernelFailure as f:
        result = _failed(f, t0)
    finally:
        unload_kernel(path)
    return _checked_after_unload(result)


REF_FIRST = 3  # timings of each reference case when a task is first measured
REF_FIRST_GPUMODE = 1  # GPU MODE's loop already makes up to 100 calls a timing
REF_KEEP = 5  # reference timings kept per case; speedups use their median


class Measurer:
    """The measuring child's state: device, L2 flusher, reference timings, settings."""

    def __init__(self, config: dict):
        self.config = dict(config)
        self.device = config.get("device", "cuda")
        self.protocol = config.get("protocol", "kernelcast")
        self.ref_refresh_s = float(config.get("ref_refresh_s", 180.0))
        # Off by default: generation checks the small cases on the CPU, and on the GPU their new shapes
        # would force fresh JIT compiles inside the timing process.
        self.check_correctness_cases = bool(config.get("check_correctness_cases", False))
        # On a GPU every kernel goes through the tuning pass (_tuning_steps): an autotuner is found
        # where it runs (kernel_loading.AutotuneWatch), not by reading the source for one.
        self.tune_first = self.device == "cuda"
        self.timed_salts, self.timed_samples = timed_draws(self.device, config)
        # gpumode: each case of the reference is timed right after the kernel's, in the same job
        # (paired_reference_timing), and the row uses that timing. GPU MODE's loop times the host's
        # work with every call; with the reference timed at the start of a job, after the host and
        # GPU sat idle, and the kernel after its checks, identical code read 0.89-1.14 on short,
        # launch-bound cases (docs/protocols.md).
        self.paired_reference = pairs_reference(self.protocol)
        # Diagnostics: each gpumode case's timed calls of both loops, in order, to stderr (the
        # child's log; `worker --call-times`, read by benchmarks.call_times).
        self.call_times = bool(config.get("call_times"))
        max_reps = int(config.get("max_reps") or 0)
        if self.device == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("no CUDA device visible (use --device cpu on a CPU host)")
            from pipelines.profiling.hardware import cuda_fingerprint

            torch.cuda.set_device(0)
            self.hardware = cuda_fingerprint(0)
            self.flusher = L2Flusher(self.hardware.get("l2_cache_bytes") or 64 * 2**20)
            self.cover = LaunchCover()
            s = TimingSettings()
            overrides = {k: config[k] for k in ("min_reps", "max_case_s", "rse_target") if config.get(k) is not None}
            self.settings = TimingSettings(**{**s.__dict__, **overrides, **({"max_reps": max_reps} if max_reps else {})})
        else:
            from pipelines.profiling.hardware import cpu_fingerprint

            self.hardware = cpu_fingerprint()
            self.flusher = None
            self.cover = None
            self.settings = TimingSettings.for_cpu(max_reps or 5)
        # (task, case_id) -> the last REF_KEEP reference timings and when the newest was taken
        self.refs: dict[tuple[str, str], tuple[list[Timing], float]] = {}
        self.flags = snapshot_torch_flags()
        CACHE.max_bytes = int(config.get("input_cache_bytes") or input_cache_bytes(self.device, 0.30, 24 * 2**30))

    def cases(self, task) -> tuple:
        return timed_cases(task, self.device)

    def free_input_cache(self) -> None:
        """After the GPU ran out of memory: drop the kept inputs and keep half as many from now on.

        The cache holds 30% of the GPU; on an 80 GB card, with the verifier's caches and the
        compile children's CUDA contexts, trimul's largest case may then no longer fit. The inputs of the task being
        measured stay whatever the budget, so a smaller one costs only regenerations on task switches.
        """
        CACHE.clear()
        if self.device == "cuda":
            CACHE.max_bytes = max(CACHE.max_bytes // 2, 4 * 2**30)

    def time_steps(self, feed: Feed, turns: Turns | None = None) -> Steps:
        """The timed loop of this child's device and protocol on `feed`, as steps; returns a Timing."""
        if self.device == "cuda":
            return (yield from cuda_steps(feed, self.settings, protocol=self.protocol, flusher=self.flusher,
                                          launch_cover=self.cover, turns=turns))
        return (yield from cpu_steps(feed, self.settings, protocol=self.protocol, turns=turns))

    def time_fn(self, fn: Callable, data: Any) -> Timing:
        """Time a callable of the harness's own (the reference) on `data` as it is."""
        return drive(fn, self.time_steps(plain_feed(data)))

    def warm(self) -> None:
        """Run the timing path once on a callable of our own, before the integrity baseline is
        taken: what torch initialises lazily on first use is then part of the baseline."""
        x = torch.ones(1024, device="cuda" if self.device == "cuda" else "cpu")
        try:
            drive(lambda d: d * 2.0, self.time_steps(plain_feed(x)))
        except GpuShared:
            # First use: lazy CUDA set-up inside the timed window makes the wall clock run far past
            # the events, by hundreds of times. That is what this call is
            # for; the wall-clock check holds from the kernels' calls on.
            pass
        sync(self.device)

    def reference_timings(self, task, progress: Callable[[str], None], fresh: dict | None = None) -> list[dict]:
        """Time the reference where the newest timing of a case is missing or stale; the new
        timings, each with its case id (the parent keeps the book the rows use: audit.py).

        A task's first use times each case REF_FIRST times (REF_FIRST_GPUMODE under gpumode);
        after that one more timing is added whenever the newest is older than ref_refresh_s.
        `fresh` (the parent's view, from its book and the reference cache: case id -> "fresh" |
        "stale") overrides this child's own record: a fresh case is not timed, a stale one once.
        """
        now = time.monotonic()
        cases = self.cases(task)
        keys = [(task.name, task.case_id(c)) for c in cases]
        fresh = fresh if isinstance(fresh, dict) else {}

        def wanted(key) -> int:
            said = fresh.get(key[1])
            if said == "fresh":
                return 0
            if said == "stale":
                return 1
            if key not in self.refs:
                return REF_FIRST_GPUMODE if self.protocol == "gpumode" else REF_FIRST
            return 1 if now - self.refs[key][1] > self.ref_refresh_s else 0

        counts = [wanted(k) for k in keys]
        new: list[dict] = []
        if not any(counts):
            return new
        restore_torch_flags(self.flags)
        warmed = False
        before = {k: self.refs[k] for k in keys if k in self.refs}
        for key, case, n in zip(keys, cases, counts):
            if not n:
                continue
            progress(f"timing reference {key[1]}")
            kept = list(self.refs.get(key, ([], 0.0))[0])
            try:
                data = make_input(task, case)
                for _ in range(n):
                    # The kernel's own feed and loop (timed_feed, timed_case_steps): the same value
                    # copies before each call, the same output samples after it, the same warm-up.
                    feed = self.timed_feed(task, case, data)
                    with collector_paused():
                        t = drive(task.ref_kernel, self.timed_case_steps(feed, first=not warmed))
                    warmed = True
                    kept.append(t)
                    new.append({"case_id": key[1], **t.as_dict()})
                    del feed
                del data
            except Exception as e:
                # The job fails, so the parent never sees this call's timings: forget them here
                # too, or the next job would skip cases the parent's book does not hold and its
                # row would read as a forged reference (`tampered`) on a good kernel.
                for k in keys:
                    if k in before:
                        self.refs[k] = before[k]
                    else:
                        self.refs.pop(k, None)
                failure = classify(e, self.device, f"reference on case {key[1]}")
                raise KernelFailure("infrastructure", failure.message, restart=failure.restart,
                                    out_of_memory=failure.out_of_memory) from e
            self.refs[key] = (kept[-REF_KEEP:], time.monotonic())
        return new

    def measure(self, job: dict, progress: Callable[[str], None]) -> dict:
        """Check and time one kernel: the per-kernel part of a row, as claims the parent audits
        (case_ids, kernel_timings, ref_new; the parent computes the speedups), with the seconds
        each phase took (`phases`)."""
        path = job["path"]
        phases = {"state_check_s": 0.0, "reference_s": 0.0, "import_s": 0.0, "check_s": 0.0, "inputs_s": 0.0, "timing_s": 0.0,
                  "timed_verify_s": 0.0, "recheck_s": 0.0, "verifier_s": 0.0, "unload_s": 0.0}
        result: dict = {"check_s": None, "time_s": None, "ref_new": [], "phases": phases}
        t0 = time.perf_counter()
        AUTOTUNE.begin(progress)
        try:
            t = time.perf_counter()
            check_state_before_kernel()
            phases["state_check_s"] = time.perf_counter() - t
            task = _task_or_failure(job["task"])
            cases = self.cases(task)
            use_kernel_cache(job, "KERNELCAST_TRITON_SHARED")  # triton_cache.SHARED_ENV (Triton-free here)
            t = time.perf_counter()
            if not self.paired_reference:
                result["ref_new"] = self.reference_timings(task, progress, job.get("ref_fresh"))
            phases["reference_s"] = time.perf_counter() - t
            progress("importing kernel")
            t = time.perf_counter()
            fn = load_kernel(path, task)
            check_integrity("on import")
            phases["import_s"] = time.perf_counter() - t
            t0 = time.perf_counter()
            # The one call site of the kernel: checks, timed calls and re-checks are steps of one
            # generator that timing.drive runs (see _steps).
            timings = drive(fn, self._steps(task, cases, progress, result))
            result.update(status="ok", failure_kind=None, error=None, case_ids=[task.case_id(c) for c in cases],
                          kernel_timings=[t.as_dict() for t in timings])
        except KernelFailure as f:
            result.update(status="failed", failure_kind=f.kind, error=f.message, restart=f.restart)
            if f.out_of_memory:
                self.free_input_cache()
                if job.get("after_out_of_memory"):
                    result["error"] = f"{f.message} (again, with this process's input cache emptied)"
                else:  # the parent measures it once more (worker_loop.OOM_RETRY_KEY)
                    result["out_of_memory"] = True
            if result["check_s"] is None:
                result["check_s"] = time.perf_counter() - t0
        except torch.cuda.OutOfMemoryError as e:
            # The harness's own allocations (a case's input, its timed variants) out of memory:
            # not the kernel's failure; measured once more after the cache is emptied.
            self.free_input_cache()
            result.update(status="failed", failure_kind="infrastructure", restart=False,
                          error=one_line(f"the harness ran out of GPU memory: {_describe(e)}"),
                          out_of_memory=not job.get("after_out_of_memory"))
        finally:
            t = time.perf_counter()
            AUTOTUNE.begin(None)  # the kernel's autotuners go with its module
            unload_kernel(path)
            restore_torch_flags(self.flags)
            phases["unload_s"] = time.perf_counter() - t
        return _checked_after_unload(result)

    def timed_feed(self, task, case: dict, data: Any) -> Feed:
        """The feed of one case's timed calls: before each call new values, a transform of one of
        the timed variants drawn for that call (fresh_values.py), a sample of the outputs kept after
        it (for the verifier; the reference's are dropped)."""
        if len(self.timed_salts) <= 8:  # the variants generated here (once per child), not between timed calls
            for s in self.timed_salts:
                CACHE.peek(task, case, s)
        feed = Feed(data, lambda s, case=case: CACHE.peek(task, case, s), self.timed_salts, self.timed_samples,
                    self.device)
        if len(self.timed_salts) <= 8:
            feed.prepare()
        sync(self.device)
        return feed

    def paired_case_steps(self, task, case: dict, feed: Feed, first: bool, phases: dict) -> Steps:
        """The kernel's timed calls of one case and the reference's, by turns of PAIRED_TURN_CALLS
        (gpumode; gpumode_timing.interleaved_steps), until both loops' stopping rules are met
        (gpumode_timing.Turns): the reference on its own input through the same feed and loop, with the
        torch switches of the first reference timing during its turns and the kernel's again
        during the kernel's. Returns (the kernel's Timing, the reference's as a dict)."""
        cid = task.case_id(case)
        data = make_input(task, case)
        ref_feed = self.timed_feed(task, case, data)
        switches = {"kernel": snapshot_torch_flags()}

        def turn(side: str) -> None:
            if side == "reference":
                switches["kernel"] = snapshot_torch_flags()
                restore_torch_flags(self.flags)
            else:
                restore_torch_flags(switches["kernel"])

        seconds: dict[str, float] = {}
        try:
            turns = Turns(PAIRED_TURN_CALLS, log=[] if self.call_times else None)
            kernel_t, ref_t = yield from interleaved_steps(
                self.timed_case_steps(feed, first, turns), self.timed_case_steps(ref_feed, first, turns),
                task.ref_kernel, turn, seconds)
            if turns.log is not None:
                print(CALL_TIMES_TAG + json.dumps({"task": task.name, "case_id": cid, "loops": ["kernel", "reference"],
                                                   "calls": turns.log}), file=sys.stderr, flush=True)
        except ReferenceFailed as e:
            failure = classify(e.__cause__ or e, self.device, f"reference on case {cid}")
            raise KernelFailure("infrastructure", failure.message, restart=failure.restart,
                                out_of_memory=failure.out_of_memory) from e
        finally:
            turn("kernel")
            phases["timing_s"] += seconds.get("kernel", 0.0)
            phases["reference_s"] += seconds.get("reference", 0.0)
        return kernel_t, {"case_id": cid, **ref_t.as_dict()}

    def timed_case_steps(self, feed: Feed, first: bool, turns: Turns | None = None) -> Steps:
        """One case's timed calls as steps, for the kernel and the reference alike: under gpumode
        the warm-up run (`first`: the first case of a measurement) and the obligatory untimed call
        first. Identical code measured differently when the reference skipped what the kernel got
        (GPU MODE's template TriMul, 0.86-0.88 under gpumode): its calls ran on one input left in
        place, the kernel's on values copied in before each call, with output samples cloned after
        it (allocations the reference's loop never made), so both now go through here."""
        if self.protocol == "gpumode":
            if first:
                yield from gpumode_warmup_steps(feed, self.device)
            out = yield feed.fill()  # GPU MODE's obligatory call before the timed loop of a case
            feed.took(out)
            del out
            sync(self.device)
        return (yield from self.time_steps(feed, turns))

    def _steps(self, task, cases: tuple, progress: Callable[[str], None], result: dict) -> Steps:
        """Every call of one kernel's measurement as steps; returns the cases' Timings.

        What the steps learn goes into `result` when they end (or fail), not while the kernel
        runs: `result` is in the frame that called drive, where a kernel reading its callers'
        frames would see how far its measurement has come (checks done, cases timed)."""
        mine = {"phases": dict(result["phases"]), "check_s": None, "time_s": None, "ref_new": []}
        phases = mine["phases"]
        t0 = time.perf_counter()
        extra = tuple(task.correctness_cases) if self.device == "cuda" and self.check_correctness_cases else ()
        verifier_before = _JUDGE_CLOCK.seconds
        try:
            return (yield from self._checked_and_timed(task, cases + extra, cases, progress, mine, t0))
        finally:
            if verify.pending():  # a failure left outputs with the verifier: it finishes them before anything else runs
                with contextlib.suppress(Exception):
                    verify.collect()
            phases["verifier_s"] = _JUDGE_CLOCK.seconds - verifier_before
            result["phases"].update(phases)
            result["ref_new"] += mine["ref_new"]
            result.update({k: mine[k] for k in ("check_s", "time_s", "autotune_json") if mine.get(k) is not None})

    def _checked_and_timed(self, task, checked: tuple, cases: tuple, progress: Callable[[str], None], result: dict,
                           t0: float) -> Steps:
        """The checks, then the timed cases with their re-checks; returns the cases' Timings.

        Each checked output goes to the verifier as soon as the kernel returns it, so the verifier
        judges it while the kernel runs the next case (nothing is timed then); all verdicts are in
        before the first timed call. The re-check outputs and the timed calls' kept outputs are
        held until every case is timed and then shipped together: the verifier's work never runs
        beside a timed call, and one wait serves them all.
        """
        phases = result["phases"]
        if self.tune_first:
            result["autotune_json"] = yield from self._tuning_steps(task, cases, progress)
        cids: list[str] = []
        for case in checked:
            progress(f"checking {task.case_id(case)}")
            held: list[Held] = []
            yield from check_steps(task, case, self.device, held=held)
            cids += submit_held(task, held, self.device)
        progress("verdicts of the checks")
        collect_verdicts(cids, self.device)
        check_integrity("after the correctness cases")
        result["check_s"] = phases["check_s"] = time.perf_counter() - t0

        t_all = time.perf_counter()
        timings = []
        held: list[Held] = []
        which, salt = recheck_salts(self.protocol)
        for i, case in enumerate(cases):
            cid = task.case_id(case)
            t = time.perf_counter()
            data = make_input(task, case)
            feed = self.timed_feed(task, case, data)
            phases["inputs_s"] = phases.get("inputs_s", 0.0) + time.perf_counter() - t
            t = time.perf_counter()
            try:
                progress(f"timing {cid}")
                with collector_paused():
                    if self.paired_reference:
                        kernel_t, ref_t = yield from self.paired_case_steps(task, case, feed, i == 0, phases)
                        timings.append(kernel_t)
                        result["ref_new"].append(ref_t)
                    else:
                        timings.append((yield from self.timed_case_steps(feed, first=i == 0)))
                        phases["timing_s"] += time.perf_counter() - t
                yield from top_up_steps(feed)
            except KernelFailure:
                raise
            except Exception as e:
                raise classify(e, self.device, f"timing case {cid}") from e
            if which == "all" or i == 0:
                t = time.perf_counter()
                progress(f"recheck {cid}")
                yield from check_steps(task, case, self.device, salt=salt, into=data, held=held)  # same buffers, new values
                phases["recheck_s"] += time.perf_counter() - t
            # After the re-check (the verifier's plan puts it first): wrong on new values is
            # `incorrect` there; wrong only when timed is `tampered`.
            kept = feed.take_kept()
            held += [Held(case, k.salt, k.output, f"{cid} (a timed call)", k.draw) for k in kept]
            del feed, data, kept
        t = time.perf_counter()
        progress("verifying the re-checks and timed calls")
        collect_verdicts(submit_held(task, held, self.device), self.device)
        phases["timed_verify_s"] += time.perf_counter() - t
        check_integrity("after timing")
        result["time_s"] = time.perf_counter() - t_all
        return timings


    def _tuning_steps(self, task, cases: tuple, progress: Callable[[str], None]) -> Steps:
        """One untimed call on each benchmark case's inputs, in order, before the checks: an
        autotuner benchmarks its configs there as in a plain process that runs the benchmark, on
        the real inputs with the GPU quiet (no verifier at work, no flush or spin around it; its
        own benchmarker times the configs). Tuned during the checks instead, its benchmarks shared
        the GPU with the verifier judging the previous case's outputs, and a tuner keyed on the
        row length kept the config it chose on a check's input for every case of that length.
        Every kernel goes through it: one whose autotuner is built in a function, behind a wrapper
        or in a library it imports is found when it runs (AUTOTUNE), and one without costs a call.
        Returns {case id: {kernel: config}} as JSON (the configs each autotuner ran with on that
        case, chosen there or on an earlier case of the same key), or None when none ran."""
        chosen: dict[str, dict[str, str]] = {}
        for case in cases:
            cid = task.case_id(case)
            progress(f"autotuning on {cid}")
            data = make_input(task, case)
            sync(self.device)
            AUTOTUNE.mark()
            try:
                out = yield data
            except KernelFailure:
                raise  # the autotune budget ran out
            except Exception as e:
                raise classify(e, self.device, f"autotuning on case {cid}") from e
            del out, data
            sync(self.device)
            if picks := AUTOTUNE.choices():
                chosen[cid] = picks
        return json.dumps(chosen, sort_keys=True) if chosen else None
