"""The verifier process: verdicts on shipped outputs, from a process that imports no kernel.

`Verifier` (child role "verify") maps or reads each output a kernel's process ships (shipping.py),
rebuilds the case's input itself (the same seed, and for a timed call the same transform:
fresh_values.py), computes the reference under the kernel process's allow-listed torch switches
(`global_flags`) and answers ok / not ok with a message, holding each job to its plan
(verify.verification_plan). Reference outputs are kept per case (`ExpectedOutputs`) so a job's
re-checks and timed samples cost one reference each. verify.py describes the whole exchange;
verification code, so the integrity watch covers it (integrity.HARNESS_MODULES).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from pipelines.profiling.verify import (
    TIMED,
    clean_flags,
    is_draw,
    timed_cases,
    timed_draws,
    verification_plan,
)

# ---- the verifier process ---------------------------------------------------------------------
_RESEND = object()  # Verifier._read: the output came as handles this process cannot map


@dataclass
class _Job:
    plan: list[tuple[str, int]]
    timed: list[str]
    step: int = 0
    unexpected: bool = False
    resending: bool = False  # a step was asked for again as a file: later requests are too, until it comes


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
