"""Correctness verdicts computed in a process the kernel never ran in.

The kernel's process (a check or measuring child) runs the kernel on a case, writes what it
returned into its private directory (shipping.py) and asks for a verdict; the parent forwards
the request to the verifier, a child of its own that imports no kernel: it generates the case's
input itself (same seed), runs the task's check_implementation (which computes the reference)
on the shipped output and answers. The kernel's process learns only ok / not ok; the parent
keeps the verifier's message for the row. So neither the reference nor the comparison can be
patched, looked up or returned by the kernel.

The verifier holds each job to its plan (`verification_plan`): the cases in order, then per
timed case its re-check on a new seed (where the protocol re-checks it) and the outputs of timed
calls the measuring child kept (drawn after the calls). A timed call ran on the base values of
one of the timed salts under a transform of its own (fresh_values.py); its request names both,
and the verifier rebuilds that input from its own copy of the base values and computes the
reference on it. A request out of plan, or a child that reports a correct kernel without
an ok verdict on every step, makes the kernel `tampered` (`settle`).

    kernel process   judge(task, case, salt, output) -> (ok, message)     ChannelJudge / LocalJudge
    verifier         Verifier.handle(request) -> verdict                   child role "verify"
    parent           VerifierLink.forward(...) / .on_message() / .outcome(job)
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RECHECK_SEED_SALT = 1_000_003  # kernelcast/paper: the post-timing check draws inputs from seed + this
GPUMODE_SEED_STEP = 13  # GPU MODE's leaderboard mode: each re-check adds 13 to the case seed
OUTPUT_FILE = re.compile(r"^out-\d{1,9}\.kco$")
FLAG_KEYS = {  # global switches a GPU MODE reference inherits from the submission's process
    "torch.backends.cuda.matmul.allow_tf32": bool,
    "torch.backends.cudnn.allow_tf32": bool,
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": bool,
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": bool,
    "matmul_precision": str,
}


# ---- the plan -------------------------------------------------------------------------------
def recheck_salts(protocol: str) -> tuple[str, int]:
    """Which cases are re-checked after timing, and with what seed offset: ('first' | 'all', salt)."""
    return ("all", GPUMODE_SEED_STEP) if protocol == "gpumode" else ("first", RECHECK_SEED_SALT)


TIMED_SALT_BASE = 2_000_003  # timed calls take their base values from seeds + this + 0..variants-1
TIMED = -1  # a plan step for the output of a timed call: any of the timed salts
# The base values the timed calls' transforms start from (fresh_values.py: each call's values are
# its own whatever their number). On the CPU 8, generated once per child and case (a new salt per
# call cost 2x the timing on trimul); on a GPU 2, each a benchmark input kept once per child.
CPU_TIMED_VARIANTS = 8
CUDA_TIMED_VARIANTS = 2


def timed_draws(device: str, config: dict | None = None) -> tuple[tuple[int, ...], int]:
    """(the salts timed calls take their input values from, the outputs of timed calls verified per case).

    config keys `timed_variants` and `timed_samples` (the worker's --timed-variants and
    --timed-samples) override the defaults: on the CPU 8 variants (each call of a case its own
    values) and one verified output per case; on a GPU two variants and one verified output of
    each. From as many samples as variants on, the sample covers the variants (call_feed.Feed): the
    count is rounded down to a multiple of the variants, so that the plan and the feed agree.

    >>> [timed_draws(d, c)[1] for d, c in (("cpu", {}), ("cuda", {}), ("cuda", {"timed_samples": 5}),
    ...                                     ("cuda", {"timed_samples": 1}))]
    [1, 2, 4, 1]
    """
    config = config or {}
    default = CPU_TIMED_VARIANTS if device == "cpu" else CUDA_TIMED_VARIANTS
    variants = max(1, int(config.get("timed_variants") or default))
    samples = max(1, int(config.get("timed_samples") or (1 if device == "cpu" else variants)))
    if samples >= variants:
        samples -= samples % variants
    return tuple(TIMED_SALT_BASE + i for i in range(variants)), samples


def is_draw(value: Any) -> bool:
    """Whether a request's `draw` is one a feed makes (fresh_values.DRAW_BITS bits, JSON's int).

    >>> is_draw(0), is_draw(2**63 - 1), is_draw(2**63), is_draw(True), is_draw(None), is_draw(1.0)
    (True, True, False, False, False, False)
    """
    return type(value) is int and 0 <= value < 2**63


def timed_cases(task, device: str) -> tuple:
    """The cases a measurement times: benchmark cases on a GPU, correctness cases on the CPU."""
    return tuple(task.benchmark_cases) if device == "cuda" else tuple(task.correctness_cases)


def verification_plan(task, kind: str, device: str, protocol: str = "kernelcast",
                      check_correctness_cases: bool = False, samples: int = 1) -> list[tuple[str, int]]:
    """The (case id, seed offset) steps a job must have verified, in order.

    Args:
        task: the Task.
        kind: "check" (kernelcast check: the correctness cases, then the first one again on a
            new seed) or "measure" (the worker: the timed cases, then the re-checks after timing).
        device: "cpu" | "cuda".
        protocol: the timing protocol (gpumode re-checks every case, the others the first).
        check_correctness_cases: the measuring child also checks the correctness cases on a GPU.
        samples: outputs of timed calls verified per timed case (steps (case id, TIMED)), after
            the case's re-check: a kernel wrong on new values is `incorrect` there, so a wrong
            timed output means right when checked and re-checked, wrong when timed.
    """
    if kind == "check":
        cases = tuple(task.correctness_cases)
        return [(task.case_id(c), 0) for c in cases] + [(task.case_id(cases[0]), RECHECK_SEED_SALT)]
    cases = timed_cases(task, device)
    extra = tuple(task.correctness_cases) if device == "cuda" and check_correctness_cases else ()
    steps = [(task.case_id(c), 0) for c in cases + extra]
    which, salt = recheck_salts(protocol)
    for i, c in enumerate(cases):
        if which == "all" or i == 0:
            steps.append((task.case_id(c), salt))
        steps += [(task.case_id(c), TIMED)] * samples
    return steps


# inputs.py (and torch) are imported inside the functions that use them: the worker's parent imports
# this module for VerifierLink and stays torch-free.
# ---- the kernel's side ------------------------------------------------------------------------
class LocalJudge:
    """Checks in this process: for in-process tests of the runner only (no kernel isolation)."""

    def __init__(self) -> None:
        self.pending: list[tuple[bool, str]] = []

    def judge(self, task, case: dict, salt: int, output: Any, flags: dict | None = None,
              draw: int | None = None) -> tuple[bool, str]:
        from pipelines.profiling.inputs import call_input

        ok, message = task.check_implementation(call_input(task, case, salt, draw), output)
        return bool(ok), str(message)

    def submit(self, task, case: dict, salt: int, output: Any, flags: dict | None = None,
               draw: int | None = None) -> None:
        self.pending.append(self.judge(task, case, salt, output, flags, draw))

    def collect(self) -> list[tuple[bool, str]]:
        done, self.pending = self.pending, []
        return done


class ChannelJudge:
    """Ships outputs to the parent and waits for the verifier's verdicts (child processes).

    On a GPU the output goes as CUDA IPC handles (shipping.write_handles); when the verifier
    cannot map them it asks for the file instead, and from then on this process ships files.
    KERNELCAST_SHIP=file ships files from the start.

    `judge` ships one output and waits for its verdict; `submit` ships one and returns, and
    `collect` waits for the verdicts of everything submitted: the verifier answers in order,
    so several outputs cost one wait instead of one each.
    """

    MAX_PENDING = 64  # the parent refuses more requests in flight per job

    def __init__(self, send: Callable[[dict], None], recv: Callable[[], dict], ipc: bool | None = None):
        self.send, self.recv = send, recv
        self.seq = itertools.count(1)
        self.ipc = os.environ.get("KERNELCAST_SHIP", "auto") != "file" if ipc is None else ipc
        # seq -> (request, path, output, tensors kept alive for the verifier while it maps them)
        self.pending: dict[int, tuple[dict, Path, Any, list | None]] = {}
        self._done: dict[int, bool] = {}  # verdicts read early (a full pipeline), handed out by collect

    def _write(self, path: Path, output: Any) -> list | None:
        """Write the output; the tensors to keep alive when it went as IPC handles."""
        from pipelines.profiling.shipping import NeedsFile, write_handles, write_output

        if self.ipc:
            try:
                keep = write_handles(path, output)
                if keep is not None:
                    return keep
            except NeedsFile:
                self.ipc = False
        write_output(path, output)
        return None

    def submit(self, task, case: dict, salt: int, output: Any, flags: dict | None = None,
               draw: int | None = None) -> None:
        """Ship `output` for a verdict; `collect` gets it. `draw`: the transform of a timed call's input."""
        seq = next(self.seq)
        name = f"out-{seq:06d}.kco"
        path = Path.cwd() / name  # the private directory (jail.py made it the working directory)
        try:
            keep = self._write(path, output)
            request = {"type": "verify", "seq": seq, "case_id": task.case_id(case), "salt": int(salt), "file": name,
                       "flags": flags or {}, "draw": None if draw is None else int(draw)}
            self.pending[seq] = (request, path, output, keep)
            self.send(request)
        except BaseException:
            self.pending.pop(seq, None)
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        if len(self.pending) >= self.MAX_PENDING:
            self._wait({seq: None for seq in self.pending}, keep_results=True)

    def collect(self) -> list[tuple[bool, str]]:
        """The verdicts of everything submitted since the last collect, in submission order."""
        order = sorted(self.pending)
        got: dict[int, bool | None] = {seq: None for seq in order}
        got.update(self._done)
        self._done = {}
        try:
            self._wait(got)
        finally:
            for seq in order:
                _, path, _, _ = self.pending.pop(seq, (None, None, None, None))
                if path is not None:
                    with contextlib.suppress(OSError):
                        path.unlink()
        return [(bool(got[seq]), "ok" if got[seq] else "rejected by the verifier") for seq in order]

    def _wait(self, got: dict[int, bool | None], keep_results: bool = False) -> None:
        from pipelines.profiling.shipping import write_output

        while any(got[seq] is None for seq in got if seq in self.pending):
            reply = self.recv()
            seq = reply.get("seq")
            if reply.get("type") != "verdict" or seq not in self.pending or seq not in got:
                continue
            request, path, output, keep = self.pending[seq]
            if reply.get("resend"):  # the verifier cannot map our memory: the same request, as a file
                if keep is not None:
                    self.ipc = False
                    write_output(path, output)
                    self.pending[seq] = (request, path, output, None)
                self.send(request)
                continue
            got[seq] = bool(reply.get("ok"))
            self.pending[seq] = (request, path, None, None)  # answered: nothing to keep alive
        if keep_results:
            self._done = {**self._done, **{k: v for k, v in got.items() if v is not None}}

    def judge(self, task, case: dict, salt: int, output: Any, flags: dict | None = None,
              draw: int | None = None) -> tuple[bool, str]:
        self.submit(task, case, salt, output, flags, draw)
        verdicts = self.collect()
        return next((v for v in verdicts if not v[0]), verdicts[-1])  # anything still pending counts too


