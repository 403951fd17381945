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
calls the measuring child kept (drawn after the calls, on values of one of the timed salts). A request out of plan, or a child that reports a correct kernel without
an ok verdict on every step, makes the kernel `tampered` (`settle`).

    kernel process   judge(task, case, salt, output) -> (ok, message)     ChannelJudge / LocalJudge
    verifier         Verifier.handle(request) -> verdict                   child role "verify"
    parent           VerifierLink.forward(...) / .on_message() / .outcome(job)
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
from collections import Counter
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


TIMED_SALT_BASE = 2_000_003  # timed calls draw their values from seeds + this + 0..variants-1
TIMED = -1  # a plan step for the output of a timed call: any of the timed salts
# On the CPU a case has a warm-up call and at most a few timed ones: 8 variants give each its own
# values, and a child generates them once per case (a new salt per call cost 2x the timing on trimul).
CPU_TIMED_VARIANTS = 8
CUDA_TIMED_VARIANTS = 2  # on a GPU each variant is a benchmark input generated (and kept) once per child


def timed_draws(device: str, config: dict | None = None) -> tuple[tuple[int, ...], int]:
    """(the salts timed calls take their input values from, the outputs of timed calls verified per case).

    config keys `timed_variants` and `timed_samples` (the worker's --timed-variants and
    --timed-samples) override the defaults: 8 variants on the CPU (each call of a case its own
    values), two on a GPU; one verified output per case.
    """
    config = config or {}
    default = CPU_TIMED_VARIANTS if device == "cpu" else CUDA_TIMED_VARIANTS
    variants = max(1, int(config.get("timed_variants") or default))
    samples = max(1, int(config.get("timed_samples") or 1))
    return tuple(TIMED_SALT_BASE + i for i in range(variants)), samples


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

    def judge(self, task, case: dict, salt: int, output: Any, flags: dict | None = None) -> tuple[bool, str]:
        from pipelines.profiling.inputs import make_input

        ok, message = task.check_implementation(make_input(task, case, salt), output)
        return bool(ok), str(message)


class ChannelJudge:
    """Ships the output to the parent and waits for the verifier's verdict (child processes).

    On a GPU the output goes as CUDA IPC handles (shipping.write_handles); when the verifier
    cannot map them it asks for the file instead, and from then on this process ships files.
    KERNELCAST_SHIP=file ships files from the start.
    """

    def __init__(self, send: Callable[[dict], None], recv: Callable[[], dict], ipc: bool | None = None):
        self.send, self.recv = send, recv
        self.seq = itertools.count(1)
        self.ipc = os.environ.get("KERNELCAST_SHIP", "auto") != "file" if ipc is None else ipc

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

    def judge(self, task, case: dict, salt: int, output: Any, flags: dict | None = None) -> tuple[bool, str]:
        from pipelines.profiling.shipping import write_output

        seq = next(self.seq)
        name = f"out-{seq:06d}.kco"
        path = Path.cwd() / name  # the private directory (jail.py made it the working directory)
        keep = self._write(path, output)
        request = {"type": "verify", "seq": seq, "case_id": task.case_id(case), "salt": int(salt), "file": name,
                   "flags": flags or {}}
        try:
            self.send(request)
            while True:
                reply = self.recv()
                if reply.get("type") != "verdict" or reply.get("seq") != seq:
                    continue
                if reply.get("resend") and keep is not None:  # the verifier cannot map our memory
                    self.ipc, keep = False, None
                    write_output(path, output)
                    self.send(request)
                    continue
                return bool(reply.get("ok")), "rejected by the verifier"
        finally:
            del keep
            with contextlib.suppress(OSError):
                path.unlink()


class _JudgeHolder:
    """The judge this process uses (child.py installs a ChannelJudge); an object, so its
    identity stays what the integrity watch recorded."""

    def __init__(self) -> None:
        self.impl: LocalJudge | ChannelJudge = LocalJudge()


JUDGE = _JudgeHolder()


def judge(task, case: dict, salt: int, output: Any, flags: dict | None = None) -> tuple[bool, str]:
    """(ok, message) for `output` on `case` (seed + `salt`), by the installed judge."""
    return JUDGE.impl.judge(task, case, salt, output, flags)


# ---- the verifier process ---------------------------------------------------------------------
_RESEND = object()  # Verifier._read: the output came as handles this process cannot map


@dataclass
class _Job:
    plan: list[tuple[str, int]]
    timed: list[str]
    step: int = 0
    unexpected: bool = False


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


