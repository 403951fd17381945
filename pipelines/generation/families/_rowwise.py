"""Shared pieces of the row-wise kernel families (softmax, rms_norm, layer_norm, fp8_quant).

Each family renders a standalone Triton module in tutorial order:

    docstring (task, algorithm, what this variant changes, knob values)
    imports
    knob constants (the UPPER_CASE knobs, so every point of the space renders distinctly)
    ruled sections: helpers, compute kernel(s), launcher `custom_kernel(data)`

This module only assembles text; it never imports Triton. The knob domains below are
declared once and shared by every family that exposes the same knob, so mutations step
through the same neighbours everywhere.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping
from typing import Any

from pipelines.generation.space import Family, Knob, KnobValues

# -----------------------------------------------------------------------------
# Knob domains (ordered: a mutation steps to a neighbouring value)
# -----------------------------------------------------------------------------
# Columns per loop step of looped kernels; 16 and 32 are deliberately naive (many tiny passes).
BLOCK_N_LOOP = Knob(
    "BLOCK_N", (16, 32, 64, 128, 256, 512, 1024, 2048, 4096), "columns per loop step"
)
BLOCK_N_TILE = Knob("BLOCK_N", (64, 128, 256, 512, 1024), "columns per 2-D tile")
BLOCK_M_TILE = Knob("BLOCK_M", (1, 2, 4, 8), "rows per 2-D tile")
NUM_WARPS = Knob("NUM_WARPS", (1, 2, 4, 8, 16), "warps per program")
# Whole-row-in-registers kernels hold next_pow2(N) fp32 values per row: fewer than 4 warps spill badly.
NUM_WARPS_ROW = Knob("NUM_WARPS", (4, 8, 16, 32), "warps per program (row held in registers)")
NUM_STAGES = Knob("NUM_STAGES", (1, 2, 3, 4), "software-pipelining depth of loops")
ROWS_PER_PROGRAM = Knob(
    "ROWS_PER_PROGRAM", (1, 2, 4, 8), "rows handled by one program, one after another"
)
GRID_SIZE = Knob(
    "GRID_SIZE", (16, 32, 66, 132, 264, 528, 1056, 2112), "programs of a persistent grid"
)
EVICTION = Knob("eviction", ("none", "evict_last", "evict_first"), "L2 eviction hint on loads of x")

# A looped kernel keeps about BLOCK_N / (32 * NUM_WARPS) values per thread per live tensor; past
# 64 the compiler spills to local memory (and compile time explodes), so such points are invalid.
MAX_ELEMS_PER_THREAD = 64


def elems_per_thread_ok(block: int, num_warps: int) -> bool:
    """True when a block of `block` elements over `num_warps` warps fits in registers."""
    return block / (32 * num_warps) <= MAX_ELEMS_PER_THREAD


def looped_constraint(v: KnobValues) -> bool:
    """Constraint of the looped families: the column block fits in registers."""
    return elems_per_thread_ok(v["BLOCK_N"], v["NUM_WARPS"])


def tile_constraint(v: KnobValues) -> bool:
    """Constraint of 2-D tiled kernels: the BLOCK_M x BLOCK_N tile fits in registers."""
    return elems_per_thread_ok(v["BLOCK_M"] * v["BLOCK_N"], v["NUM_WARPS"])


# -----------------------------------------------------------------------------
# Source fragments
# -----------------------------------------------------------------------------
RULE = "# " + "-" * 77


def section(title: str) -> str:
    """A ruled section comment, as in the Triton tutorials."""
    return f"{RULE}\n# {title}\n{RULE}"


def evict(values: KnobValues) -> str:
    """The eviction keyword of a tl.load (empty for "none", so the code itself changes)."""
    policy = values.get("eviction", "none")
    return "" if policy == "none" else f', eviction_policy="{policy}"'


def knob_line(values: KnobValues) -> str:
    """`BLOCK_N=256, NUM_WARPS=4, eviction=evict_first` in the family's knob order."""
    return ", ".join(f"{k}={v}" for k, v in values.items())


