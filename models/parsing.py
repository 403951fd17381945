"""Read the verbalized answer: the last JSON object of a completion becomes a Forecast.

The contract (method.md section 2): find the last JSON object, fenced (```json) or bare,
even with nested braces, strings holding braces and trailing text; validate it;
`predicted_bin` is an integer 1..8 and is kept as stated (the argmax is recorded beside it);
`p` is a list of eight numbers, each in [0, 1], not all zero; `p` is ALWAYS renormalised and
its raw sum kept. Anything else is a recorded failure with a one-line reason: this module
never raises on model output.

"Last" means the last top-level object that looks like an answer (has "predicted_bin" or
"p"), so a trailing unrelated object such as `{}` in a sign-off does not hide the answer;
when no object looks like an answer, the last object is validated and its missing key is
the reported reason.

>>> f = parse_forecast('I think 5. {"predicted_bin": 5, "p": [0,0,0,0.1,0.6,0.3,0,0], "reasoning": "ok"}')
>>> f.parse_ok, f.predicted_bin, f.p[4]
(True, 5, 0.6)
>>> parse_forecast('no json here').parse_error
'no JSON object found'
"""

from __future__ import annotations

import json
import math
from typing import Any

from models.bins import NUM_BINS
from models.forecast import Forecast

_DECODER = json.JSONDecoder()
_ANSWER_KEYS = ("predicted_bin", "p")
# Written probabilities may overshoot 1 by float formatting (e.g. 1.0000000001); more is an error.
_P_SLACK = 1e-9


MAX_CANDIDATE_DEPTH = 16  # balanced {...} regions nested deeper than this are not decoded on their own


def _balanced_spans(text: str, strings: bool) -> list[tuple[int, int, int]]:
    """(start, end, depth) of every balanced {...} region, in order of start, in one pass.

    With `strings`, braces inside JSON strings do not count (quotes open strings only inside
    braces: prose quotes are not JSON); without, every brace counts, which finds the regions a
    stray quote in prose would hide. `depth` counts the balanced regions around this one.
    """
    spans: list[tuple[int, int]] = []
    stack: list[int] = []
    in_string = escaped = False
    for i, ch in enumerate(text):
        if not strings:
            if ch == "{":
                stack.append(i)
            elif ch == "}" and stack:
                spans.append((stack.pop(), i))
        elif in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"' and stack:
            in_string = True
        elif ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            spans.append((stack.pop(), i))
    spans.sort()
    out, open_ends = [], []
    for start, end in spans:
        while open_ends and open_ends[-1] < start:
            open_ends.pop()
        out.append((start, end, len(open_ends)))
        open_ends.append(end)
    return out


def _may_open_object(text: str, i: int) -> bool:
    """A JSON object's first token after '{' is a string or '}': anything else cannot decode."""
    j = i + 1
    while j < len(text) and text[j] in " \t\r\n":
        j += 1
    return j < len(text) and text[j] in '"}'


def _decode(text: str, start: int, end: int) -> tuple[Any, int] | None:
    """The JSON value of text[start:end] (a slice, so a failure costs its length, not its
    position in a long text) and where it ends; None if it does not decode."""
    try:
        obj, stop = _DECODER.raw_decode(text[start:end])
    except (ValueError, RecursionError):
        return None
    return obj, start + stop


def json_objects(text: str) -> list[dict[str, Any]]:
    """Every top-level JSON object in free text, in order of appearance.

    Objects nested inside an earlier object are part of it, not separate hits. Fences
    (```json ... ```) need no special case: their content is a bare object. Time is linear in
    the text's length: two passes find the balanced {...} regions (one minding JSON strings, one
    counting every brace, so a stray quote in prose hides nothing), and each region that can
    open an object is decoded once, up to MAX_CANDIDATE_DEPTH regions deep.

    Args:
        text: any string.
    Returns:
        The decoded objects (dicts), possibly empty.

    >>> json_objects('a {"x": {"y": 1}} b ```json\\n{"z": "}"}\\n``` c {bad')
    [{'x': {'y': 1}}, {'z': '}'}]
    >>> [o["n"] for o in json_objects('he wrote {"oops} and then {"n": 1}')]
    [1]
    """
    spans = {(a, b): d for a, b, d in _balanced_spans(text, strings=True)}
    for a, b, d in _balanced_spans(text, strings=False):
        spans.setdefault((a, b), d)
    found: list[dict[str, Any]] = []
    covered = -1  # end of the last decoded object: regions inside it are part of it
    for (start, end), depth in sorted(spans.items()):
        if start <= covered or depth > MAX_CANDIDATE_DEPTH or not _may_open_object(text, start):
            continue
        hit = _decode(text, start, end + 1)
        if hit is not None and isinstance(hit[0], dict):
            found.append(hit[0])
            covered = hit[1] - 1
    return found