class _JudgeHolder:
    """The judge this process uses (child.py installs a ChannelJudge); an object, so its
    identity stays what the integrity watch recorded."""

    def __init__(self) -> None:
        self.impl: LocalJudge | ChannelJudge = LocalJudge()


JUDGE = _JudgeHolder()


def judge(task, case: dict, salt: int, output: Any, flags: dict | None = None,
          draw: int | None = None) -> tuple[bool, str]:
    """(ok, message) for `output` on `case` (seed + `salt`, under `draw`'s transform for a timed
    call), by the installed judge."""
    return JUDGE.impl.judge(task, case, salt, output, flags, draw)


def submit(task, case: dict, salt: int, output: Any, flags: dict | None = None, draw: int | None = None) -> None:
    """Ship `output` for a verdict without waiting for it (`collect` waits)."""
    JUDGE.impl.submit(task, case, salt, output, flags, draw)


def collect() -> list[tuple[bool, str]]:
    """The verdicts of everything submitted since the last collect, in submission order."""
    return JUDGE.impl.collect()


def pending() -> bool:
    """Whether outputs were submitted and not yet collected."""
    return bool(JUDGE.impl.pending)


# ---- the verifier process ---------------------------------------------------------------------
_RESEND = object()  # Verifier._read: the output came as handles this process cannot map


