"""The surrogate's prompt (method.md section 2): chat messages, never a measured runtime.

System message, in this order: role (a "GPU execution simulator" forecasting relative
speedup), the speedup definition, the bin table (from `models.bins`), probability guidance,
an analysis guide, the output format. User message: the task, the hardware table, the anchor
and the candidate (style "full": both sources, as the paper) or the anchor and a unified diff
to the candidate (style "diff": fewer tokens, for small models and CPU budgets), then a
one-line reminder of the output format (small models follow the last thing they read).

Style "compact" is for CPU training and evaluation budgets, where every prompt token costs
(SmolLM2-135M on 2 CPU cores: a forward pass over the ~3,000-token "diff" prompt of a real
pair takes 15-45 s, so even a few training steps blow a 10-minute run). It keeps the role,
the speedup definition, the bin table and the output format (no probability or analysis
guide), the task's first sentence, the hardware on one line, and only a unified diff (1 line
of context) between the two sources with comments, docstrings and imports removed, cut after
`COMPACT_DIFF_LINES` lines: about 1,000 instead of 3,000 tokens (median over the committed
training pool). It sees less of each kernel, which is the price of fitting a CPU budget. A
model is trained and queried in one style.

The logprob readout continues the assistant turn from `ANSWER_PREFIX`; the next token is the
bin label "1".."8".

>>> msgs = build_prompt("softmax", "Row softmax.", "a = 1\\n", "a = 2\\n", {"name": "NVIDIA H200"}, style="diff")
>>> [m["role"] for m in msgs], "+a = 2" in msgs[1]["content"]
(['system', 'user'], True)
"""

from __future__ import annotations

import ast
import difflib
import functools
import io
import tokenize
from typing import Any

from models.bins import BIN_NAMES, BIN_RANGES, NUM_BINS
from models.hardware import hardware_table

PROMPT_STYLES: tuple[str, ...] = ("full", "diff", "compact")
# Diff lines the compact style keeps (hunk headers included): ~25 tokens each on Triton code.
COMPACT_DIFF_LINES = 24
# A style may carry "+features": the compile features of both kernels (registers, spills, shared
# memory, kernels and launches per call, for sm_90) and the task's benchmark shapes, between
# the hardware table and the kernels. Facts anyone has before running a kernel, never a runtime.
FEATURES_FLAG = "+features"
FEATURE_ROWS: tuple[tuple[str, str], ...] = (
    ("n_regs", "registers per thread"),
    ("n_spills", "spilled registers per thread"),
    ("shared_bytes", "shared memory per block (bytes)"),
    ("n_kernels", "Triton kernels compiled"),
    ("n_launches", "kernel launches per call"),
)

# The assistant turn of the logprob readout starts here; the next token is the bin label.
ANSWER_PREFIX = '{"predicted_bin": '
BIN_LABELS: tuple[str, ...] = tuple(str(b) for b in range(1, NUM_BINS + 1))

ROLE = (
    "You are a GPU execution simulator. Given two GPU kernels that compute the same task on "
    "the same hardware, an anchor and a candidate, you forecast how fast the candidate runs "
    "relative to the anchor, without running either. You answer with a probability "
    "distribution over eight speedup bins."
)

SPEEDUP_DEFINITION = (
    "## Speedup\n"
    "S = runtime(anchor) / runtime(candidate), on the hardware below, over the task's "
    "benchmark inputs (geometric mean). S > 1 means the candidate is faster; S < 1 means it "
    "is slower; S = 2 means twice as fast."
)

PROBABILITY_GUIDANCE = (
    "## Probabilities\n"
    "- p is a list of eight probabilities, one per bin in order 1..8, each in [0, 1], summing to 1.\n"
    "- Usually put most of the mass on one or two neighbouring bins.\n"
    "- Avoid certainty (a probability near 1) unless the evidence is decisive; spread mass "
    "when the change could go either way.\n"
    "- predicted_bin is the bin you think most likely."
)

ANALYSIS_GUIDE = (
    "## How to analyse\n"
    "Compare the two kernels on:\n"
    "- work: FLOPs and redundant computation;\n"
    "- memory traffic: bytes read and written, coalescing, reuse through caches and shared memory;\n"
    "- arithmetic intensity: is the kernel memory-bound or compute-bound on this device;\n"
    "- occupancy: registers, shared memory, block size, warps per SM;\n"
    "- parallelism: grid size against the SM count, load balance, tail effects;\n"
    "- synchronisation: barriers, atomics, serial loops;\n"
    "- launch overhead: number of kernel launches and host-side work;\n"
    "- vendor-library calls (cuBLAS, cuDNN) versus hand-written code;\n"
    "- data types and tensor cores: precision, tensor-core eligibility, conversions."
)

OUTPUT_FORMAT = (
    "## Output format\n"
    "Reason briefly, then end your answer with exactly one JSON object and nothing after it:\n"
    '{"predicted_bin": <integer 1-8>, "p": [p1, p2, p3, p4, p5, p6, p7, p8], '
    '"reasoning": "<one or two sentences>"}'
)

