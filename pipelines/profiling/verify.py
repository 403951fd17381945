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

This module holds the plan and the kernel process's side (the judges); the verifier process lives
in verifier.py, the parent's side (VerifierLink, settle) in verdicts.py.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
from collections.abc import Callable
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


def flags_json(snapshot: dict) -> dict:
    """The FLAG_KEYS part of inputs.snapshot_torch_flags(), as plain JSON values."""
    return clean_flags(json.loads(json.dumps({k: v for k, v in snapshot.items() if k in FLAG_KEYS})))
