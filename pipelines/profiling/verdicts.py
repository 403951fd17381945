"""The parent's side of verification: the verifier child's verdicts per job, and the row they settle.

`VerifierLink` starts the verifier child, forwards the kernel processes' requests to it and keeps
what it answered per job (`JobVerdicts`); `settle` then holds what a kernel's process claims to that
record: a request out of plan, or a claim of correctness without an ok verdict on every step, is
`tampered`, a wrong output `incorrect`. Imported by the worker's parent, so torch-free (verify.py
describes the whole exchange); verification code, so the integrity watch covers it
(integrity.HARNESS_MODULES).
"""

from __future__ import annotations

import math
import re
from collections import Counter, deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.profiling.verify import OUTPUT_FILE, ChannelJudge


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
