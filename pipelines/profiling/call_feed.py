"""The Feed: the input values of each timed call and the sample of outputs kept for the verifier.

Every timed call of a case runs on values no earlier call of the case had, written into the same
buffers outside the timed window (fresh_values.py), so an answer kept from an earlier call is never
right again; after each call a draw from the operating system's CSPRNG decides whether its output is
kept (reservoir sampling no kernel can seed or predict), with the salt and draw that rebuild its input
(runner.Measurer ships them to the verifier). A module of its own because every timed loop (CUDA,
GPU MODE, CPU) and the Measurer use it; it is harness code a kernel could patch, so the integrity
watch covers it (integrity.HARNESS_MODULES).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pipelines.profiling.fresh_values import (
    DRAW_BITS,
    draw_transform,
    tensors,
    transform_plan,
    write_leaves,
)
from pipelines.profiling.timing import Steps, keep_output

# an input whose only tensors cannot be rolled or scaled (a single row of integers) has few.
FRESH_TRIES = 64


@dataclass(frozen=True)
class KeptOutput:
    """An output of a call kept for the verifier, with what rebuilds the call's input: the salt of
    its base values and the draw of its transform (fresh_values.py; None: the base values as they are)."""

    salt: int
    draw: int | None
    output: Any


class Feed:
    """The inputs of one case's calls and the outputs kept for the verifier.

    Args:
        data: the buffers every call runs on (the same objects each call).
        variant: salt -> the case's base values for that salt (read, never handed to the kernel).
        salts: the salts the calls take their base values from, in turn (in a random order). Before
            each call a transform is drawn from the OS CSPRNG, one no earlier call of the feed had,
            and the base values under it are written into `data`, outside any timed window
            (fresh_values.py): every call runs on values of its own, so an answer kept from an
            earlier call (by address, shape, some values or all of them) is never right again. An
            empty tuple keeps the values as they are.
        keep: how many outputs to keep: a uniform sample of all calls made through the feed,
            drawn after each call (reservoir sampling with the OS CSPRNG, which no kernel can
            seed or predict); each kept output is cloned then (so a buffer the kernel reuses
            cannot change it later). Where `keep` is at least the number of salts, the sample
            covers every salt: keep // len(salts) outputs of each salt's calls (a reservoir per
            salt). With one sample for two variants, a kernel right on one variant's values and
            just past the tolerance on the other's is `ok` or `incorrect` on the draw; covered,
            it is the same every time.
        device: "cuda" | "cpu".
    """

    def __init__(self, data: Any, variant: Callable[[int], Any] | None = None, salts: tuple[int, ...] = (),
                 keep: int = 0, device: str = "cpu"):
        self.data, self.variant, self.salts, self.keep, self.device = data, variant, tuple(salts), keep, device
        self.calls = 0
        self.salt = 0
        self.draw: int | None = None  # the transform of the values now in `data`
        self._rng = secrets.SystemRandom()
        # The salts in a random order, taken in turn.
        self._order = list(self.salts)
        self._rng.shuffle(self._order)
        self._filled = 0
        self._leaves = tensors(data) if variant is not None else []
        # salt -> (its base values' tensors, fresh_values.transform_plan of them)
        self._plans: dict[int, tuple[list, tuple]] = {}
        self._used: set[tuple] = set()  # (salt, transform) of every call so far
        # reservoir key -> [calls seen, [KeptOutput]]: one per salt where the sample covers the salts
        self.per_salt = keep // len(self.salts) if self.salts and variant is not None and keep >= len(self.salts) else 0
        self._reservoirs: dict[int | None, list] = {}

    @property
    def kept(self) -> list[KeptOutput]:
        """The kept outputs, the salts' in salt order."""
        return [k for key in sorted(self._reservoirs, key=lambda k: -1 if k is None else k)
                for k in self._reservoirs[key][1]]

    def take_kept(self) -> list[KeptOutput]:
        """The kept outputs, handed over: the feed keeps no reference to them."""
        kept, self._reservoirs = self.kept, {}
        return kept

    def prepare(self) -> None:
        """Read each salt's base values once for what a transform may do to them (a pass over
        them and a synchronisation), before any call: done inside the first calls, it would
        lengthen the warm-up calls the timed loop sizes its chunks by."""
        if self.variant is not None:
            for salt in self.salts:
                self._plan(salt)

    def _plan(self, salt: int) -> tuple[list, tuple]:
        """(the tensors of `salt`'s base values, their transform plan), computed once: the feed
        holds the base values for the case's calls from then on."""
        if salt not in self._plans:
            base = self.variant(salt)
            self._plans[salt] = (tensors(base), transform_plan(base))
        return self._plans[salt]

    def fill(self, salt: int | None = None) -> Any:
        """The input of the next call: new values from the next salt's base values (or `salt`'s)
        under a transform drawn now, written into the same buffers."""
        if self._order and self.variant is not None:
            if salt is None:
                salt = self._order[self._filled % len(self._order)]
                self._filled += 1
            base_leaves, plan = self._plan(salt)
            self.salt = salt
            self.draw, transform = self._fresh_draw(salt, plan)
            write_leaves(self._leaves, base_leaves, transform)
        return self.data

    def _fresh_draw(self, salt: int, plan: tuple) -> tuple[int, tuple]:
        """A draw whose transform of `salt`'s values no earlier call of the feed had, and that transform."""
        for _ in range(FRESH_TRIES):
            draw = self._rng.getrandbits(DRAW_BITS)
            transform = draw_transform(draw, plan)
            if (salt, transform) not in self._used:
                break
        self._used.add((salt, transform))
        return draw, transform

    def short_salt(self) -> int | None:
        """A salt whose share of the sample is not yet kept (None when the sample is complete):
        where a case made fewer calls than the outputs it keeps (a slow kernel makes four)."""
        if self.keep <= 0:
            return None
        if self.per_salt:
            return next((s for s in sorted(self.salts) if len(self._reservoirs.get(s, (0, []))[1]) < self.per_salt), None)
        if len(self._reservoirs.get(None, (0, []))[1]) < self.keep:
            return self._order[self._filled % len(self._order)] if self._order else self.salt
        return None

    def took(self, out: Any) -> None:
        """After a call: keep its output with probability keep / calls of its reservoir (replacing a kept one)."""
        self.calls += 1
        if self.keep <= 0:
            return
        key, keep = (self.salt, self.per_salt) if self.per_salt else (None, self.keep)
        seen, kept = self._reservoirs.setdefault(key, [0, []])
        seen += 1
        self._reservoirs[key][0] = seen
        if len(kept) < keep:
            slot = len(kept)
            kept.append(None)
        else:
            slot = self._rng.randrange(seen)
            if slot >= keep:
                return
        if self.device == "cuda":
            torch.cuda.synchronize()  # the output is complete before it is copied
        kept[slot] = KeptOutput(self.salt, self.draw, keep_output(out))


def top_up_steps(feed: Feed) -> Steps:
    """Untimed calls, through the same call site, until the feed holds every output the
    verifier's plan asks of the case (verify.timed_draws): without them an honest kernel whose
    case made fewer calls than outputs to keep (many variants, a slow kernel) would be short of
    verdicts, and so `tampered`. Each output is kept (its reservoir is short), and `Feed.took`
    synchronises before it copies one."""
    while (salt := feed.short_salt()) is not None:
        out = yield feed.fill(salt)
        feed.took(out)
        del out


def plain_feed(data: Any) -> Feed:
    """A feed that hands out `data` as it is and keeps nothing (the reference, tests)."""
    return Feed(data)
