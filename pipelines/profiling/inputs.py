"""Task inputs and torch's global switches, shared by the measuring child (runner.py) and the
verifier (verify.py): both draw a case's input from the same seeded generator, and both put back
the switches a kernel module may have flipped."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch

from pipelines.profiling.fresh_values import fresh_copy
from pipelines.profiling.timing import data_nbytes


def generate(task, case: dict, salt: int = 0) -> Any:
    kw = dict(case)
    seed = int(kw.pop("seed", 0)) + salt
    return task.generate_input(seed=seed, **kw)


def map_tensors(data: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """A task input (tensors inside tuples, lists and dicts) with `fn` applied to every tensor."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, tuple):
        return tuple(map_tensors(x, fn) for x in data)
    if isinstance(data, list):
        return [map_tensors(x, fn) for x in data]
    if isinstance(data, dict):
        return {k: map_tensors(v, fn) for k, v in data.items()}
    return data


def clone_data(data: Any) -> Any:
    """A deep copy of a task input: every tensor cloned (same values, fresh buffers)."""
    return map_tensors(data, torch.Tensor.clone)


class InputCache:
    """Task inputs generated once per (task, case, salt) and handed out as fresh clones.

    Tasks draw inputs from a seeded generator on their device (contract.seeded_generator); a
    benchmark case still costs milliseconds to a second (trimul's largest, copies included), far
    more than handing out a clone.
    A clone is a new buffer with the same values: no kernel ever sees a buffer another kernel
    (or the reference) has touched. Inputs of the least recently used task are dropped once
    the cache holds more than `max_bytes`.
    """

    def __init__(self, max_bytes: int = 24 * 2**30):
        self.max_bytes = max_bytes
        self.items: dict[tuple[str, str, int], tuple[Any, int]] = {}

    def get(self, task, case: dict, salt: int = 0) -> Any:
        return clone_data(self.peek(task, case, salt))

    def peek(self, task, case: dict, salt: int = 0) -> Any:
        """The cached input itself, not a clone: for reading only (values copied into buffers)."""
        key = (task.name, task.case_id(case), salt)
        if key not in self.items:
            data = generate(task, case, salt)
            self.items[key] = (data, data_nbytes(data))
            self._evict(keep=task.name)
        else:
            self.items[key] = self.items.pop(key)  # most recently used last
        return self.items[key][0]

    def nbytes(self) -> int:
        """The bytes of every kept input."""
        return sum(n for _, n in self.items.values())

    def clear(self) -> None:
        """Drop every kept input and give the freed blocks back to the GPU."""
        self.items.clear()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _evict(self, keep: str) -> None:
        while self.nbytes() > self.max_bytes:
            victim = next((k for k in self.items if k[0] != keep), None)
            if victim is None:
                break
            del self.items[victim]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


CACHE = InputCache()


def input_cache_bytes(device: str, share: float, floor: int) -> int:
    """An input cache's budget: `share` of the GPU's memory, at least `floor`; `floor` on the CPU.

    With its re-check seed and two timed variants per case, every task's benchmark inputs take
    about 41 GB (trimul 15, cross_entropy 14, gdn_chunk_fwd_o 5.4); a fixed 24 GiB held fewer
    tasks than a mixed batch cycles through, so each task switch regenerated them (about a second
    a case on the CPU). 30% of an H200 (43 GB) for the measuring child and 20% for the verifier
    hold them all and leave about 70 GB for kernels and references.
    """
    if device == "cuda" and torch.cuda.is_available():
        return max(int(floor), int(share * torch.cuda.get_device_properties(0).total_memory))
    return int(floor)


def make_input(task, case: dict, salt: int = 0) -> Any:
    """The task's input for `case`, deterministic by the case's seed (+ salt): a fresh clone."""
    return CACHE.get(task, case, salt)


def call_input(task, case: dict, salt: int = 0, draw: int | None = None) -> Any:
    """The input a call ran on: the case's values for `salt`, under `draw`'s transform for a timed
    call (fresh_values.py); a fresh copy either way."""
    if draw is None:
        return make_input(task, case, salt)
    return fresh_copy(CACHE.peek(task, case, salt), draw)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()  # device-wide: every stream the kernel may have used


# ---- torch global state ----------------------------------------------------------------
_FLAG_ATTRS = (
    ("torch.backends.cuda.matmul", "allow_tf32"),
    ("torch.backends.cudnn", "allow_tf32"),
    ("torch.backends.cuda.matmul", "allow_fp16_reduced_precision_reduction"),
    ("torch.backends.cuda.matmul", "allow_bf16_reduced_precision_reduction"),
    ("torch.backends.cudnn", "benchmark"),
)


def snapshot_torch_flags() -> dict:
    """Global torch switches a kernel module might flip (TF32, default dtype, ...)."""
    snap: dict = {"default_dtype": torch.get_default_dtype(), "matmul_precision": torch.get_float32_matmul_precision()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mod, attr in _FLAG_ATTRS:
            with contextlib.suppress(Exception):
                snap[f"{mod}.{attr}"] = getattr(eval(mod), attr)
    return snap


def restore_torch_flags(snap: dict) -> None:
    """Undo what a kernel changed, so the next reference timing runs as the first did."""
    torch.set_default_dtype(snap["default_dtype"])
    torch.set_float32_matmul_precision(snap["matmul_precision"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mod, attr in _FLAG_ATTRS:
            key = f"{mod}.{attr}"
            if key in snap:
                with contextlib.suppress(Exception):
                    setattr(eval(mod), attr, snap[key])