REMINDER = (
    'Answer with reasoning, then one JSON object {"predicted_bin": ..., "p": [eight numbers], '
    '"reasoning": "..."}.'
)


def bin_table() -> str:
    """The bin table the model is shown, from `models.bins` (the one place bins live).

    >>> bin_table().splitlines()[2]
    '| 1 | severe slowdown | S <= 0.25 |'
    """
    lines = ["| bin | name | S |", "|---|---|---|"]
    lines += [
        f"| {i + 1} | {name} | {rng} |"
        for i, (name, rng) in enumerate(zip(BIN_NAMES, BIN_RANGES, strict=True))
    ]
    return "\n".join(lines)


def system_prompt() -> str:
    """The fixed instructions: role, speedup, bins, probabilities, analysis guide, output format."""
    return "\n\n".join(
        [
            ROLE,
            SPEEDUP_DEFINITION,
            "## Bins\n" + bin_table(),
            PROBABILITY_GUIDANCE,
            ANALYSIS_GUIDE,
            OUTPUT_FORMAT,
        ]
    )


def compact_system_prompt() -> str:
    """The "compact" style's instructions: role, speedup, bins, output format (no guides)."""
    return "\n\n".join([ROLE, SPEEDUP_DEFINITION, "## Bins\n" + bin_table(), OUTPUT_FORMAT])


@functools.lru_cache(maxsize=4096)
def strip_comments(source: str) -> str:
    """Python source without comments, docstrings and blank lines (unchanged if unparsable).

    Kept for the sources last asked: a kernel is the anchor or the candidate of many pairs, and
    parsing and tokenizing one takes ~3 ms.

    >>> print(strip_comments("'Doc.'\\nx = 1  # one\\n\\n# alone\\ny = '#'\\n"), end="")
    x = 1
    y = '#'
    """
    try:
        tree = ast.parse(source)
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (SyntaxError, tokenize.TokenError, ValueError):
        return source
    lines = source.splitlines()
    drop: set[int] = set()  # 0-based line numbers of docstrings
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body:
            first = body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                drop.update(range(first.lineno - 1, (first.end_lineno or first.lineno)))
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col].rstrip()
    kept = [line for i, line in enumerate(lines) if i not in drop and line.strip()]
    return "\n".join(kept) + "\n"


def hardware_line(hardware: dict[str, Any]) -> str:
    """The hardware table's rows on one line ("device NVIDIA H200; SM count 132; ...").

    >>> hardware_line({"device_name": "NVIDIA H200", "sm_count": 132})
    'device NVIDIA H200; SM count 132; memory bandwidth 4.8 TB/s (datasheet)'
    """
    rows = hardware_table(hardware).splitlines()[2:]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    return "; ".join(f"{c[0]} {c[1]}" for c in cells if len(c) >= 2) or "unknown device"


def compact_diff(anchor_source: str, candidate_source: str, max_lines: int = COMPACT_DIFF_LINES) -> str:
    """Unified diff (1 line of context) of the comment-free sources, cut after `max_lines`.

    >>> print(compact_diff("x = 1  # a\\ny = 2\\n", "x = 1\\ny = 3\\n"), end="")
    @@ -1,2 +1,2 @@
     x = 1
    -y = 2
    +y = 3
    """
    def code(source: str) -> str:
        kept = strip_comments(source).splitlines(keepends=True)
        return "".join(line for line in kept if not line.startswith(("import ", "from ")))

    diff = unified_diff(code(anchor_source), code(candidate_source), context=1)
    lines = [line for line in diff.splitlines() if not line.startswith(("--- ", "+++ "))]
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more diff lines)"]
    return "\n".join(lines) + "\n"


def unified_diff(anchor_source: str, candidate_source: str, context: int = 3) -> str:
    """Unified diff from the anchor to the candidate source.

    >>> print(unified_diff("x = 1\\ny = 2\\n", "x = 1\\ny = 3\\n"), end="")
    --- anchor.py
    +++ candidate.py
    @@ -1,2 +1,2 @@
     x = 1
    -y = 2
    +y = 3
    """
    lines = difflib.unified_diff(
        anchor_source.splitlines(keepends=True),
        candidate_source.splitlines(keepends=True),
        fromfile="anchor.py",
        tofile="candidate.py",
        n=context,
    )
    # A last line without a newline would glue onto the next diff line.
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    return text or "(no differences)\n"


def split_style(style: str) -> tuple[str, bool]:
    """(base style, whether compile features are shown) of a style name.

    >>> split_style("full+features"), split_style("compact")
    (('full', True), ('compact', False))
    """
    base, flag = (style[: -len(FEATURES_FLAG)], True) if style.endswith(FEATURES_FLAG) else (style, False)
    if base not in PROMPT_STYLES:
        raise ValueError(f"unknown prompt style {style!r}; use one of {PROMPT_STYLES}, optionally + {FEATURES_FLAG!r}")
    return base, flag