@dataclass
class _Job:
    plan: list[tuple[str, int]]
    timed: list[str]
    step: int = 0
    unexpected: bool = False
    resending: bool = False  # a step was asked for again as a file: later requests are too, until it comes


def clean_flags(flags: Any) -> dict:
    """The allow-listed global switches of a request (anything else is dropped)."""
    if not isinstance(flags, dict):
        return {}
    out = {}
    for key, kind in FLAG_KEYS.items():
        value = flags.get(key)
        if isinstance(value, kind) and not (kind is str and value not in ("highest", "high", "medium")):
            out[key] = value
    return out


@contextlib.contextmanager
def global_flags(flags: dict):
    """The kernel process's TF32 / reduced-precision switches, for the reference inside."""
    import torch

    from pipelines.profiling.inputs import restore_torch_flags, snapshot_torch_flags

    saved = snapshot_torch_flags()
    try:
        for key, value in flags.items():
            if key == "matmul_precision":
                torch.set_float32_matmul_precision(value)
            else:
                mod, attr = key.rsplit(".", 1)
                setattr(eval(mod, {"torch": torch}), attr, value)  # keys come from FLAG_KEYS only
        yield
    finally:
        restore_torch_flags(saved)


class ExpectedOutputs:
    """The reference's output per (task, case, salt, torch switches), computed once on a clone of
    the cached input and kept while it fits `max_bytes` (outputs of the least recently used other
    task are dropped first; one larger than the budget is not kept).

    A measured kernel's checked outputs are judged on the same few inputs over and over (its cases,
    the re-check seed), so the verifier need not run the reference for each: on an H200 the check
    of one trimul output recomputed a reference of milliseconds. A timed call's input is its own
    (fresh_values.py): its reference is computed for it and not kept here.
    """

    def __init__(self, inputs: Any, max_bytes: int):
        self.inputs, self.max_bytes = inputs, int(max_bytes)
        self.items: dict[tuple, tuple[Any, int]] = {}
        self.computed = 0  # reference runs (misses)

    def clear(self) -> None:
        """Forget every kept output (the inputs' cache gives the memory back to the GPU)."""
        self.items.clear()

    def get(self, task, case: dict, salt: int, flags: dict) -> Any:
        from pipelines.profiling.timing import data_nbytes

        key = (task.name, task.case_id(case), int(salt), tuple(sorted(flags.items())))
        if key in self.items:
            self.items[key] = self.items.pop(key)  # most recently used last
            return self.items[key][0]
        out = task.ref_kernel(self.inputs.get(task, case, salt))  # a clone: the cached input stays as drawn
        self.computed += 1
        n = data_nbytes(out)
        if n <= self.max_bytes:
            self.items[key] = (out, n)
            total = sum(b for _, b in self.items.values())
            for victim in sorted(self.items, key=lambda k: k[0] == task.name):  # other tasks first, oldest first
                if total <= self.max_bytes:
                    break
                if victim != key:
                    total -= self.items.pop(victim)[1]
        return out


