"""Rendering helpers shared by the tensor-core task families (matmul_bias_gelu, causal_attention,
gdn_chunk_fwd_o): module docstrings, resource estimates and small Triton code snippets.

Everything here returns plain strings or booleans; the rendered kernels themselves import only
torch, triton, triton.language and math.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pipelines.generation.space import Family, Knob

SMEM_LIMIT = 232448  # bytes of shared memory one CTA may use on sm_90 (H100/H200)
MAX_ACC_REGS = 256  # fp32 accumulator elements per thread above which register spills dominate

IMPORTS = "import torch\nimport triton\nimport triton.language as tl\n"


def knob_lines(values: Mapping[str, Any]) -> str:
    """One 'NAME = value' line per knob, sorted, for the module docstring."""
    return "\n".join(f"    {name} = {values[name]!r}" for name in sorted(values))


def docstring(
    task: str, algorithm: str, summary: str, changes: str, values: Mapping[str, Any]
) -> str:
    """The rendered module's docstring: task, algorithm, what this variant changes, knob values."""
    return (
        f'"""{task} / {algorithm}: {summary}\n\n'
        f"{textwrap.fill(changes.strip(), width=96)}\n\n"
        f"Knobs:\n{knob_lines(values)}\n"
        '"""\n'
    )


def module(
    task: str, algorithm: str, summary: str, changes: str, values: Mapping[str, Any], body: str
) -> str:
    """Assemble a standalone kernel module in tutorial order: docstring, imports, kernels, launcher."""
    return (
        docstring(task, algorithm, summary, changes, values)
        + "\n"
        + IMPORTS
        + "\n\n"
        + body.strip()
        + "\n"
    )


def smem_bytes(stages: int, tiles: Iterable[int], elem_bytes: int = 2) -> int:
    """Shared memory of a software pipeline: `stages` copies of every streamed tile (elements)."""
    return stages * sum(tiles) * elem_bytes


def acc_regs(elements: int, num_warps: int) -> float:
    """fp32 register-tile elements held per thread."""
    return elements / (32 * num_warps)


def gelu_lines(x: str, y: str, form: str, indent: str = "    ") -> str:
    """Triton statements computing y = gelu(x) in fp32.

    "erf" is the exact GELU; "tanh_sigmoid" is the tanh approximation written as
    x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), within 5e-4 of the exact form.
    """
    if form == "erf":
        return f"{indent}{y} = 0.5 * {x} * (1.0 + tl.math.erf({x} * 0.7071067811865476))  # exact erf GELU\n"
    if form == "tanh_sigmoid":
        return (
            f"{indent}inner = 1.5957691216057308 * ({x} + 0.044715 * {x} * {x} * {x})  # 2 * sqrt(2/pi) * (...)\n"
            f"{indent}{y} = {x} * tl.sigmoid(inner)  # tanh GELU: 0.5 x (1 + tanh(u)) = x sigmoid(2u)\n"
        )
    raise ValueError(f"unknown gelu form {form!r}")


def family(
    task: str,
    algorithm: str,
    summary: str,
    knobs: Mapping[str, tuple],
    render: Callable[[Mapping[str, Any]], str],
    constraint: Callable[[Mapping[str, Any]], bool] | None = None,
    docs: Mapping[str, str] | None = None,
) -> Family:
    """Build a Family from an ordered {knob name: values} mapping."""
    docs = docs or {}
    return Family(
        task=task,
        algorithm=algorithm,
        summary=summary,
        knobs=tuple(Knob(name, tuple(vals), docs.get(name, "")) for name, vals in knobs.items()),
        render=render,
        constraint=constraint,
    )