def _feature_value(features: dict[str, Any] | None, key: str) -> str:
    value = (features or {}).get(key)
    if value is None or (isinstance(value, float) and value != value):
        return "n/a"
    return str(int(value)) if isinstance(value, (int, float)) else str(value)


def facts_section(benchmark_cases: Any, anchor_features: dict[str, Any] | None,
                  candidate_features: dict[str, Any] | None) -> str:
    """The "+features" block: benchmark shapes, then a table of both kernels' compile features.

    >>> print(facts_section([{"M": 8, "N": 4, "seed": 1}], None, {"n_regs": 32}).splitlines()[1])
    Benchmark inputs (S is the geometric mean over them): M=8 N=4
    """
    shapes = "; ".join(" ".join(f"{k}={v}" for k, v in case.items() if k != "seed")
                       for case in (benchmark_cases or ()))
    lines = ["## Static facts (no kernel was run)"]
    if shapes:
        lines.append(f"Benchmark inputs (S is the geometric mean over them): {shapes}")
    lines += ["", "| compile feature (sm_90) | anchor | candidate |", "|---|---|---|"]
    lines += [f"| {label} | {_feature_value(anchor_features, key)} | {_feature_value(candidate_features, key)} |"
              for key, label in FEATURE_ROWS]
    return "\n".join(lines)


def _code(source: str) -> str:
    return "```python\n" + source.rstrip("\n") + "\n```"


def user_prompt(
    task_name: str,
    task_description: str,
    anchor_source: str,
    candidate_source: str,
    hardware: dict[str, Any],
    style: str = "full",
    facts: str | None = None,
) -> str:
    """The per-pair part: task, hardware, [static facts], anchor, candidate (or diff), reminder."""
    style, _ = split_style(style)
    extra = [facts] if facts else []
    if style == "compact":
        first = task_description.strip().split(". ")[0].rstrip(".") + "."
        return "\n\n".join(
            [
                f"## Task: {task_name}\n{first}",
                "## Hardware\n" + hardware_line(hardware),
                *extra,
                "## Change from the anchor to the candidate (unified diff, comments removed)\n"
                "```diff\n" + compact_diff(anchor_source, candidate_source) + "```",
                REMINDER,
            ]
        )
    parts = [
        f"## Task: {task_name}\n{task_description.strip()}",
        "## Hardware\n" + hardware_table(hardware),
        *extra,
        "## Anchor kernel\n" + _code(anchor_source),
    ]
    if style == "full":
        parts.append("## Candidate kernel\n" + _code(candidate_source))
    elif style == "diff":
        parts.append(
            "## Candidate kernel (unified diff against the anchor)\n```diff\n"
            + unified_diff(anchor_source, candidate_source)
            + "```"
        )
    else:
        raise ValueError(f"unknown prompt style {style!r}; use one of {PROMPT_STYLES}")
    parts.append(REMINDER)
    return "\n\n".join(parts)


def build_prompt(
    task_name: str,
    task_description: str,
    anchor_source: str,
    candidate_source: str,
    hardware: dict[str, Any],
    style: str = "full",
    *,
    benchmark_cases: Any = None,
    anchor_features: dict[str, Any] | None = None,
    candidate_features: dict[str, Any] | None = None,
) -> list[dict[str, str]]:
    """Chat messages asking for a forecast of the candidate's speedup over the anchor.

    Args:
        task_name: e.g. "softmax".
        task_description: one paragraph on what the kernels compute.
        anchor_source: the anchor kernel's source.
        candidate_source: the candidate kernel's source.
        hardware: a profiling fingerprint or warehouse hardware row (`models.hardware`);
            only whitelisted device fields are shown, never timings.
        style: "full" (both sources), "diff" (anchor + unified diff) or "compact" (short
            instructions + comment-free diff only; CPU budgets); any of them + "+features"
            adds the static facts block (`facts_section`).
        benchmark_cases: the task's benchmark cases (shown with "+features").
        anchor_features: the anchor's compile features (shown with "+features"; n/a if None).
        candidate_features: the candidate's compile features (likewise).
    Returns:
        [{"role": "system", ...}, {"role": "user", ...}].
    Raises:
        ValueError: an unknown style.
    """
    base, with_features = split_style(style)
    facts = facts_section(benchmark_cases, anchor_features, candidate_features) if with_features else None
    return [
        {"role": "system", "content": compact_system_prompt() if base == "compact" else system_prompt()},
        {
            "role": "user",
            "content": user_prompt(
                task_name, task_description, anchor_source, candidate_source, hardware, base, facts
            ),
        },
    ]


def with_answer_prefix(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The messages plus a partial assistant turn holding `ANSWER_PREFIX` (logprob readout).

    Servers that continue a final assistant message (vLLM: continue_final_message=True,
    add_generation_prompt=False) then give the bin label as the next token.

    >>> with_answer_prefix([{"role": "user", "content": "q"}])[-1]
    {'role': 'assistant', 'content': '{"predicted_bin": '}
    """
    return [*messages, {"role": "assistant", "content": ANSWER_PREFIX}]