SPARE_GPU_BYTES = 2 * 2**30  # what the verifier's allocator may hold beyond what it keeps


def release_spare_gpu_memory(device: str, spare: int = SPARE_GPU_BYTES) -> bool:
    """Give the GPU back what torch's allocator holds beyond `spare` bytes over what is in use.

    The reference's work on a large case (trimul's: several GiB of intermediates) stays reserved
    in this process after the check, where the measuring child cannot have it: on an 80 GB H100
    (2026-12-05) one process held 40-44 GiB while 11 trimul kernels of a fresh batch, and the
    reference itself as a kernel in four runs of four, ran out of memory twice, their own input
    cache emptied; giving back what it held beyond 2 GiB, none did (1,087 kernels, and three runs
    of the reference as a kernel). Returns whether memory was given back.
    """
    if device != "cuda":
        return False
    import torch

    if torch.cuda.memory_reserved() - torch.cuda.memory_allocated() <= spare:
        return False
    torch.cuda.empty_cache()
    return True


class VerifierOutOfMemory(RuntimeError):
    """A check the GPU had no memory for, even with the verifier's caches emptied."""


class Verifier:
    """The verifier child's state: its own input cache and each job's progress through its plan."""

    def __init__(self, config: dict):
        from pipelines.profiling.inputs import InputCache, input_cache_bytes

        self.device = config.get("device", "cpu")
        self.protocol = config.get("protocol", "kernelcast")
        self.check_correctness_cases = bool(config.get("check_correctness_cases", False))
        self.timed_salts, self.samples = timed_draws(self.device, config)
        self.cache = InputCache(max_bytes=int(config.get("cache_bytes") or input_cache_bytes(self.device, 0.20, 8 * 2**30)))
        self.expected = ExpectedOutputs(self.cache, int(config.get("expected_bytes") or input_cache_bytes(self.device, 0.10, 4 * 2**30)))
        self.jobs: dict[str, _Job] = {}
        self.inputs_s = 0.0  # the last check's time drawing or finding its input

    def handle(self, msg: dict) -> dict:
        """One request -> one verdict {"type": "verdict", "job", "seq", "ok", "message", "step", "of", "unexpected"}."""
        from pipelines.profiling.taskload import load_task

        key, kind = str(msg.get("job")), msg.get("kind", "measure")
        base = {"type": "verdict", "job": msg.get("job"), "seq": msg.get("seq")}
        try:
            task = load_task(str(msg.get("task")))
        except Exception as e:  # noqa: BLE001 - the parent records it as our failure
            return {**base, "ok": False, "infrastructure": True, "message": f"verifier: task: {e}"[:300]}
        job = self.jobs.get(key)
        if job is None:
            plan = verification_plan(task, kind, self.device, self.protocol, self.check_correctness_cases,
                                     self.samples)
            timed = [task.case_id(c) for c in timed_cases(task, self.device)] if kind == "measure" else []
            job = self.jobs[key] = _Job(plan, timed)
        base["timed"] = job.timed
        step = (msg.get("case_id"), msg.get("salt"))
        draw = msg.get("draw")
        expected = job.plan[job.step] if job.step < len(job.plan) else None
        timed = expected is not None and expected[1] == TIMED
        if timed and step[0] == expected[0] and isinstance(step[1], int) and step[1] in self.timed_salts \
                and is_draw(draw):
            expected = step  # a timed call's output: any of the salts the timed calls draw from, any transform
        elif draw is not None:
            step = (step[0], step[1], "with a transform")  # only a timed call's input has one: out of plan
        if job.resending and expected is not None and step != expected:
            # Sent before the child learnt that its outputs cannot be mapped here: it ships them
            # again, as files, after the step asked for.
            return {**base, "ok": False, "resend": True, "message": "shipped again as a file"}
        if expected is None or step != expected:
            job.unexpected = True
            return {**base, "ok": False, "unexpected": True, "step": job.step, "of": len(job.plan),
                    "message": f"asked to verify {step[0]!r} (seed +{step[1]}) out of plan"}
        case = next(c for c in task.correctness_cases + task.benchmark_cases if task.case_id(c) == step[0])
        t0 = time.perf_counter()
        output, error, shipped = self._read(msg)
        from pipelines.profiling.inputs import sync

        sync(self.device)  # the copy out of the kernel's memory counted here
        read_s = time.perf_counter() - t0
        if output is _RESEND:  # no step used: the same request comes back as a file
            job.resending = True
            return {**base, "ok": False, "resend": True, "message": error}
        job.resending = False
        job.step += 1
        self.inputs_s = 0.0
        try:
            ok, message = self._check(task, case, int(step[1]), msg, output, error, timed, draw if timed else None)
        except VerifierOutOfMemory as e:
            return {**base, "ok": False, "infrastructure": True, "message": f"verifier: {e}"[:300]}
        finally:
            del output
            release_spare_gpu_memory(self.device)
        spent = {"verifier_read_s": read_s, "verifier_inputs_s": self.inputs_s,
                 "verifier_check_s": time.perf_counter() - t0 - read_s - self.inputs_s}
        return {**base, "ok": ok, "message": message, "step": job.step, "of": len(job.plan), "shipped": shipped,
                "timed_call": timed, "spent": spent}

    def _read(self, msg: dict) -> tuple[Any, str | None, str | None]:
        """(output, None, "file" | "ipc"), (None, why it cannot be checked, None) or (_RESEND, why
        the handles failed, None)."""
        from pipelines.profiling.shipping import NeedsFile, ShippingError, read_shipped

        try:
            output, shipped = read_shipped(msg["path"], self.device, owner=msg.get("owner"))
            return output, None, shipped
        except NeedsFile as e:
            return _RESEND, str(e), None
        except ShippingError as e:
            return None, str(e), None

    def _check(self, task, case: dict, salt: int, msg: dict, output: Any, error: str | None,
               timed: bool = False, draw: int | None = None) -> tuple[bool, str]:
        import torch

        from pipelines.profiling.sandbox_policy import one_line

        cid = task.case_id(case) + (" (a timed call)" if timed else f" (re-check, seed +{salt})" if salt else "")
        if error is not None:
            return False, f"case {cid}: the output cannot be checked: {error}"
        flags = clean_flags(msg.get("flags")) if self.protocol == "gpumode" else {}
        for _ in range(2):
            try:
                return self._judge(task, case, salt, output, flags, cid, draw)
            except torch.cuda.OutOfMemoryError as e:
                why = one_line(str(e))[:160]
            except Exception as e:  # noqa: BLE001 - a malformed output makes the check raise
                return False, one_line(f"case {cid}: check raised {type(e).__name__}: {e}")
            # Out of the verifier's own memory (its inputs, the reference's outputs and work), not
            # the kernel's doing: what it keeps is let go (after the except block, whose traceback
            # held the reference's work) and the check runs once more. A GPU that still has no room
            # makes the row `infrastructure`, retried by a resumed run, never `incorrect` (an 80 GB
            # H100, 2026-12-05: every trimul kernel of a mixed batch recorded `incorrect` so).
            self.expected.clear()
            self.cache.clear()
        raise VerifierOutOfMemory(f"case {cid}: the check ran out of GPU memory twice, its caches emptied "
                                  f"in between: {why}")

    def _judge(self, task, case: dict, salt: int, output: Any, flags: dict, cid: str,
               draw: int | None = None) -> tuple[bool, str]:
        """The check of one output (raises what the check raises). `draw`: a timed call's output,
        checked on its own input (its salt's base values under the draw's transform), whose
        reference is computed here and not kept: no other output has that input."""
        from pipelines.profiling.fresh_values import fresh_copy
        from pipelines.profiling.inputs import sync
        from pipelines.profiling.sandbox_policy import one_line

        with global_flags(flags):
            t0 = time.perf_counter()
            if draw is not None:
                data = fresh_copy(self.cache.peek(task, case, salt), draw)
                expected = task.ref_kernel(data) if task.check_against is not None else None
            elif task.check_against is not None:  # the reference's output on this input, computed once
                expected = self.expected.get(task, case, salt, flags)
                data = self.cache.peek(task, case, salt)  # read only by the check: no clone
            else:
                data = self.cache.get(task, case, salt)
            sync(self.device)  # the reference's and the inputs' device work counted here
            self.inputs_s = time.perf_counter() - t0
            if task.check_against is not None:
                ok, message = task.check_against(data, output, expected)
            else:
                ok, message = task.check_implementation(data, output)
        sync(self.device)
        return bool(ok), "ok" if ok else one_line(f"case {cid}: {message}")

    def forget(self, job: Any) -> None:
        self.jobs.pop(str(job), None)


