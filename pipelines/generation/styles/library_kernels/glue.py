"""What the kernel modules of the library-triton style share: structures and their knobs, the
launch glue libraries wrap around their kernels, and the assembly of one module.

A *structure* is one program design of a task (an `algorithm` of the kernel records): its knobs
are drawn one after another, and a knob's domain may depend on the choices already made (a
persistent grid asks where its SM count comes from; a one-program-per-row grid does not), so a
record's knobs_json holds only the choices its source depends on.

Every structure renders twice from the same choices:
- for the GPU (what the records hold): launchers that ask the device (torch's device
  properties, Triton's driver at import, compile-ahead `warmup` sized from registers and shared
  memory), autotuners with all their configs, device contexts;
- `for_check=True`: the same kernels and the same arithmetic with the device questions answered
  by constants, one autotune config and plain launches, so the Triton CPU interpreter (which has
  no device to ask and no warmup) can check the results. The grid size never changes results.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Choices = dict[str, Any]
Domain = tuple | Callable[[Choices], tuple | None]

# SMs the interpreter's renders pretend to have: small and odd, so persistent programs stride
# over several rows or tiles each on the tiny correctness inputs
CHECK_SMS = 3


@dataclass(frozen=True)
class Structure:
    """One program design of a task.

    name: the record's `algorithm`.
    summary: one line for the module docstring.
    knobs: knob -> its domain, drawn in this order; a callable domain gets the choices so far
        and returns the values (None: the knob does not apply).
    render: (choices, for_check) -> module source.
    valid: optional filter of complete choices (e.g. a tile that would not fit shared memory).
    """

    name: str
    summary: str
    knobs: Mapping[str, Domain]
    render: Callable[[Choices, bool], str]
    valid: Callable[[Choices], bool] | None = None


@dataclass(frozen=True)
class TaskSpace:
    """The structures of one task."""

    task: str
    structures: tuple[Structure, ...]
    by_name: dict[str, Structure] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "by_name", {s.name: s for s in self.structures})


def draw(structure: Structure, rng) -> Choices:
    """One set of choices for `structure` (knobs in declared order, each uniform in its domain)."""
    choices: Choices = {}
    for name, domain in structure.knobs.items():
        values = domain(choices) if callable(domain) else domain
        if values:
            choices[name] = values[rng.randrange(len(values))]
    return choices


# =============================================================================================
# Text helpers
# =============================================================================================


def dedent(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


def indent(text: str, spaces: int) -> str:
    return textwrap.indent(text, " " * spaces, lambda line: bool(line.strip()))


def rename(source: str, names: Mapping[str, str]) -> str:
    """Whole-word renames of identifiers (a dialect's names for the canonical ones)."""
    if not names:
        return source
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")\b")
    return pattern.sub(lambda m: names[m.group(1)], source)


def module(doc: str, parts: list[str], imports: tuple[str, ...] = ()) -> str:
    """One kernel module: docstring, imports (standard library first), then the parts."""
    std = sorted({i for i in imports if i in ("contextlib", "functools", "math")})
    lines = [f'"""{dedent(doc)}\n"""', ""]
    lines += [f"import {i}" for i in std]
    if std:
        lines.append("")
    lines += ["import torch", "import triton", "import triton.language as tl"]
    body = "\n\n\n".join(_tidy(p.strip("\n")) for p in parts if p and p.strip())
    return "\n".join(lines) + "\n\n\n" + body + "\n"


def _tidy(part: str) -> str:
    """Blank lines left by fragments that rendered empty: none after a line opening a block,
    at most one in a row inside a body."""
    out: list[str] = []
    for line in part.split("\n"):
        if not line.strip():
            if not out or not out[-1].strip() or out[-1].rstrip().endswith((":", "(")):
                continue
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


def wrap_doc(text: str, width: int = 96) -> str:
    return "\n".join(textwrap.wrap(" ".join(text.split()), width))


def ruler(title: str, depth: int = 4) -> str:
    """A ruled comment that cuts a kernel body into steps (no indent; `depth` is where it goes)."""
    return f"# -- {title} " + "-" * max(4, 88 - depth - len(title) - 6)


# =============================================================================================
# Device questions: SM count, contexts
# =============================================================================================

SM_SOURCES = ("torch_props", "driver_props")