def _number(value: Any) -> float | None:
    """A JSON number as float; None for bools, strings, null and containers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def validate_answer(obj: dict[str, Any], text: str | None = None) -> Forecast:
    """Validate one decoded answer object and build the Forecast (or a recorded failure).

    Args:
        obj: the decoded JSON object.
        text: the completion it came from, kept on the Forecast.
    Returns:
        A Forecast; parse_ok False with a one-line reason when a rule is broken.

    >>> validate_answer({"predicted_bin": 9, "p": [0.125] * 8}).parse_error
    'predicted_bin 9 outside 1..8'
    """
    for key in _ANSWER_KEYS:
        if key not in obj:
            return Forecast.failure(f"missing key {key!r}", text=text)
    stated = _number(obj["predicted_bin"])
    if stated is None or not math.isfinite(stated) or stated != int(stated):
        return Forecast.failure(
            f"predicted_bin is not an integer: {obj['predicted_bin']!r:.40}", text=text
        )
    if not 1 <= int(stated) <= NUM_BINS:
        return Forecast.failure(f"predicted_bin {int(stated)} outside 1..{NUM_BINS}", text=text)
    raw = obj["p"]
    if not isinstance(raw, list):
        return Forecast.failure(f"p is not a list: {type(raw).__name__}", text=text)
    if len(raw) != NUM_BINS:
        return Forecast.failure(f"p has {len(raw)} entries, expected {NUM_BINS}", text=text)
    values: list[float] = []
    for i, item in enumerate(raw):
        v = _number(item)
        if v is None:
            return Forecast.failure(f"p[{i}] is not a number: {item!r:.40}", text=text)
        if not math.isfinite(v):
            return Forecast.failure(f"p[{i}] is not finite: {v}", text=text)
        if v < 0 or v > 1 + _P_SLACK:
            return Forecast.failure(f"p[{i}] = {v:g} outside [0, 1]", text=text)
        values.append(min(v, 1.0))
    if math.fsum(values) <= 0:
        return Forecast.failure("p is all zeros", text=text)
    return Forecast.from_probabilities(values, predicted_bin=int(stated), text=text)


def parse_forecast(text: str) -> Forecast:
    """Parse a verbalized answer into a Forecast; never raises.

    Args:
        text: the completion (reasoning, then one JSON object).
    Returns:
        A parsed Forecast, or a failure with a one-line `parse_error`.

    >>> parse_forecast('{"predicted_bin": 2, "p": [0, 1, 0, 0, 0, 0, 0, 0]} then '
    ...                '{"predicted_bin": 3, "p": [0, 0, 0.5, 0, 0, 0, 0, 0]}').p[2]  # last wins
    1.0
    >>> parse_forecast('{"predicted_bin": 3, "p": [0.1, 0.2]}').parse_error
    'p has 2 entries, expected 8'
    """
    try:
        if not isinstance(text, str):
            return Forecast.failure(f"completion is not text: {type(text).__name__}")
        objects = json_objects(text)
        if not objects:
            return Forecast.failure("no JSON object found", text=text)
        answers = [o for o in objects if any(k in o for k in _ANSWER_KEYS)]
        return validate_answer((answers or objects)[-1], text=text)
    except Exception as exc:  # noqa: BLE001 - model output must never crash a run; record why
        return Forecast.failure(f"unexpected parse error: {type(exc).__name__}: {exc}", text=text)


def answer_json_schema(reasoning_max_chars: int = 400) -> dict[str, Any]:
    """JSON schema of the verbalized answer (method.md section 2), flat, no $ref.

    >>> s = answer_json_schema(100)
    >>> s["required"], s["properties"]["p"]["minItems"], s["properties"]["reasoning"]["maxLength"]
    (['predicted_bin', 'p', 'reasoning'], 8, 100)
    """
    return {
        "type": "object",
        "properties": {
            "predicted_bin": {"type": "integer", "minimum": 1, "maximum": NUM_BINS},
            "p": {
                "type": "array",
                "items": {"type": "number", "minimum": 0, "maximum": 1},
                "minItems": NUM_BINS,
                "maxItems": NUM_BINS,
            },
            "reasoning": {"type": "string", "maxLength": int(reasoning_max_chars)},
        },
        "required": ["predicted_bin", "p", "reasoning"],
        "additionalProperties": False,
    }