# ---- the parent's side ------------------------------------------------------------------------
@dataclass
class JobVerdicts:
    """What the verifier said about one job."""

    of: int = 0  # steps in the plan (0: no verdict yet)
    done: int = 0  # steps verified
    failure: str | None = None  # the first failing step's message
    timed_failure: bool = False  # that step was a timed call's output (the kernel passed its checks)
    unexpected: bool = False  # a request out of plan
    infrastructure: str | None = None  # the verifier could not work (died, no task)
    timed: list[str] = field(default_factory=list)  # the case ids the plan times, in order

    @property
    def complete(self) -> bool:
        return self.of > 0 and self.done == self.of


# The verifier's seconds: mapping or reading an output; drawing (or finding) the case's input; the check.
_VERIFIER_PHASES = ("verifier_read_s", "verifier_inputs_s", "verifier_check_s")


class VerifierLink:
    """The parent's handle on the verifier child: forwards requests, keeps verdicts per job.

    Args:
        spawn: starts the verifier child (a Sandbox with jailed=False, role "verify").
    """

    def __init__(self, spawn: Callable[[], Any]):
        self.spawn = spawn
        self.sb: Any = None
        # job -> (child sandbox, seq) of each request awaiting a verdict, in the order sent (the
        # verifier answers in order)
        self.waiting: dict[str, deque[tuple[Any, int]]] = {}
        self.verdicts: dict[str, JobVerdicts] = {}
        self.queue: list[dict] = []  # requests sent before the verifier was ready
        self.resent = 0  # outputs the verifier could not map and asked for as files
        self.shipped: Counter = Counter()  # verdicts by how the output came: "ipc" | "file"
        self.spent: Counter = Counter()  # the verifier's seconds by phase (_VERIFIER_PHASES), summed

    def ensure(self) -> None:
        if self.sb is None:
            self.sb = self.spawn()

    @property
    def conn(self):
        return self.sb.conn if self.sb is not None else None

    def forward(self, child: Any, job: str, kind: str, task: str, msg: dict) -> dict | None:
        """Pass one request of `child` on; a reply for the child when it cannot be passed on."""
        name = str(msg.get("file", ""))
        v = self.verdicts.setdefault(job, JobVerdicts())
        queued = self.waiting.setdefault(job, deque())
        if not OUTPUT_FILE.match(name) or len(queued) >= ChannelJudge.MAX_PENDING:
            v.unexpected = True
            return {"type": "verdict", "seq": msg.get("seq"), "ok": False}
        request = {"type": "verify", "job": job, "kind": kind, "task": task, "seq": msg.get("seq"),
                   "case_id": msg.get("case_id"), "salt": msg.get("salt"), "flags": msg.get("flags"),
                   "draw": msg.get("draw"),
                   "path": str(Path(child.private_dir) / name), "owner": child.uid}
        queued.append((child, msg.get("seq")))
        self.ensure()
        if self.sb.ready:
            self._send(request)
        else:
            self.queue.append(request)
        return None

    def _send(self, request: dict) -> None:
        from pipelines.profiling.sandbox import ChildDied

        try:
            self.sb.send(request)
        except ChildDied as e:
            self.died(str(e))

    def on_message(self) -> list[tuple[Any, dict]]:
        """Read one message of the verifier; (child, reply) pairs to deliver."""
        from pipelines.profiling.sandbox import ChildDied

        try:
            msg = self.sb.recv()
        except ChildDied as e:
            return self.died(str(e))
        if msg.get("type") == "ready":
            self.sb.ready = True
            queued, self.queue = self.queue, []
            for request in queued:
                self._send(request)
            return []
        if msg.get("type") == "fatal":
            return self.died(msg.get("error", "verifier failed to start"))
        if msg.get("type") != "verdict":
            return []
        job = str(msg.get("job"))
        if msg.get("resend"):  # not a verdict: the child ships the same output again, as a file
            self.resent += 1
            child, seq = self._answered(job)
            return [(child, {"type": "verdict", "seq": seq, "ok": False, "resend": True})] if child is not None else []
        v = self.verdicts.setdefault(job, JobVerdicts())
        v.of = int(msg.get("of") or v.of)
        spent = msg.get("spent")
        if isinstance(spent, dict):  # the verifier's own seconds, for the run's per-phase split
            self.spent.update({k: float(spent[k]) for k in _VERIFIER_PHASES
                               if isinstance(spent.get(k), (int, float)) and math.isfinite(spent[k]) and spent[k] >= 0})
        if msg.get("shipped") in ("ipc", "file"):  # absent when the output could not be read
            self.shipped[msg["shipped"]] += 1
        if isinstance(msg.get("timed"), list):
            v.timed = [str(c) for c in msg["timed"]]
        if msg.get("infrastructure"):
            v.infrastructure = str(msg.get("message"))
        elif msg.get("unexpected"):
            v.unexpected = True
        elif msg.get("ok"):
            v.done += 1
        elif v.failure is None:
            v.failure = str(msg.get("message"))
            v.timed_failure = bool(msg.get("timed_call"))
        child, seq = self._answered(job)
        return [(child, {"type": "verdict", "seq": seq, "ok": bool(msg.get("ok"))})] if child is not None else []

    def _answered(self, job: str) -> tuple[Any, Any]:
        """(child, seq) of the oldest request of `job` awaiting a verdict, now answered."""
        queued = self.waiting.get(job)
        if not queued:
            return None, None
        child, seq = queued.popleft()
        if not queued:
            del self.waiting[job]
        return child, seq

    def relay(self, alive: Collection[Any]) -> None:
        """Read one message of the verifier and pass its replies on to those of `alive` they
        are for."""
        from pipelines.profiling.sandbox import deliver

        for child, reply in self.on_message():
            deliver(child, reply, alive)

    def died(self, reason: str) -> list[tuple[Any, dict]]:
        """The verifier is gone: every waiting job fails as ours (infrastructure); a new one starts
        on the next request."""
        out = []
        for job, queued in self.waiting.items():
            self.verdicts.setdefault(job, JobVerdicts()).infrastructure = f"verifier died: {reason}"
            out += [(child, {"type": "verdict", "seq": seq, "ok": False}) for child, seq in queued]
        self.waiting.clear()
        self.queue.clear()
        if self.sb is not None:
            self.sb.kill()
        self.sb = None
        return out

    def outcome(self, job: str) -> JobVerdicts:
        """The verdicts of `job` (empty if it asked for none); forgets it here and in the verifier."""
        v = self.verdicts.pop(job, JobVerdicts())
        self.waiting.pop(job, None)
        if self.sb is not None and self.sb.ready:
            self._send({"type": "forget", "job": job})
        return v

    def close(self) -> None:
        if self.sb is not None:
            self.sb.shutdown(timeout_s=2.0)
            self.sb = None