def constants(values: KnobValues, docs: Mapping[str, str]) -> str:
    """Module constants for the UPPER_CASE knobs, each with its comment."""
    lines = []
    for name, value in values.items():
        if name.isupper():
            comment = docs.get(name, "")
            lines.append(f"{name} = {value!r}" + (f"  # {comment}" if comment else ""))
    return "\n".join(lines)


def module(
    *,
    task: str,
    algorithm: str,
    summary: str,
    details: str,
    traffic: str,
    values: KnobValues,
    knob_docs: Mapping[str, str],
    kernels: str,
    launcher: str,
    helpers: str = "",
    extra_imports: str = "",
) -> str:
    """Assemble one rendered kernel module.

    Args:
        task, algorithm, summary: identity of the family (go into the docstring).
        details: a paragraph on what this variant does differently (wrapped).
        traffic: a line on bytes moved per element (the claim a reviewer can check).
        values: knob values of this point, in family order.
        knob_docs: comment per UPPER_CASE knob.
        kernels, launcher, helpers: source blocks (already dedented).
    Returns:
        The module source, ending in a newline.
    """
    para = textwrap.fill(" ".join(details.split()), width=92)
    doc = (
        f'"""{task}: {algorithm} -- {summary}\n\n'
        f"{para}\n\n"
        f"Memory traffic: {traffic}\n\n"
        f"Knobs: {knob_line(values)}\n"
        '"""'
    )
    imports = "import torch\nimport triton\nimport triton.language as tl"
    if extra_imports:
        imports = extra_imports + "\n\n" + imports
    knob_block = constants(values, knob_docs)
    choices = [f"{k}={v}" for k, v in values.items() if not k.isupper()]
    if choices:
        knob_block += "\n# algorithm choices of this variant: " + ", ".join(choices)
    parts = [
        doc,
        imports,
        section("Knobs of this variant (one point of the kernelcast space)") + "\n" + knob_block,
    ]
    if helpers:
        parts.append(section("Helpers") + "\n" + helpers.strip("\n"))
    parts.append(section("Compute kernels") + "\n" + kernels.strip("\n"))
    parts.append(section("Launcher") + "\n" + launcher.strip("\n"))
    return "\n\n\n".join(parts) + "\n"


def family(
    task: str,
    algorithm: str,
    summary: str,
    knobs: tuple[Knob, ...],
    render: Callable[[KnobValues], str],
    constraint: Callable[[KnobValues], bool] | None = None,
) -> Family:
    """A Family whose render orders the knob values as declared (stable docstrings)."""

    def ordered_render(values: KnobValues) -> str:
        ordered: dict[str, Any] = {k.name: values[k.name] for k in knobs}
        return render(ordered)

    return Family(task, algorithm, summary, knobs, ordered_render, constraint)