class Verifier:
    """The verifier child's state: its own input cache and each job's progress through its plan."""

    def __init__(self, config: dict):
        from pipelines.profiling.inputs import InputCache, input_cache_bytes

        self.device = config.get("device", "cpu")
        self.protocol = config.get("protocol", "kernelcast")
        self.check_correctness_cases = bool(config.get("check_correctness_cases", False))
        self.timed_salts, self.samples = timed_draws(self.device, config)
        self.cache = InputCache(max_bytes=int(config.get("cache_bytes") or input_cache_bytes(self.device, 0.20, 8 * 2**30)))
        self.jobs: dict[str, _Job] = {}

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
        expected = job.plan[job.step] if job.step < len(job.plan) else None
        timed = expected is not None and expected[1] == TIMED
        if timed and step[0] == expected[0] and isinstance(step[1], int) and step[1] in self.timed_salts:
            expected = step  # a timed call's output: any of the salts the timed calls draw from
        if expected is None or step != expected:
            job.unexpected = True
            return {**base, "ok": False, "unexpected": True, "step": job.step, "of": len(job.plan),
                    "message": f"asked to verify {step[0]!r} (seed +{step[1]}) out of plan"}
        case = next(c for c in task.correctness_cases + task.benchmark_cases if task.case_id(c) == step[0])
        output, error, shipped = self._read(msg)
        if output is _RESEND:  # no step used: the same request comes back as a file
            return {**base, "ok": False, "resend": True, "message": error}
        job.step += 1
        ok, message = self._check(task, case, int(step[1]), msg, output, error, timed)
        return {**base, "ok": ok, "message": message, "step": job.step, "of": len(job.plan), "shipped": shipped,
                "timed_call": timed}

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
               timed: bool = False) -> tuple[bool, str]:
        from pipelines.profiling.inputs import sync
        from pipelines.profiling.sandbox_policy import one_line

        cid = task.case_id(case) + (" (a timed call)" if timed else f" (re-check, seed +{salt})" if salt else "")
        if error is not None:
            return False, f"case {cid}: the output cannot be checked: {error}"
        flags = clean_flags(msg.get("flags")) if self.protocol == "gpumode" else {}
        data = self.cache.get(task, case, salt)
        try:
            with global_flags(flags):
                ok, message = task.check_implementation(data, output)
            sync(self.device)
        except Exception as e:  # noqa: BLE001 - a malformed output makes the check raise
            return False, one_line(f"case {cid}: check raised {type(e).__name__}: {e}")
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


class VerifierLink:
    """The parent's handle on the verifier child: forwards requests, keeps verdicts per job.

    Args:
        spawn: starts the verifier child (a Sandbox with jailed=False, role "verify").
    """

    def __init__(self, spawn: Callable[[], Any]):
        self.spawn = spawn
        self.sb: Any = None
        self.waiting: dict[str, tuple[Any, int]] = {}  # job -> (child sandbox, seq) awaiting a verdict
        self.verdicts: dict[str, JobVerdicts] = {}
        self.queue: list[dict] = []  # requests sent before the verifier was ready
        self.resent = 0  # outputs the verifier could not map and asked for as files
        self.shipped: Counter = Counter()  # verdicts by how the output came: "ipc" | "file"

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
        if not OUTPUT_FILE.match(name) or job in self.waiting:
            v.unexpected = True
            return {"type": "verdict", "seq": msg.get("seq"), "ok": False}
        request = {"type": "verify", "job": job, "kind": kind, "task": task, "seq": msg.get("seq"),
                   "case_id": msg.get("case_id"), "salt": msg.get("salt"), "flags": msg.get("flags"),
                   "path": str(Path(child.private_dir) / name), "owner": child.uid}
        self.waiting[job] = (child, msg.get("seq"))
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
            child, seq = self.waiting.pop(job, (None, None))
            return [(child, {"type": "verdict", "seq": seq, "ok": False, "resend": True})] if child is not None else []
        v = self.verdicts.setdefault(job, JobVerdicts())
        v.of = int(msg.get("of") or v.of)
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
        child, seq = self.waiting.pop(job, (None, None))
        return [(child, {"type": "verdict", "seq": seq, "ok": bool(msg.get("ok"))})] if child is not None else []

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
        for job, (child, seq) in self.waiting.items():
            self.verdicts.setdefault(job, JobVerdicts()).infrastructure = f"verifier died: {reason}"
            out.append((child, {"type": "verdict", "seq": seq, "ok": False}))
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
