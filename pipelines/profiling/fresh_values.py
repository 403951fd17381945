"""New input values for every timed call: a cheap random transform of a case's base values.

A timed call runs on the same buffers each time (the kernel's allocations and caches see what
they would in a real workload), and before each call new values are written into them outside
the timed window. Cycling through a few fixed variants of the case let a kernel keep its answer
per input (by the buffer's address and a few of its values, or by the whole content) and return
it whenever a variant came back: a softmax kernel with such a memo measured 8.6x, 344x its honest
twin, and its sampled outputs were right. So every call now gets values no call of the case had
before: its base values (one of the case's timed variants, generated once) under a transform
drawn for that call alone from the operating system's CSPRNG, after the previous call returned.

The transform, per tensor of the input (`transform_plan`, `write_fresh`):

* rolled along its first dimension by a random offset (rows, batch items or vector entries move
  together, so what a task keeps within a row, a group or a chunk stays as generated: fp8_quant's
  all-zero group, gdn_chunk_fwd_o's gates cumulated within each chunk);
* a floating-point tensor, unless its values are all 0 or 1 (a mask), multiplied by a random
  factor 2**(j/64), 0 < |j| <= 16 (0.84 to 1.19): factors 1.1% apart, more than a bf16 unit in
  the last place, so no two factors give a tensor the same values;
* integer and boolean tensors (labels, indices, masks) are only rolled: their values stay in range;
* anything that is not a tensor (eps, a scale, a config dict) is left as it is.

Each scaled tensor changes, so the correct output changes with every call. A draw is a 63-bit
integer; the transform follows from it and the base values alone, so the verifier, given the
salt of the base values and the draw, rebuilds the input of any kept call (`fresh_copy`) and
computes the reference on it. The fill costs what a copy does: one read of the base values and
one write into the buffers, as slice copies and scalar multiplies on the tensors' own device.

Only the standard library and torch (the worker runs on bare hosts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

SCALE_STEPS = tuple(j for j in range(-16, 17) if j)  # factor 2 ** (j / 64)
DRAW_BITS = 63
SCALED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def scale_factor(step: int) -> float:
    """The factor of a scale step.

    >>> scale_factor(64 // 4), round(scale_factor(-16), 4)
    (1.189207115002721, 0.8409)
    """
    return 2.0 ** (step / 64)


@dataclass(frozen=True)
class LeafPlan:
    """What a call may do to one tensor of the input: roll it along dimension 0 (over `rows`
    positions; 1 = no roll) and whether it may scale it."""

    rows: int
    scaled: bool


def tensors(data: Any) -> list[torch.Tensor]:
    """The tensors of a task input in a fixed order (tuples, lists and dict values in order)."""
    if isinstance(data, torch.Tensor):
        return [data]
    if isinstance(data, (tuple, list)):
        return [t for x in data for t in tensors(x)]
    if isinstance(data, dict):
        return [t for v in data.values() for t in tensors(v)]
    return []


def _is_mask(t: torch.Tensor) -> bool:
    """Whether every value is 0 or 1. The bounds first: they need no temporary of the tensor's
    size (trimul's input is 1.6 GB), and an input of normal values fails them at once."""
    if t.numel() == 0:
        return False
    lo, hi = torch.aminmax(t)
    if not bool((lo >= 0) & (hi <= 1)):
        return False
    return bool(((t == 0) | (t == 1)).all())


def transform_plan(base: Any) -> tuple[LeafPlan, ...]:
    """Per tensor of `base` (in `tensors` order), what a call may do to it. Reads every floating
    tensor once (is it a 0/1 mask?): compute it once per base and keep it.

    Tensors that share memory with another tensor of the input are left alone: a different
    transform of each would leave the buffers holding neither.
    """
    leaves = tensors(base)
    storages = [t.untyped_storage().data_ptr() if t.numel() else id(t) for t in leaves]
    plans = []
    for t, storage in zip(leaves, storages, strict=True):
        shared = storages.count(storage) > 1
        rows = t.shape[0] if t.dim() > 0 and not shared else 1
        scaled = not shared and t.dtype in SCALED_DTYPES and not _is_mask(t)
        plans.append(LeafPlan(rows, scaled))
    return tuple(plans)


_MASK64 = 2**64 - 1


def _splitmix64(state: int) -> tuple[int, int]:
    """(next state, 64 random bits): SplitMix64, a few integer operations (a seeded
    random.Random costs more per call than the rest of a fill)."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state, z ^ (z >> 31)


def draw_transform(draw: int, plan: tuple[LeafPlan, ...]) -> tuple[tuple[int, int], ...]:
    """(roll offset, scale step) per tensor, from the draw: the same in every process. The low 32
    bits of a tensor's 64 give its offset, the high ones its step (a bias of rows / 2**32 at most).

    >>> plan = (LeafPlan(5, True), LeafPlan(1, False))
    >>> draw_transform(7, plan) == draw_transform(7, plan), draw_transform(7, plan)[1]
    (True, (0, 0))
    >>> len({draw_transform(d, (LeafPlan(1, True),)) for d in range(2000)}) == len(SCALE_STEPS)
    True
    """
    state, out = draw, []
    for p in plan:
        state, bits = _splitmix64(state)
        out.append(((bits & 0xFFFFFFFF) % p.rows if p.rows > 1 else 0,
                    SCALE_STEPS[(bits >> 32) % len(SCALE_STEPS)] if p.scaled else 0))
    return tuple(out)


def _write(target: torch.Tensor, source: torch.Tensor, roll: int, step: int) -> None:
    """target = roll(source, roll, dim=0) * factor, as two slice writes (one read, one write)."""
    def put(dst: torch.Tensor, src: torch.Tensor) -> None:
        if step:
            torch.mul(src, scale_factor(step), out=dst)
        else:
            dst.copy_(src)

    if roll == 0:
        put(target, source)
        return
    n = source.shape[0]
    put(target[roll:], source[: n - roll])
    put(target[:roll], source[n - roll:])


def write_fresh(target: Any, base: Any, draw: int, plan: tuple[LeafPlan, ...] | None = None) -> None:
    """Write the values of `draw`'s transform of `base` into `target`'s tensors (same structure,
    shapes and dtypes; other buffers). `plan`: transform_plan(base), if kept."""
    apply_transform(target, base, draw_transform(draw, transform_plan(base) if plan is None else plan))


def apply_transform(target: Any, base: Any, transform: tuple[tuple[int, int], ...]) -> None:
    """Write `base` under `transform` (draw_transform's: a roll and a scale step per tensor) into
    `target`'s tensors."""
    write_leaves(tensors(target), tensors(base), transform)


def write_leaves(dst: list[torch.Tensor], src: list[torch.Tensor], transform: tuple[tuple[int, int], ...]) -> None:
    """apply_transform on the tensors of the input and of its base values (`tensors`), for a
    caller that keeps both lists (the feed: walking the input's structure cost more than the rest)."""
    if len(dst) != len(src) or len(src) != len(transform):
        raise ValueError(f"the input has {len(dst)} tensors, its base values {len(src)}, the transform {len(transform)}")
    with torch.no_grad():
        for t, s, (roll, step) in zip(dst, src, transform, strict=True):
            _write(t, s, roll, step)


def fresh_copy(base: Any, draw: int) -> Any:
    """A new input holding `draw`'s transform of `base` (the verifier's copy of a kept call's input)."""
    out = _map(base, lambda t: torch.empty_like(t))
    write_fresh(out, base, draw)
    return out


def _map(data: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, tuple):
        items = [_map(x, fn) for x in data]
        return type(data)(*items) if hasattr(data, "_fields") else tuple(items)
    if isinstance(data, list):
        return [_map(x, fn) for x in data]
    if isinstance(data, dict):
        return {k: _map(v, fn) for k, v in data.items()}
    return data