def sm_count_part(source: str, for_check: bool) -> tuple[str, str]:
    """(module-level code, expression of the SM count inside a launcher whose first tensor is
    `x`) for a grid sized from the device: torch's properties asked once per device, or Triton's
    driver asked at import."""
    if for_check:
        code = f"""\
NUM_SMS = {CHECK_SMS}  # the interpreter has no device to ask: a small grid that still strides"""
        return code, "NUM_SMS"
    if source == "torch_props":
        code = '''\
@functools.lru_cache(maxsize=None)
def num_sms(device_index):
    """Streaming multiprocessors of one GPU, asked once per device."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count'''
        return code, "num_sms(x.device.index or 0)"
    if source == "driver_props":
        code = """\
DEVICE = triton.runtime.driver.active.get_active_torch_device()
NUM_SMS = triton.runtime.driver.active.utils.get_device_properties(DEVICE.index or 0)["multiprocessor_count"]"""
        return code, "NUM_SMS"
    raise ValueError(f"unknown SM source {source!r}")


def warmup_props_part(for_check: bool) -> str:
    """Module-level device properties for the compile-ahead launch (Triton tutorial 02's way)."""
    if for_check:
        return f"NUM_SMS = {CHECK_SMS}  # the interpreter has no device to ask: a small grid that still strides"
    return """\
DEVICE = triton.runtime.driver.active.get_active_torch_device()
PROPERTIES = triton.runtime.driver.active.utils.get_device_properties(DEVICE.index or 0)
NUM_SMS = PROPERTIES["multiprocessor_count"]
NUM_REGS = PROPERTIES["max_num_regs"]
SIZE_SMEM = PROPERTIES["max_shared_mem"]
WARP_SIZE = PROPERTIES["warpSize"]"""


def warmup_launch(kernel: str, args: list[str], constexprs: Mapping[str, str], warps: str, stages: str | None,
                  key: str, work: str, for_check: bool, cap: str = "4") -> str:
    """A launcher fragment that compiles `kernel` ahead for this shape, derives how many
    programs fit on an SM from its registers and shared memory, and launches the compiled
    kernel over that many programs (at most `work`); the interpreter's render launches
    NUM_SMS programs the plain way.

    Args:
        kernel: the @triton.jit function.
        args: runtime arguments in signature order (the constexprs follow them).
        constexprs: constexpr name -> launcher expression, in signature order.
        warps: expression of num_warps.
        stages: expression of num_stages, or None.
        key: expression of the cache key of compiled kernels.
        work: expression of the number of rows or tiles to share out.
        cap: most programs per SM the launcher asks for.
    """
    kw = ", ".join(f"{k}={v}" for k, v in constexprs.items())
    opts = f"num_warps={warps}" + (f", num_stages={stages}" if stages else "")
    if for_check:
        return dedent(f"""\
        programs = min(NUM_SMS, {work})
        {kernel}[(programs,)]({", ".join(args)}, {kw}, {opts})""")
    positional = ", ".join([*args, *constexprs.values()])
    return dedent(f"""\
    compiled = _COMPILED.get({key})
    if compiled is None:
        # compile ahead for this shape, then size the grid by occupancy (registers, shared memory)
        kernel = {kernel}.warmup({", ".join(args)}, {kw}, {opts}, grid=(1,))
        kernel._init_handles()
        per_sm = NUM_REGS // max(1, kernel.n_regs * WARP_SIZE * {warps})
        if kernel.metadata.shared:
            per_sm = min(per_sm, SIZE_SMEM // kernel.metadata.shared)
        compiled = _COMPILED[{key}] = (kernel, NUM_SMS * max(1, min(per_sm, {cap})))
    kernel, programs = compiled
    # the compiled kernel launches on the stream Triton's driver reports for the device
    stream = triton.runtime.driver.active.get_current_stream(DEVICE.index or 0)
    kernel[(min(programs, {work}), 1, 1)]({positional}, stream=stream)""")


# how launchers make sure they run on the tensor's GPU and on contiguous data
LAUNCH_GUARDS = ("plain", "device_context", "current_stream", "input_guard", "ensure_contiguous")


def guard_part(guard: str, for_check: bool) -> str:
    """Module-level decorator of a launcher for `guard` ('' when none is needed)."""
    if guard == "input_guard":
        ctx = "contextlib.nullcontext()" if for_check else "torch.cuda.device(tensor.device.index)"
        return f'''\
def input_guard(fn):
    """Run `fn` on contiguous copies of its tensor arguments, on the device of the first one."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        args = tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args)
        kwargs = {{k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}}
        tensor = next(a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))
        with {ctx}:
            return fn(*args, **kwargs)

    return wrapper'''
    if guard == "ensure_contiguous":
        return '''\
def ensure_contiguous(fn):
    """Call `fn` with its tensor arguments made contiguous (the kernels step rows by one stride)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        args = [a.contiguous() if isinstance(a, torch.Tensor) else a for a in args]
        kwargs = {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        return fn(*args, **kwargs)

    return wrapper'''
    return ""


