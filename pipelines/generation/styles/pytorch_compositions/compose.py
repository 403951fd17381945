"""How a PyTorch program is put together: a core function, the driver that feeds it, an optional
torch.compile wrapper, and the module text around them.

A program is written the way model and library code is: a module docstring saying what it does,
the imports, a few constants, a core function that computes the task on a block of its input, and
`custom_kernel(data)`. The driver decides how much of the input the core sees per call:

    direct        the whole input at once
    split_cat     x.split(BLOCK) along the blocked dimension, results joined with torch.cat
    chunk_cat     torch.chunk(x, N_CHUNKS) into a fixed number of pieces, joined with torch.cat
    slice_assign  a preallocated output filled slice by slice in a `range` loop
    split_copy    a preallocated output split alongside the input, each piece filled with copy_

Blocked drivers run Python-level loops: on large shapes they add launches and passes, which is
the point (the data needs slow programs as well as fast ones). A compiled program always uses
the direct driver and compiles the core lazily (on first call, at module level without calling
it, or as a decorator): importing the module compiles nothing.
"""

from __future__ import annotations

import random
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Imports in the order a module lists them (standard library first).
IMPORT_ORDER = (
    "import math",
    "import torch",
    "import torch.nn.functional as F",
    "from torch.nn.attention import SDPBackend, sdpa_kernel",
)

DRIVERS = ("direct", "split_cat", "chunk_cat", "slice_assign", "split_copy")
DIRECT_SHARE = 0.5  # of the drawn programs of a composition that takes drivers, run whole
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
COMPILE_STYLES = ("lazy", "module", "decorator")
# knobs every program carries; a composition's own axes take other names
DRIVER_KNOBS = ("driver", "block", "compile", "compile_style", "dynamic")


@dataclass(frozen=True)
class Core:
    """The function a program is built around: it computes the task on one block of the input.

    name/params: its signature; body: its lines, unindented, the last one returning.
    summary: what it computes, for the module docstring (full sentences).
    constants: module-level assignments it reads; helpers: whole top-level definitions it calls.
    """

    name: str
    params: tuple[str, ...]
    body: tuple[str, ...]
    summary: str
    constants: tuple[str, ...] = ()
    helpers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Call:
    """How custom_kernel(data) reaches a task's core.

    unpack: the line that names the parts of `data`; args: the core's arguments in order.
    split: the arguments a blocked driver cuts along `dim`; the outputs are cut along it too.
    outputs: (name, allocation of the whole output) per output, for the preallocating drivers.
    unit: what the indices along `dim` are ("rows", "heads"), for names and the docstring;
    unit_one: the same in the singular (default: `unit` without its final "s").
    """

    unpack: str
    args: tuple[str, ...]
    split: tuple[str, ...]
    dim: int
    outputs: tuple[tuple[str, str], ...]
    unit: str
    unit_one: str = ""


@dataclass(frozen=True)
class Composition:
    """One way of composing a task's program: its knobs and how they become a core.

    axes: knob -> the values it takes; build(choices) -> Core (choices hold every knob).
    drivers: whether the blocked drivers apply (a core with its own loop runs direct).
    compilable: whether torch.compile may wrap the core (no autograd, no module state).
    valid: rejects knob combinations that would not make sense together.
    """

    name: str
    axes: dict[str, tuple[Any, ...]]
    build: Callable[[dict[str, Any]], Core]
    drivers: bool = True
    compilable: bool = True
    valid: Callable[[dict[str, Any]], bool] | None = None

    def __post_init__(self) -> None:
        clash = set(self.axes) & set(DRIVER_KNOBS)
        if clash:
            raise ValueError(f"{self.name}: axes {sorted(clash)} clash with the driver knobs")


@dataclass(frozen=True)
class TaskSpace:
    """A task's compositions and how its programs are driven.

    lead: the docstring's first sentence, what every program of the task computes.
    blocks: block sizes (in call.unit) of split_cat, slice_assign and split_copy;
    chunks: piece counts of chunk_cat.
    """

    task: str
    lead: str
    call: Call
    blocks: tuple[int, ...]
    chunks: tuple[int, ...]
    compositions: tuple[Composition, ...]


def draw(space: TaskSpace, comp: Composition, rng: random.Random, compiled: bool) -> dict[str, Any]:
    """One random choice of every knob of `comp` (plus driver and compile knobs).

    Args:
        space: the task's space (its block sizes).
        comp: the composition drawn from.
        rng: the generator's random state (advanced).
        compiled: whether the program is wrapped in torch.compile (then it runs direct).
    Returns:
        The choices, JSON-serialisable.
    """
    choices = {axis: rng.choice(values) for axis, values in comp.axes.items()}
    driver, block = "direct", None
    if comp.drivers and not compiled and rng.random() >= DIRECT_SHARE:
        driver = rng.choice(DRIVERS[1:])
        block = rng.choice(space.chunks if driver == "chunk_cat" else space.blocks)
    choices.update(driver=driver, block=block, compile=None)
    if compiled:
        choices.update(compile=rng.choice(COMPILE_MODES), compile_style=rng.choice(COMPILE_STYLES),
                       dynamic=rng.choice((None, False)))
    return choices


