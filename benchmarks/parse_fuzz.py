"""Fuzz benchmark of the answer parser (models.parsing): crashes, outcomes and time against length.

    python3 -m benchmarks.parse_fuzz [--n 10000] [--seed 0] [--max-chars 8000] [--json]

The model answers it parses come from here too: `answers(n, seed)` yields (kind, text, expected bin or None), deterministic by seed; the kinds mix
what a sampled LM writes (an answer in prose, fenced, with braces and quotes in its reasoning),
what goes wrong (truncation, corrupted characters, wrong types and ranges) and inputs built to
make a naive scanner slow (`hostile`: nested unclosed objects, runs of braces, open strings),
and noise. tests/models/test_parse_fuzz.py asserts on them.

The benchmark parses `--n` answers, counts crashes (an exception, or a failure the parser reports
as unexpected), prints the parse outcome by kind, the time per answer and per KB in length
quartiles (a parser linear in the answer's length has the same time per KB in every quartile;
it prints the ratio of the longest quartile's to the shortest's), and the time per character of
each hostile input at 20k, 80k and 320k characters (flat rows: linear).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Iterator

import numpy as np

from models.parsing import parse_forecast

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


def hostile(kind: str, n: int) -> str:
    """One of the HOSTILE inputs, about `n` characters long."""
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
            yield "hostile", hostile(rng.choice(HOSTILE), rng.randint(10, max_chars)), None
        else:
            alphabet = "{}[]\":,0123456789.eE-+ \n\\abtnufl\u2028\ud83d"
            yield "noise", "".join(rng.choice(alphabet) for _ in range(rng.randint(0, max_chars))), None


def fuzz(n: int, seed: int, max_chars: int) -> dict:
    """Parse `n` generated answers, each timed: crashes, outcomes by kind, lengths and seconds."""
    crashes, by_kind, lengths, seconds = [], {}, [], []
    for kind, text, expected in answers(n, seed=seed, max_chars=max_chars):
        t0 = time.perf_counter()
        try:
            f = parse_forecast(text)
        except Exception as e:  # noqa: BLE001 - counted, it is what we measure
            crashes.append(f"{kind}: {type(e).__name__}: {e}")
            continue
        dt = time.perf_counter() - t0
        if not f.parse_ok and "unexpected parse error" in (f.parse_error or ""):
            crashes.append(f"{kind}: {f.parse_error}")
        k = by_kind.setdefault(kind, {"n": 0, "parsed": 0, "right_bin": 0})
        k["n"] += 1
        k["parsed"] += int(f.parse_ok)
        k["right_bin"] += int(expected is not None and f.parse_ok and f.predicted_bin == expected)
        lengths.append(len(text))
        seconds.append(dt)
    return {"crashes": crashes, "by_kind": by_kind, "lengths": lengths, "seconds": seconds}


def length_buckets(lengths: list[int], seconds: list[float]) -> list[dict]:
    """Time per answer and per KB in the four length quartiles."""
    x, y = np.asarray(lengths, float), np.asarray(seconds, float)
    edges = np.quantile(x, [0, 0.25, 0.5, 0.75, 1.0])
    buckets = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (x >= lo) & (x <= hi)
        buckets.append({"chars": [int(lo), int(hi)], "answers": int(m.sum()), "us_per_answer": float(y[m].mean() * 1e6),
                        "us_per_kb": float((y[m].sum() / max(x[m].sum(), 1)) * 1e6 * 1024)})
    return buckets


def hostile_ns_per_char() -> dict[str, dict[int, float]]:
    """ns per character of each hostile input at 20k, 80k and 320k characters."""
    out = {}
    for kind in HOSTILE:
        row = {}
        for n in (20_000, 80_000, 320_000):
            text = hostile(kind, n)
            t0 = time.perf_counter()
            parse_forecast(text)
            row[n] = (time.perf_counter() - t0) / len(text) * 1e9
        out[kind] = row
    return out


def _print(report: dict) -> None:
    print(f"{report['answers']} answers, {report['crashes']} crashes")
    print(f"{'kind':16s} {'n':>6s} {'parsed':>7s} {'right bin':>9s}")
    for kind, k in sorted(report["by_kind"].items()):
        print(f"{kind:16s} {k['n']:6d} {k['parsed']:7d} {k['right_bin']:9d}")
    print(f"time per KB, longest quartile over shortest: {report['us_per_kb_longest_over_shortest']:.2f} (1: linear)")
    for b in report["buckets"]:
        print(f"  {b['chars'][0]:6d}-{b['chars'][1]:6d} chars: {b['answers']:5d} answers, "
              f"{b['us_per_answer']:8.1f} us/answer, {b['us_per_kb']:6.2f} us/KB")
    print("hostile inputs, ns per char at 20k / 80k / 320k chars:")
    for kind, row in report["hostile_ns_per_char"].items():
        print(f"  {kind:16s} " + " / ".join(f"{v:6.1f}" for v in row.values()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-chars", type=int, default=8000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    run = fuzz(args.n, args.seed, args.max_chars)
    crashes = run["crashes"]
    buckets = length_buckets(run["lengths"], run["seconds"])
    report = {"answers": len(run["lengths"]) + len(crashes), "crashes": len(crashes), "crash_examples": crashes[:5],
              "by_kind": run["by_kind"],
              "us_per_kb_longest_over_shortest": buckets[-1]["us_per_kb"] / buckets[0]["us_per_kb"],
              "buckets": buckets, "hostile_ns_per_char": hostile_ns_per_char()}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
