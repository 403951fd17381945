"""The surrogate's prompt (method.md section 2): chat messages, never a measured runtime.

System message, in this order: role (a "GPU execution simulator" forecasting relative
speedup), the speedup definition, the bin table (from `models.bins`), probability guidance,
an analysis guide, the output format. User message: the task, the hardware table, the anchor
and the candidate (style "full": both sources, as the paper) or the anchor and a unified diff
to the candidate (style "diff": fewer tokens, for small models and CPU budgets), then a
one-line reminder of the output format (small models follow the last thing they read).

The logprob readout continues the assistant turn from `ANSWER_PREFIX`; the next token is the
bin label "1".."8".

>>> msgs = build_prompt("softmax", "Row softmax.", "a = 1\\n", "a = 2\\n", {"name": "NVIDIA H200"}, style="diff")
>>> [m["role"] for m in msgs], "+a = 2" in msgs[1]["content"]
(['system', 'user'], True)
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from models.bins import BIN_NAMES, BIN_RANGES, NUM_BINS
from models.hardware import hardware_table

PromptStyle = Literal["full", "diff"]
PROMPT_STYLES: tuple[str, ...] = ("full", "diff")
# Bump when the wording changes: cached forecasts and trained models are tied to a prompt.
PROMPT_VERSION = "1"

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


def _code(source: str) -> str:
    return "```python\n" + source.rstrip("\n") + "\n```"


def user_prompt(
    task_name: str,
    task_description: str,
    anchor_source: str,
    candidate_source: str,
    hardware: dict[str, Any],
    style: PromptStyle = "full",
) -> str:
    """The per-pair part: task, hardware, anchor, candidate (or diff), format reminder."""
    parts = [
        f"## Task: {task_name}\n{task_description.strip()}",
        "## Hardware\n" + hardware_table(hardware),
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
    style: PromptStyle = "full",
) -> list[dict[str, str]]:
    """Chat messages asking for a forecast of the candidate's speedup over the anchor.

    Args:
        task_name: e.g. "softmax".
        task_description: one paragraph on what the kernels compute.
        anchor_source: the anchor kernel's source.
        candidate_source: the candidate kernel's source.
        hardware: a profiling fingerprint or warehouse hardware row (`models.hardware`);
            only whitelisted device fields are shown, never timings.
        style: "full" (both sources) or "diff" (anchor + unified diff).
    Returns:
        [{"role": "system", ...}, {"role": "user", ...}].
    Raises:
        ValueError: an unknown style.
    """
    return [
        {"role": "system", "content": system_prompt()},
        {
            "role": "user",
            "content": user_prompt(
                task_name, task_description, anchor_source, candidate_source, hardware, style
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