def program(space: TaskSpace, comp: Composition, choices: dict[str, Any]) -> str:
    """The module source of `comp` under `choices` (as `draw` returns them)."""
    core = comp.build(choices)
    call = space.call
    mode = choices.get("compile")
    constants = list(core.constants)
    kernel: list[str] = [call.unpack]
    core_def = _function(core.name, core.params, core.body)
    defs = list(core.helpers)
    doc = [space.lead, core.summary]
    if mode is None:
        defs.append(core_def)
        kernel += _drive(call, core.name, choices["driver"], choices["block"], constants)
        doc.append(_driver_doc(call, choices["driver"], choices["block"]))
    else:
        defs_c, before, after, compile_doc = _compiled(core, core_def, call, mode,
                                                       choices["compile_style"], choices["dynamic"])
        defs += defs_c
        kernel = [*before, *kernel, *after]
        doc.append(compile_doc)
    return _module(doc, constants, defs, kernel)


# ----------------------------------------------------------------------------------------------
# drivers


def _index(name: str, dim: int, span: str) -> str:
    return f"{name}[{':, ' * dim}{span}]"


def _split_kw(dim: int) -> str:
    return f", dim={dim}" if dim else ""


def _drive(call: Call, fn: str, driver: str, block: int | None, constants: list[str]) -> list[str]:
    """custom_kernel's lines after the unpack: call `fn` on the whole input or on blocks of it."""
    args = ", ".join(call.args)
    if driver == "direct":
        return [f"return {fn}({args})"]
    size = "N_CHUNKS" if driver == "chunk_cat" else f"{call.unit.upper()}_PER_BLOCK"
    constants.append(f"{size} = {block}")
    blk = {a: f"{a}_block" for a in call.split}
    block_args = ", ".join(blk.get(a, a) for a in call.args)
    outs = [name for name, _ in call.outputs]
    multi = len(outs) > 1
    kw = _split_kw(call.dim)
    if driver in ("split_cat", "chunk_cat"):
        def cut(a: str) -> str:
            return f"{a}.split({size}{kw})" if driver == "split_cat" else f"torch.chunk({a}, {size}{kw})"

        loop_vars = ", ".join(blk[a] for a in call.split)
        if len(call.split) == 1 and not multi:
            return [f"pieces = [{fn}({block_args}) for {loop_vars} in {cut(call.split[0])}]",
                    f"return torch.cat(pieces{kw})"]
        lists = [f"{o}_pieces" for o in outs] if multi else ["pieces"]
        lines = [", ".join(lists) + " = " + ", ".join("[]" for _ in lists)]
        lines += _for_zip(loop_vars, [cut(a) for a in call.split])
        if multi:
            lines.append(f"    {', '.join(f'{o}_block' for o in outs)} = {fn}({block_args})")
            lines += [f"    {p}.append({o}_block)" for p, o in zip(lists, outs)]
        else:
            lines.append(f"    pieces.append({fn}({block_args}))")
        lines.append("return " + ", ".join(f"torch.cat({p}{kw})" for p in lists))
        return lines
    lines = [f"{name} = {alloc}" for name, alloc in call.outputs]
    if driver == "slice_assign":
        first = call.split[0]
        sliced = ", ".join(_index(a, call.dim, "start:stop") if a in blk else a for a in call.args)
        targets = ", ".join(_index(o, call.dim, "start:stop") for o in outs)
        lines += [f"for start in range(0, {first}.shape[{call.dim}], {size}):",
                  f"    stop = start + {size}",
                  f"    {targets} = {fn}({sliced})"]
    else:  # split_copy: the output's split views are written through
        out_blk = [f"{o}_view" for o in outs]
        loop_vars = ", ".join([blk[a] for a in call.split] + out_blk)
        lines += _for_zip(loop_vars, [f"{a}.split({size}{kw})" for a in list(call.split) + outs])
        if multi:
            results = [f"{o}_block" for o in outs]
            lines.append(f"    {', '.join(results)} = {fn}({block_args})")
            lines += [f"    {v}.copy_({r})" for v, r in zip(out_blk, results)]
        else:
            lines.append(f"    {out_blk[0]}.copy_({fn}({block_args}))")
    lines.append("return " + ", ".join(outs))
    return lines


