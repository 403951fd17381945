"""Checked calls of a kernel: its output on a case judged by the verifier, never in this process.

Each checked call runs on a freshly generated input, into an allocator whose free memory was just
filled with NaN bytes (`poison_free_memory`: an output element the kernel forgets to write is
garbage, never a left-over right answer); its output is shipped to the verifier (verify.py), which
rebuilds the input and the reference in its own process and judges. The re-checks after timing write
a new seed's values into the very buffers that were timed (`copy_into`). Used by the check role and
the Measurer; harness code the integrity watch covers (integrity.HARNESS_MODULES).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pipelines.profiling import verify
from pipelines.profiling.inputs import (
    make_input,
    map_tensors,
    snapshot_torch_flags,
    sync,
)
from pipelines.profiling.kernel_loading import KernelFailure, _describe, classify
from pipelines.profiling.sandbox_policy import one_line
from pipelines.profiling.shipping import ShippingError
from pipelines.profiling.timing import (
    Steps,
    drive,
    keep_output,
)


def poison_free_memory(device: str, data: Any) -> None:
    """Fill blocks of freed memory with 0xFF (NaN in every float format), then free them again.

    The kernel's next allocations are likely carved from these blocks (the CUDA caching
    allocator; the CPU heap, which keeps freed blocks by size, hence blocks the size of each input
    tensor as well as one of twice the input), so an output element the kernel never writes reads
    as NaN instead of whatever an earlier correct run (the reference, timed in this process) left.
    """
    sizes: list[int] = []
    map_tensors(data, lambda t: sizes.append(t.numel() * t.element_size()))
    where = "cuda" if device == "cuda" else "cpu"
    blocks = [torch.empty(2 * sum(sizes), dtype=torch.uint8, device=where)] if sum(sizes) else []
    if where == "cpu":
        blocks += [torch.empty(n, dtype=torch.uint8) for n in sizes for _ in range(2) if n]
    for b in blocks:
        b.fill_(0xFF)
    del blocks


def copy_into(target: Any, source: Any) -> Any:
    """`target` with every tensor's values replaced by `source`'s (same buffers, same objects)."""
    if isinstance(target, torch.Tensor):
        target.copy_(source)
        return target
    if isinstance(target, (tuple, list)):
        for t, s in zip(target, source):
            copy_into(t, s)
        return target
    if isinstance(target, dict):
        for k in target:
            copy_into(target[k], source[k])
        return target
    return target


def check_steps(task, case: dict, device: str, salt: int = 0, into: Any = None, held: list | None = None) -> Steps:
    """One checked call of the kernel on a case, as steps (timing.drive makes the call), and the
    verifier's verdict on its output; KernelFailure on any problem.

    Args:
        into: an input the kernel ran on before: the case's values (seed + salt) are written into
            its buffers and the kernel runs on that very object (the re-checks).
        held: where given, the output is not judged now: a copy of it (the kernel may reuse its
            buffer) goes into `held` as a `Held`, for `submit_held` and `collect_verdicts`.
    Returns:
        The input the kernel ran on (for a later re-check into its buffers).
    """
    cid = task.case_id(case) + (f" (recheck, seed +{salt})" if salt else "")
    try:
        data_k = make_input(task, case, salt)
        if into is not None:
            data_k = copy_into(into, data_k)
        sync(device)
    except Exception as e:
        raise KernelFailure("infrastructure", f"generate_input failed on {cid}: {_describe(e)}",
                            out_of_memory=isinstance(e, torch.cuda.OutOfMemoryError)) from e
    poison_free_memory(device, data_k)
    try:
        out = yield data_k
        sync(device)
        if held is not None:
            held.append(Held(case, salt, keep_output(out), cid, None))
    except Exception as e:
        raise classify(e, device, f"case {cid}") from e
    if held is None:
        judge_output(task, case, salt, out, device, cid)
    return data_k


@dataclass
class Held:
    """An output waiting to be shipped to the verifier: a copy the kernel never got. `draw`: the
    transform a timed call's input had (fresh_values.py); None for a checked call's."""

    case: dict
    salt: int
    output: Any
    cid: str
    draw: int | None = None


def submit_held(task, held: list[Held], device: str) -> list[str]:
    """Ship each held output for a verdict without waiting (verify.submit); the case ids, in order.
    The outputs are let go once shipped (the judge keeps what the verifier maps)."""
    t0 = time.perf_counter()
    cids = []
    try:
        while held:
            h = held.pop(0)
            try:
                verify.submit(task, h.case, h.salt, h.output, verify.flags_json(snapshot_torch_flags()), h.draw)
            except ShippingError as e:
                raise KernelFailure("incorrect", f"case {h.cid}: {e}") from e
            except Exception as e:
                raise _judge_failure(e, device, h.cid) from e
            cids.append(h.cid)
    finally:
        _JUDGE_CLOCK.seconds += time.perf_counter() - t0
    return cids


def collect_verdicts(cids: list[str], device: str) -> None:
    """Wait for the verdicts of everything shipped (verify.collect); KernelFailure at the first
    wrong output, named by `cids` (the case ids submit_held returned, in the same order)."""
    t0 = time.perf_counter()
    try:
        verdicts = verify.collect()
    except Exception as e:
        raise _judge_failure(e, device, cids[0] if cids else "?") from e
    finally:
        _JUDGE_CLOCK.seconds += time.perf_counter() - t0
    for (ok, message), cid in zip(verdicts, list(cids) + ["?"] * len(verdicts)):
        if not ok:
            raise KernelFailure("incorrect", one_line(f"case {cid}: {message}"))


def _judge_failure(e: Exception, device: str, cid: str) -> KernelFailure:
    """What a failure to get a verdict (not a wrong output) makes of the job."""
    failure = classify(e, device, f"check on case {cid}")
    if failure.kind in ("crashed", "tampered"):
        return failure
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return KernelFailure("infrastructure", f"case {cid}: check ran out of GPU memory")
    return KernelFailure("incorrect", f"case {cid}: check raised {_describe(e)}")


def judge_output(task, case: dict, salt: int, out: Any, device: str, cid: str) -> None:
    """The verifier's verdict on one output (seed + salt); KernelFailure unless it is right."""
    collect_verdicts(submit_held(task, [Held(case, salt, out, cid)], device), device)


def check_case(task, fn: Callable, case: dict, device: str, salt: int = 0, into: Any = None) -> Any:
    """Run the kernel on one case and have the verifier judge its output (check_steps)."""
    return drive(fn, check_steps(task, case, device, salt, into))


def check_all(task, fn: Callable, cases, device: str, progress: Callable[[str], None] | None = None) -> Any:
    """check_case on every case in order; returns the first case's input (None without cases)."""
    first = None
    for case in cases:
        if progress:
            progress(f"checking {task.case_id(case)}")
        data = check_case(task, fn, case, device)
        first = data if first is None else first
    return first


class _JudgeClock:
    """Seconds spent waiting for verdicts (shipping an output and the verifier's work)."""

    def __init__(self) -> None:
        self.seconds = 0.0


_JUDGE_CLOCK = _JudgeClock()