MARGINAL_SHARE = 1e-3  # a wrong timed output with at most this share of its elements off is `incorrect`
_ELEMENTS_OFF = re.compile(r"(\d+)/(\d+) elements")


def mismatch_share(message: str) -> float | None:
    """The share of elements a check message says are off ("12/4096 elements off"), if it says.

    >>> mismatch_share("case a: output: 1/16777216 elements off (rtol=0.02)"), mismatch_share("contains NaN")
    (5.960464477539063e-08, None)
    """
    m = _ELEMENTS_OFF.search(message or "")
    return int(m.group(1)) / int(m.group(2)) if m and int(m.group(2)) > 0 else None


def settle(result: dict, v: JobVerdicts) -> dict:
    """The result a row records, from what the kernel's process claims and the verifier's record.

    A request out of plan, or a claim of correctness without an ok verdict on every step, is
    `tampered`, and so is a wrong output of a timed call (its checks passed); any other failed
    verdict is `incorrect` with the verifier's message; a verifier that could
    not work is `infrastructure` (retried by a resumed run).
    """
    out = dict(result)
    claimed_ok = result.get("status") == "ok" or result.get("ok") is True

    def fail(kind: str, error: str) -> dict:
        out.update(status="failed", ok=False, failure_kind=kind, error=error)
        return out

    if v.unexpected:
        return fail("tampered", "the kernel's process asked the verifier for steps out of plan")
    if result.get("failure_kind") == "tampered":
        return out
    if v.infrastructure:
        return fail("infrastructure", v.infrastructure)
    if v.failure is not None and v.timed_failure:
        share = mismatch_share(v.failure)
        if share is not None and share <= MARGINAL_SHARE:
            # A timed call runs on values of its own: a kernel at the edge of the tolerance can
            # miss by a hair on them (seen on the H200: 1 element of 16.8 M, by 1e-4 past it).
            return fail("incorrect", f"wrong on the values of a timed call: {v.failure}")
        # Every check before timing passed (the plan puts them first), so the kernel computed
        # right when checked and wrong when timed: it told the two apart.
        return fail("tampered", f"right when checked, wrong when timed: {v.failure}")
    if v.failure is not None:
        return fail("incorrect", v.failure)
    if claimed_ok and not v.complete:
        return fail("tampered", f"reported correct with {v.done} of {v.of or '?'} verdicts from the verifier")
    return out


def flags_json(snapshot: dict) -> dict:
    """The FLAG_KEYS part of inputs.snapshot_torch_flags(), as plain JSON values."""
    return clean_flags(json.loads(json.dumps({k: v for k, v in snapshot.items() if k in FLAG_KEYS})))
