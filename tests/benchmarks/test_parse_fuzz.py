"""Fuzzing the answer parser: 10,000 model answers, no crash, time linear in the answer's length."""

from __future__ import annotations

import time

import pytest

from benchmarks.parse_fuzz import HOSTILE, answers, hostile
from models.parsing import parse_forecast


def test_ten_thousand_answers_parse_or_fail_cleanly():
    counts: dict[str, int] = {}
    for kind, text, expected in answers(10_000, seed=1, max_chars=1500):
        f = parse_forecast(text)  # never raises: a crash fails the test here
        counts[kind] = counts.get(kind, 0) + 1
        assert f.parse_ok or (f.parse_error and "\n" not in f.parse_error)
        assert "unexpected parse error" not in (f.parse_error or ""), f"{kind}: {f.parse_error}"
        if expected is not None:
            assert f.parse_ok and f.predicted_bin == expected, f"{kind}: {f.parse_error} in {text[-300:]!r}"
        elif kind in ("truncated", "invalid_fields", "hostile"):
            assert not f.parse_ok, f"{kind} parsed: {text[-200:]!r}"
    assert sum(counts.values()) == 10_000 and len(counts) == 8  # every kind of answer came up


@pytest.mark.parametrize("kind", HOSTILE)
def test_parse_time_grows_linearly_with_length(kind):
    def per_char(n: int) -> float:
        text = hostile(kind, n)
        best = min(_timed(text) for _ in range(3))
        return best / len(text)

    small, large = per_char(20_000), per_char(160_000)  # 8x longer
    assert large < 3 * small + 2e-8, f"{kind}: {small * 1e9:.1f} ns/char at 20k, {large * 1e9:.1f} at 160k"


def _timed(text: str) -> float:
    # CPU time of this process, not the wall clock: beside other test processes on shared cores
    # a parse may wait for a core, which says nothing about how its cost grows with length.
    t0 = time.process_time()
    parse_forecast(text)
    return time.process_time() - t0