def _for_zip(loop_vars: str, sources: list[str]) -> list[str]:
    """`for <loop_vars> in zip(<sources>):`, one source per line when the line gets long."""
    if len(sources) == 1:
        return [f"for {loop_vars} in {sources[0]}:"]
    head = f"for {loop_vars} in zip("
    one_line = head + ", ".join(sources) + "):"
    if len(one_line) <= 96:
        return [one_line]
    pad = " " * len(head)
    return [head + sources[0] + ","] + [pad + src + "," for src in sources[1:-1]] + [pad + sources[-1] + "):"]


def _driver_doc(call: Call, driver: str, block: int | None) -> str:
    unit = (call.unit_one or call.unit.removesuffix("s")) if block == 1 else call.unit
    return {
        "direct": "",
        "split_cat": f"The input is processed in blocks of {block} {unit} (split), the pieces "
                     "joined with torch.cat.",
        "chunk_cat": f"The input is cut into {block} pieces along its {unit} (torch.chunk), the "
                     "results joined with torch.cat.",
        "slice_assign": f"The output is preallocated and filled {block} {unit} at a time in a "
                        "Python loop over slices.",
        "split_copy": f"The output is preallocated and split alongside the input, {block} {unit} "
                      "per block; each block's result is copied into its view.",
    }[driver]


# ----------------------------------------------------------------------------------------------
# torch.compile


def _compile_expr(target: str | None, mode: str, dynamic: bool | None) -> str:
    """torch.compile(target, mode=..., dynamic=...); without a target, the decorator form."""
    kw = [] if mode == "default" else [f'mode="{mode}"']
    if dynamic is not None:
        kw.append(f"dynamic={dynamic}")
    args = ([target] if target else []) + kw
    return f"torch.compile({', '.join(args)})" if args else "torch.compile"


def _compiled(core: Core, core_def: str, call: Call, mode: str, style: str,
              dynamic: bool | None) -> tuple[list[str], list[str], list[str], str]:
    """Definitions, custom_kernel's lines before and after the unpack, and the docstring
    sentence of a compiled core."""
    args = ", ".join(call.args)
    # CUDA graphs (reduce-overhead) reuse their output buffers on the next replay: keep a copy.
    if mode != "reduce-overhead":
        def ret(expr: str) -> str:
            return f"return {expr}"
    elif len(call.outputs) == 1:
        def ret(expr: str) -> str:
            return f"return {expr}.clone()"
    else:
        def ret(expr: str) -> str:
            return f"return tuple(t.clone() for t in {expr})"
    how = _compile_expr(None, mode, dynamic)
    if style == "decorator":
        return [f"@{how}\n{core_def}"], [], [ret(f"{core.name}({args})")], (
            f"The core is decorated with @{how}: it is compiled on its first call.")
    if style == "module":
        compiled = f"{core.name}_compiled"
        return ([core_def, f"{compiled} = {_compile_expr(core.name, mode, dynamic)}"], [],
                [ret(f"{compiled}({args})")],
                f"The core is wrapped with {how} at import; compilation happens on the first call.")
    return ([core_def, "_compiled = None  # compiled on the first call"],
            ["global _compiled", "if _compiled is None:",
             f"    _compiled = {_compile_expr(core.name, mode, dynamic)}"],
            [ret(f"_compiled({args})")],
            f"The core is compiled with {how} on the first call of custom_kernel.")


# ----------------------------------------------------------------------------------------------
# module text


def _function(name: str, params: tuple[str, ...], body: tuple[str, ...] | list[str]) -> str:
    return f"def {name}({', '.join(params)}):\n" + "\n".join(
        ("    " + line) if line else "" for b in body for line in b.split("\n"))


# import line -> a pattern of its use in the code
_IMPORT_USES = {
    "import math": r"\bmath\.",
    "import torch.nn.functional as F": r"\bF\.",
    "from torch.nn.attention import SDPBackend, sdpa_kernel": r"\b(SDPBackend|sdpa_kernel)\b",
}


def _module(doc: list[str], constants: list[str], defs: list[str], kernel: list[str]) -> str:
    code = "\n".join([*constants, *defs, *kernel])
    # torch is always imported, as in any kernel file; the others only where the code uses them
    imports = [line for line in IMPORT_ORDER
               if line == "import torch" or re.search(_IMPORT_USES[line], code)]
    paragraphs = [p for p in doc if p]
    text = "\n\n".join(textwrap.fill(p, width=96) for p in paragraphs)
    parts = [f'"""{text}\n"""', "\n".join(imports)]
    if constants:
        parts.append("\n".join(dict.fromkeys(constants)))
    sections = "\n\n".join(parts)
    functions = "\n\n\n".join([*defs, _function("custom_kernel", ("data",), kernel)])
    return f"{sections}\n\n\n{functions}\n"