def guard_decorator(guard: str) -> str:
    """The decorator line of a launcher for `guard` ('' when none)."""
    return {"input_guard": "@input_guard\n", "ensure_contiguous": "@ensure_contiguous\n"}.get(guard, "")


def guard_launch(guard: str, launch: str, tensor: str, for_check: bool) -> str:
    """`launch` (launcher lines) inside the device or stream context `guard` asks for."""
    if guard not in ("device_context", "current_stream"):
        return launch
    if for_check:
        ctx = "contextlib.nullcontext()"
    elif guard == "device_context":
        ctx = f"torch.cuda.device({tensor}.device)"
    else:
        ctx = f"torch.cuda.stream(torch.cuda.current_stream({tensor}.device))"
    return f"with {ctx}:\n" + indent(launch, 4)


def guard_imports(guard: str, for_check: bool) -> tuple[str, ...]:
    if guard in ("input_guard", "ensure_contiguous"):
        return ("functools", "contextlib") if guard == "input_guard" and for_check else ("functools",)
    if guard in ("device_context", "current_stream") and for_check:
        return ("contextlib",)
    return ()


# =============================================================================================
# Tuning: autotune and heuristics decorators, the block-size helper
# =============================================================================================


def config(meta: Mapping[str, int], warps: int, stages: int | None = None) -> str:
    """One `triton.Config(...)` expression."""
    kv = ", ".join(f'"{k}": {v}' for k, v in meta.items())
    st = f", num_stages={stages}" if stages is not None else ""
    return f"triton.Config({{{kv}}}, num_warps={warps}{st})"


def autotune(configs: list[str], key: list[str], for_check: bool, check_config: int = 0,
             extra: str = "") -> str:
    """An @triton.autotune decorator over `configs` keyed on `key`; the interpreter's render
    keeps one config (the interpreter cannot time candidates)."""
    if for_check:
        configs = [configs[check_config % len(configs)]]
    body = "".join(f"        {c},\n" for c in configs)
    keys = ", ".join(f'"{k}"' for k in key)
    more = f"\n    {extra}," if extra else ""
    return f"@triton.autotune(\n    configs=[\n{body}    ],\n    key=[{keys}],{more}\n)"


def heuristics(rules: Mapping[str, str]) -> str:
    """An @triton.heuristics decorator: meta-parameter -> lambda body over `args`."""
    body = "".join(f'        "{k}": lambda args: {v},\n' for k, v in rules.items())
    return f"@triton.heuristics(\n    {{\n{body}    }}\n)"


# warps for a one-row-per-program kernel, by policy: (BLOCK_SIZE threshold, warps) pairs,
# largest first, with the fallback last
WARP_POLICIES: dict[str, tuple[tuple[int, int], ...]] = {
    "scaled": ((32768, 32), (8192, 16), (2048, 8), (0, 4)),
    "lean": ((16384, 16), (4096, 8), (0, 4)),
    "wide": ((8192, 32), (2048, 16), (512, 8), (0, 4)),
}


def settings_part(policy: str, max_fused: int = 65536) -> str:
    """A `calculate_settings(n)` helper: block = next power of two of n, warps by `policy`."""
    steps = WARP_POLICIES[policy]
    lines = []
    for i, (limit, warps) in enumerate(steps[:-1]):
        lines.append(f"    {'if' if i == 0 else 'elif'} block_size >= {limit}:\n        num_warps = {warps}")
    lines.append(f"    else:\n        num_warps = {steps[-1][1]}")
    branches = "\n".join(lines)
    return f'''\
MAX_FUSED_SIZE = {max_fused}


def calculate_settings(n):
    """(BLOCK_SIZE, num_warps) for a program that holds a whole row of n elements."""
    block_size = triton.next_power_of_2(n)
    if block_size > MAX_FUSED_SIZE:
        raise RuntimeError(f"a row of {{n}} elements exceeds the fused block limit {{MAX_FUSED_SIZE}}")
{branches}
    return block_size, num_warps'''


def launcher_doc(text: str) -> str:
    return f'    """{text}"""'
