"""Model answers for fuzzing models.parsing: realistic, broken and hostile, deterministic by seed.

`answers(n, seed)` yields (kind, text, expected bin or None); the kinds mix what a sampled LM
writes (an answer in prose, fenced, with braces and quotes in its reasoning), what goes wrong
(truncation, corrupted characters, wrong types and ranges) and inputs built to make a naive
scanner slow (nested unclosed objects, runs of braces, open strings). Used by
tests/test_parse_fuzz.py and scripts/parse_fuzz_bench.py.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

PROSE = ("The fused kernel reads each row once", "so it should be faster {roughly 2x}", "the anchor uses three passes",
         "I'd say \"maybe\" here", "bandwidth-bound: 4 B/elt vs 20", "tl.dot on bf16 tiles", "{not json}",
         "the mask is 0/1", "über-fast → 3×", "see ```python\ncode\n```")
HOSTILE = ("nested_unclosed", "brace_run", "open_strings", "deep_array", "balanced_keys", "quote_storm")


def _p(rng: random.Random) -> list[float]:
    raw = [rng.random() ** 3 for _ in range(8)]
    total = sum(raw)
    return [round(x / total, 4) for x in raw]


def _answer(rng: random.Random, bin_: int) -> str:
    obj = {"predicted_bin": bin_, "p": _p(rng), "reasoning": rng.choice(PROSE)}
    if rng.random() < 0.3:
        obj = {"reasoning": obj.pop("reasoning"), **obj}  # key order varies
    return json.dumps(obj, ensure_ascii=rng.random() < 0.5)


def _prose(rng: random.Random, n_chars: int) -> str:
    out, size = [], 0
    while size < n_chars:
        s = rng.choice(PROSE)
        out.append(s)
        size += len(s) + 1
    return " ".join(out)


def _hostile(kind: str, n: int) -> str:
    if kind == "nested_unclosed":
        return '{"k": [' * (n // 7)
    if kind == "brace_run":
        return "{" * n
    if kind == "open_strings":
        return '{"a": "' * (n // 7)
    if kind == "deep_array":
        return '{"p": ' + "[" * (n - 6)
    if kind == "balanced_keys":
        return '{"a" ' * (n // 10) + "}" * (n // 10)
    return '{"' * (n // 2)  # quote_storm


def hostile(kind: str, n_chars: int) -> str:
    """One of the HOSTILE inputs, about `n_chars` long."""
    return _hostile(kind, n_chars)


def answers(n: int, seed: int = 0, max_chars: int = 4000) -> Iterator[tuple[str, str, int | None]]:
    """`n` (kind, text, expected predicted_bin or None when it must not parse as that bin)."""
    rng = random.Random(seed)
    for _ in range(n):
        roll = rng.random()
        bin_ = rng.randint(1, 8)
        body = _answer(rng, bin_)
        before = _prose(rng, rng.randint(0, max_chars // 2))
        after = _prose(rng, rng.randint(0, max_chars // 8)) if rng.random() < 0.5 else ""
        if roll < 0.30:
            yield "valid", f"{before} {body} {after}", bin_
        elif roll < 0.45:
            yield "fenced", f"{before}\n```json\n{body}\n```\n{after}", bin_
        elif roll < 0.55:
            earlier = _answer(rng, 9 - bin_)
            yield "two_answers", f"{before} {earlier} then on reflection {body} {{}}", bin_
        elif roll < 0.65:
            cut = rng.randint(0, max(0, len(body) - 1))
            yield "truncated", f"{before} {body[:cut]}", None
        elif roll < 0.75:
            chars = list(f"{before} {body} {after}")
            for _ in range(rng.randint(1, 12)):
                i = rng.randrange(len(chars))
                chars[i] = rng.choice(['{', '}', '"', "\\", ",", "]", "\x00", "\ud800", "é", "9"])
            yield "corrupted", "".join(chars), None
        elif roll < 0.85:
            bad = rng.choice([
                {"predicted_bin": rng.choice([0, 9, 2.5, "3", True, None, 1e999]), "p": _p(rng)},
                {"predicted_bin": bin_, "p": _p(rng)[: rng.randint(0, 7)]},
                {"predicted_bin": bin_, "p": [rng.choice([-0.1, 1.5, "x", None]) for _ in range(8)]},
                {"predicted_bin": bin_, "p": [0] * 8},
                {"predicted_bin": bin_},
                {"p": _p(rng)},
            ])
            yield "invalid_fields", f"{before} {json.dumps(bad)}", None
        elif roll < 0.95:
            yield "hostile", _hostile(rng.choice(HOSTILE), rng.randint(10, max_chars)), None
        else:
            alphabet = "{}[]\":,0123456789.eE-+ \n\\abtnufl\u2028\ud83d"
            yield "noise", "".join(rng.choice(alphabet) for _ in range(rng.randint(0, max_chars))), None