def default_point(fam: Family) -> dict[str, Any]:
    """A middle point of the family that satisfies its constraint (the first valid one
    found walking outwards from the middle of every knob domain)."""
    import itertools

    mids = {k.name: len(k.values) // 2 for k in fam.knobs}
    best: dict[str, Any] | None = None
    best_dist = None
    for combo in itertools.product(*[range(len(k.values)) for k in fam.knobs]):
        values = {k.name: k.values[i] for k, i in zip(fam.knobs, combo)}
        if not fam.is_valid(values):
            continue
        dist = sum(abs(i - mids[k.name]) for k, i in zip(fam.knobs, combo))
        if best_dist is None or dist < best_dist:
            best, best_dist = values, dist
    if best is None:
        raise ValueError(f"{fam.task}/{fam.algorithm} has no valid point")
    return best


ROW_GUARD = Knob(
    "row_guard", ("branch", "clamp"), "rows past M: skipped by an if, or clamped to M-1"
)


def rows_loop(guard: str, body: str) -> str:
    """The ROWS_PER_PROGRAM loop of a whole-row kernel around `body` (unindented code that
    uses `row`), at kernel-body indentation. `guard` is a ROW_GUARD value."""
    if guard == "branch":
        return (
            "    for r in tl.range(0, ROWS_PER_PROGRAM, num_stages=NUM_STAGES):\n"
            "        row = pid * ROWS_PER_PROGRAM + r\n"
            "        if row < M:\n" + textwrap.indent(body, " " * 12)
        )
    return (
        "    for r in tl.range(0, ROWS_PER_PROGRAM, num_stages=NUM_STAGES):\n"
        "        # rows past M are clamped to M - 1: a duplicate, identical write instead of a branch\n"
        "        row = tl.minimum(pid * ROWS_PER_PROGRAM + r, M - 1)\n"
        + textwrap.indent(body, " " * 8)
    )


def guard_words(guard: str) -> str:
    """One clause for the docstring about the row guard."""
    if guard == "branch":
        return "rows past M are skipped by a branch"
    return "rows past M are clamped to the last row (duplicate identical writes, no branch)"


def persistent_loop(body: str) -> str:
    """A persistent row loop (program p takes rows p, p + P, ...) around `body`."""
    return (
        "    # -- persistent schedule: program p handles rows p, p + P, p + 2P, ...\n"
        "    pid = tl.program_id(0)\n"
        "    nprog = tl.num_programs(0)\n"
        "    for row in tl.range(pid, M, nprog, num_stages=NUM_STAGES):\n"
        + textwrap.indent(body, " " * 8)
    )


# -----------------------------------------------------------------------------
# Grid-capped persistent kernels (deliberate under-occupancy)
# -----------------------------------------------------------------------------
# A fixed, small number of programs, each walking many rows: throughput grows with the program
# count until the SMs are busy (132 on an H100/H200), so PROGRAMS is an honest, monotone
# slowdown knob (one program uses one SM of 132; 128 programs nearly fill the GPU). Measured on
# an H200 (2026-11-29, BLOCK_N 2048, 4 warps): LayerNorm speedup ~0.015 x PROGRAMS against the
# PyTorch reference (0.06 at 4, 0.9 at 64, 1.7 at 128); 1 and 2 programs took up to 0.4 s a call.
PROGRAMS = Knob(
    "PROGRAMS",
    (4, 8, 16, 24, 32, 48, 64, 96, 128),
    "programs of the capped grid, each looping over rows p, p + P, ...",
)
BLOCK_N_CAPPED = Knob("BLOCK_N", (512, 1024, 2048, 4096), "columns per loop step")
NUM_WARPS_CAPPED = Knob("NUM_WARPS", (2, 4, 8), "warps per program")
PROGRAMS_DOC = "programs of the capped grid (min(PROGRAMS, rows) are launched)"

CAPPED_DETAILS = """Only min(PROGRAMS, M) programs are launched, whatever the size of the
problem: program p handles rows p, p + P, p + 2P, ... one after another, each with a looped
body of BLOCK_N columns per step. An H100/H200 has 132 SMs, so with PROGRAMS < 132 most of
the GPU idles and the kernel is bound by the memory latency one program can hide; time falls
roughly as 1 / PROGRAMS until the SMs fill up."""


def capped_rows_loop(body: str, rows: str = "M") -> str:
    """The capped persistent schedule (program p takes rows p, p + P, ...) around `body`
    (unindented kernel code using `row`), at kernel-body indentation."""
    return (
        "    # -- capped persistent schedule: program p handles rows p, p + P, p + 2P, ...\n"
        "    pid = tl.program_id(0)\n"
        "    nprog = tl.num_programs(0)\n"
        f"    for row in range(pid, {rows}, nprog):\n" + textwrap.indent(body, " " * 8)
    )
