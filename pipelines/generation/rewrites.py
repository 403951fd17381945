"""Source-level rewrites of Triton kernel modules: children whose generator metadata no longer
describes them.

A template kernel from the space carries `algorithm` and `knobs_json`; once its code is rewritten
(a constant inlined with another value, a loop unrolled, a launch split in two, ...) those fields
would lie, so a rewritten child has them EMPTY (None), generator "rewrite:<rule>" (or "rewrite"
when several rules were applied, the mutation naming them in order), its parent's id as
parent_kernel_id and its own content-addressed id (warehouse.ids.kernel_id).

Every rule is an `ast` transformation of the whole module (ast.parse -> edit -> ast.unparse), so
comments disappear and the module docstring, which lists the parent's knobs, is replaced by a
neutral one: nothing in the child restates metadata it no longer has. A rule returns None when the
module offers it nothing to change (no launch with a tuple grid, no loop, ...), so `rewrite`
tries the rules it is given in a seeded order until the requested number applied.

Rules (RULES, in a fixed order):
    inline_constant    an UPPER_CASE int knob bound in the module or the launcher is inlined as
                       a literal of another value (x2 or /2; stages +-1)
    launch_warps       num_warps at a launch set to another power of two
    launch_stages      num_stages at a launch set (or added) to another depth
    loop_pipeline      a loop of a @triton.jit function switched between range and tl.range
                       (software pipelining on/off, or another num_stages)
    loop_unroll        a loop unrolled: tl.static_range when its bounds are compile-time, else
                       tl.range(..., loop_unroll_factor=2|4)
    debug_barrier      tl.debug_barrier() before every store of a kernel (extra synchronisation)
    load_hints         eviction_policy or cache_modifier of a kernel's loads changed
    mask_select        masked loads written as tl.where(mask, tl.load(p, mask=mask), other)
    acc_precision      one fp32 upcast lowered to fp16, or an fp32 dot switched to ieee/tf32x3
    split_launch       one launch split in two along grid axis 0 (a program-id offset argument)
    rows_per_program   each program of grid axis 0 does 2 or 4 programs' work in a static loop

Only the standard library and numpy are needed (the checks use pipelines.generation.aot and
pipelines.profiling.check, imported by the batch builder).
"""

from __future__ import annotations

import ast
import copy
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from warehouse.ids import kernel_record

GENERATOR = "rewrite"
GENERATOR_VERSION = "rewrite-2"  # 2: load_hints sets an eviction policy or a cache modifier, never both

# Knobs that the task fixes (a chunk of 64 tokens, a quantisation group of 128): changing them
# changes the problem, not the kernel, so inline_constant leaves them alone.
_FIXED_NAMES = ("BT", "CHUNK", "GROUP", "GROUP_SIZE", "QGROUP", "LOG2E", "EPS")


class RewriteError(ValueError):
    """The source cannot be rewritten at all (it does not parse)."""


@dataclass(frozen=True)
class Applied:
    """One rule applied: the new module tree and what it changed, e.g. 'BLOCK_N=512->256'."""

    tree: ast.Module
    detail: str


Rule = Callable[[ast.Module, np.random.Generator], Applied | None]


# =============================================================================================
# Helpers over the module tree
# =============================================================================================


def _is_jit_decorator(dec: ast.expr) -> bool:
    target = dec.func if isinstance(dec, ast.Call) else dec
    return isinstance(target, ast.Attribute) and target.attr == "jit"


def jit_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    """The module's @triton.jit functions (also those under @triton.autotune / heuristics)."""
    return [
        n for n in tree.body
        if isinstance(n, ast.FunctionDef) and any(_is_jit_decorator(d) for d in n.decorator_list)
    ]


def _host_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    jit = {id(f) for f in jit_functions(tree)}
    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and id(n) not in jit]


def _is_tl(node: ast.expr, attr: str) -> bool:
    """`tl.<attr>` (also `triton.language.<attr>`)."""
    return isinstance(node, ast.Attribute) and node.attr == attr and (
        (isinstance(node.value, ast.Name) and node.value.id == "tl")
        or (isinstance(node.value, ast.Attribute) and node.value.attr == "language")
    )


def _tl_calls(fn: ast.AST, attr: str) -> list[ast.Call]:
    return [n for n in ast.walk(fn) if isinstance(n, ast.Call) and _is_tl(n.func, attr)]


def _kw(call: ast.Call, name: str) -> ast.keyword | None:
    return next((k for k in call.keywords if k.arg == name), None)


def _set_kw(call: ast.Call, name: str, value: ast.expr) -> None:
    kw = _kw(call, name)
    if kw is None:
        call.keywords.append(ast.keyword(arg=name, value=value))
    else:
        kw.value = value


def _int_const(node: ast.expr | None) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _pick(rng: np.random.Generator, items: Sequence[Any]) -> Any:
    return items[int(rng.integers(len(items)))]


def _stepped(name: str, value: int, rng: np.random.Generator) -> int | None:
    """Another value for an int knob: stages +-1 within 1..6, warps x2 or /2 within 1..16,
    anything else x2 or /2 (at least 1). None when it has no other value."""
    if "STAGE" in name:
        options = [v for v in (value - 1, value + 1) if 1 <= v <= 6]
    elif "WARP" in name:
        options = [v for v in (value // 2, value * 2) if 1 <= v <= 16 and v != value]
    else:
        options = [v for v in (value // 2, value * 2) if v >= 1 and v != value]
    return _pick(rng, options) if options else None


def _autotuned(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "autotune"
               for d in fn.decorator_list)


def _launches(tree: ast.Module, options: bool = False) -> list[tuple[ast.FunctionDef, ast.Call, str]]:
    """(host function, call, kernel name) of every `kernel[grid](...)` launch of a jit function.

    options=True keeps only launches whose num_warps/num_stages a rule may set: not autotuned
    (the configs carry them) and without a `**kwargs` that may carry them too."""
    names = {f.name for f in jit_functions(tree)}
    if options:
        names -= {f.name for f in jit_functions(tree) if _autotuned(f)}
    out = []
    for host in _host_functions(tree):
        for n in ast.walk(host):
            if (
                isinstance(n, ast.Call)
                and isinstance(n.func, ast.Subscript)
                and isinstance(n.func.value, ast.Name)
                and n.func.value.id in names
                and not (options and any(k.arg is None for k in n.keywords))
            ):
                out.append((host, n, n.func.value.id))
    return out


def _module_ints(tree: ast.Module) -> dict[str, int]:
    """UPPER_CASE names bound once at module level to an int literal."""
    found: dict[str, list[int]] = {}
    for n in tree.body:
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            v = _int_const(n.value)
            if v is not None and n.targets[0].id.isupper():
                found.setdefault(n.targets[0].id, []).append(v)
    return {k: v[0] for k, v in found.items() if len(v) == 1}


# =============================================================================================
# Rules
# =============================================================================================


class _Inline(ast.NodeTransformer):
    def __init__(self, name: str, value: int):
        self.name, self.value = name, value

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id == self.name and isinstance(node.ctx, ast.Load):
            return ast.copy_location(ast.Constant(self.value), node)
        return node


def inline_constant(tree: ast.Module, rng: np.random.Generator) -> Applied | None:
    """An int knob (module-level, or bound in a launcher as NAME = 64 / A, B = 32, 64) becomes a
    literal of another value everywhere it is read; its binding is removed."""
    candidates: list[tuple[str, int, ast.AST | None]] = []  # (name, value, scope or None=module)
    for name, value in _module_ints(tree).items():
        if name not in _FIXED_NAMES:
            candidates.append((name, value, None))
    for host in _host_functions(tree):
        for n in ast.walk(host):
            if not (isinstance(n, ast.Assign) and len(n.targets) == 1):
                continue
            t, v = n.targets[0], n.value
            if isinstance(t, ast.Name) and _int_const(v) is not None:
                pairs = [(t.id, _int_const(v))]
            elif isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple) and len(t.elts) == len(v.elts):
                pairs = [(e.id, _int_const(x)) for e, x in zip(t.elts, v.elts, strict=True)
                         if isinstance(e, ast.Name) and _int_const(x) is not None]
            else:
                continue
            for name, value in pairs:
                if name.isupper() and name not in _FIXED_NAMES:
                    candidates.append((name, value, host))
    # a name bound in several places of one scope (if/else branches) is not one knob
    counts: dict[tuple[str, int], int] = {}
    for name, _, scope in candidates:
        counts[(name, id(scope))] = counts.get((name, id(scope)), 0) + 1
    candidates = [c for c in candidates if counts[(c[0], id(c[2]))] == 1]
    order = rng.permutation(len(candidates)) if candidates else []
    for i in order:
        name, value, scope = candidates[int(i)]
        new = _stepped(name, value, rng)
        if new is None:
            continue
        tree = copy.deepcopy(tree)
        if scope is None:
            tree.body = [
                n for n in tree.body
                if not (isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
                        and n.targets[0].id == name)
            ]
            tree = _Inline(name, new).visit(tree)
        else:
            host = next(f for f in _host_functions(tree) if f.name == scope.name)
            _drop_local_binding(host, name)
            _Inline(name, new).visit(host)
        return Applied(tree, f"{name}={value}->{new}")
    return None


def _drop_local_binding(host: ast.FunctionDef, name: str) -> None:
    """Remove `name` from its (single) binding in `host`: a plain assignment goes, a tuple
    assignment loses that element (a 1-tuple becomes a plain one)."""
    for parent in ast.walk(host):
        for field in ("body", "orelse"):
            stmts = getattr(parent, field, None)
            if not isinstance(stmts, list):
                continue
            for i, st in enumerate(list(stmts)):
                if not (isinstance(st, ast.Assign) and len(st.targets) == 1):
                    continue
                t, v = st.targets[0], st.value
                if isinstance(t, ast.Name) and t.id == name:
                    stmts[i] = ast.Pass()
                    return
                if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple):
                    keep = [(e, x) for e, x in zip(t.elts, v.elts, strict=True)
                            if not (isinstance(e, ast.Name) and e.id == name)]
                    if len(keep) == len(t.elts):
                        continue
                    if len(keep) == 1:
                        st.targets, st.value = [keep[0][0]], keep[0][1]
                    else:
                        t.elts, v.elts = [e for e, _ in keep], [x for _, x in keep]
                    return


def _launch_value(tree: ast.Module, call: ast.Call, name: str) -> int | None:
    kw = _kw(call, name)
    if kw is None:
        return None
    v = _int_const(kw.value)
    if v is None and isinstance(kw.value, ast.Name):
        v = _module_ints(tree).get(kw.value.id)
    return v


def launch_warps(tree: ast.Module, rng: np.random.Generator) -> Applied | None:
    """num_warps of one launch set to a literal power of two other than its value."""
    if not _launches(tree, options=True):
        return None
    tree = copy.deepcopy(tree)
    _, call, kname = _pick(rng, _launches(tree, options=True))
    old = _launch_value(tree, call, "num_warps") or 4
    options = [w for w in (1, 2, 4, 8, 16) if w != old and 0.25 <= w / old <= 4]
    new = _pick(rng, options)
    _set_kw(call, "num_warps", ast.Constant(new))
    return Applied(tree, f"{kname}:num_warps={old}->{new}")


def launch_stages(tree: ast.Module, rng: np.random.Generator) -> Applied | None:
    """num_stages of one launch set (or added) to another pipelining depth."""
    if not _launches(tree, options=True):
        return None
    tree = copy.deepcopy(tree)
    _, call, kname = _pick(rng, _launches(tree, options=True))
    old = _launch_value(tree, call, "num_stages")
    options = [s for s in (1, 2, 3, 4, 5) if s != (old if old is not None else 3)]
    new = _pick(rng, options)
    _set_kw(call, "num_stages", ast.Constant(new))
    return Applied(tree, f"{kname}:num_stages={old if old is not None else 'default'}->{new}")


def _loops(tree: ast.Module) -> list[tuple[ast.FunctionDef, ast.For]]:
    """(kernel, loop) of every `for` over range / tl.range inside a jit function."""
    out = []
    for fn in jit_functions(tree):
        for n in ast.walk(fn):
            if isinstance(n, ast.For) and isinstance(n.iter, ast.Call) and (
                (isinstance(n.iter.func, ast.Name) and n.iter.func.id == "range")
                or _is_tl(n.iter.func, "range")
            ):
                out.append((fn, n))
    return out


def _tl_attr(name: str) -> ast.Attribute:
    return ast.Attribute(value=ast.Name("tl", ast.Load()), attr=name, ctx=ast.Load())


def loop_pipeline(tree: ast.Module, rng: np.random.Generator) -> Applied | None:
    """One kernel loop: range -> tl.range(num_stages=s); tl.range -> another num_stages or range."""
    if not _loops(tree):
        return None
    tree = copy.deepcopy(tree)
    loops = _loops(tree)
    idx = int(rng.integers(len(loops)))
    fn, loop = loops[idx]
    call = loop.iter
    if isinstance(call.func, ast.Name):
        stages = int(_pick(rng, (2, 3, 4)))
        call.func = _tl_attr("range")
        _set_kw(call, "num_stages", ast.Constant(stages))
        return Applied(tree, f"{fn.name}:loop{idx}:range->tl.range(num_stages={stages})")
    old = _int_const(_kw(call, "num_stages").value) if _kw(call, "num_stages") else None
    if old is None or rng.random() < 0.5:
        call.func = ast.Name("range", ast.Load())
        call.keywords = []
        return Applied(tree, f"{fn.name}:loop{idx}:tl.range->range")
    new = _pick(rng, [s for s in (1, 2, 3, 4) if s != old])
    _set_kw(call, "num_stages", ast.Constant(new))
    return Applied(tree, f"{fn.name}:loop{idx}:num_stages={old}->{new}")


def _constexpr_params(fn: ast.FunctionDef) -> set[str]:
    out = set()
    for a in fn.args.args:
        ann = a.annotation
        if ann is not None and (_is_tl(ann, "constexpr") or (isinstance(ann, ast.Name) and ann.id == "constexpr")):
            out.add(a.arg)
    return out


def _compile_time(node: ast.expr, constexprs: set[str]) -> bool:
    """Built from literals and constexpr parameters only (so tl.static_range can unroll it)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id not in constexprs:
            return False
        if isinstance(n, ast.Call | ast.Attribute | ast.Subscript):
            return False
    return True


def loop_unroll(tree: ast.Module, rng: np.random.Generator) -> Applied | None:
    """One kernel loop unrolled: fully (tl.static_range) when its bounds are compile-time and the
    trip count is small enough to know, else by 2 or 4 (tl.range loop_unroll_factor)."""
    if not _loops(tree):
        return None
    tree = copy.deepcopy(tree)
    loops = _loops(tree)
    idx = int(rng.integers(len(loops)))
    fn, loop = loops[idx]
    call = loop.iter
    if all(_compile_time(a, _constexpr_params(fn)) for a in call.args) and not call.keywords:
        call.func = _tl_attr("static_range")
        return Applied(tree, f"{fn.name}:loop{idx}:static_range")
    factor = int(_pick(rng, (2, 4)))
    call.func = _tl_attr("range")
    _set_kw(call, "loop_unroll_factor", ast.Constant(factor))
    return Applied(tree, f"{fn.name}:loop{idx}:unroll={factor}")


class _BarrierBeforeStores(ast.NodeTransformer):
    def __init__(self):
        self.n = 0

    def _block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out = []
        for st in stmts:
            if (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)
                    and (_is_tl(st.value.func, "store") or _is_tl(st.value.func, "atomic_add"))):
                out.append(ast.Expr(ast.Call(_tl_attr("debug_barrier"), [], [])))
                self.n += 1
            out.append(st)
        return out

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        for field in ("body", "orelse"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                setattr(node, field, self._block(stmts))
        return node


def debug_barrier(tree: ast.Module, rng: np.random.Generator) -> Applied | None:
    """tl.debug_barrier() before every store of one kernel: a block-wide sync per store."""
    kernels = [f for f in jit_functions(tree) if _tl_calls(f, "store")]
    if not kernels:
        return None
    tree = copy.deepcopy(tree)
    kernels = [f for f in jit_functions(tree) if _tl_calls(f, "store")]
    fn = _pick(rng, kernels)
    t = _BarrierBeforeStores()
    t.visit(fn)
    return Applied(tree, f"{fn.name}:barriers={t.n}") if t.n else None


_EVICTION = ("evict_first", "evict_last", "")
_CACHE = (".ca", ".cg", "")


def load_hints(tree: ast.Module, rng: np.random.Generator) -> Applied | None:
    """Every load of one kernel gets one drawn eviction policy or cache modifier (not both:
    Triton 3.6's sm_90 codegen fails on loads that carry both), other than the first load's."""
    kernels = [f for f in jit_functions(tree) if _tl_calls(f, "load")]
    if not kernels:
        return None
    tree = copy.deepcopy(tree)
    kernels = [f for f in jit_functions(tree) if _tl_calls(f, "load")]
    fn = _pick(rng, kernels)
    loads = _tl_calls(fn, "load")

    def current(call: ast.Call, name: str) -> str:
        kw = _kw(call, name)
        return kw.value.value if kw is not None and isinstance(kw.value, ast.Constant) else ""

    old = (current(loads[0], "eviction_policy"), current(loads[0], "cache_modifier"))
    options = [(e, c) for e in _EVICTION for c in _CACHE if (e, c) != old and not (e and c)]
    ev, cm = _pick(rng, options)
    for call in loads:
        call.keywords = [k for k in call.keywords if k.arg not in ("eviction_policy", "cache_modifier")]
        if ev:
            call.keywords.append(ast.keyword("eviction_policy", ast.Constant(ev)))
        if cm:
            call.keywords.append(ast.keyword("cache_modifier", ast.Constant(cm)))
    return Applied(tree, f"{fn.name}:loads={len(loads)}:eviction={ev or 'none'},cache={cm or 'none'}")


class _MaskSelect(ast.NodeTransformer):
    def __init__(self):
        self.n = 0

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        mask, other = _kw(node, "mask"), _kw(node, "other")
        if not (_is_tl(node.func, "load") and mask is not None and other is not None):
            return node
        node.keywords = [k for k in node.keywords if k.arg != "other"]
        self.n += 1
        return ast.Call(_tl_attr("where"), [copy.deepcopy(mask.value), node, other.value], [])


def mask_select(tree: ast.Module, rng: np.random.Generator) -> Applied | None:
    """Masked loads of one kernel without `other`, the padding applied by tl.where afterwards
    (the masked-off lanes are undefined until selected: same values, different code)."""
    kernels = [f for f in jit_functions(tree)
               if any(_kw(c, "mask") and _kw(c, "other") for c in _tl_calls(f, "load"))]
    if not kernels:
        return None
    tree = copy.deepcopy(tree)
    kernels = [f for f in jit_functions(tree)
               if any(_kw(c, "mask") and _kw(c, "other") for c in _tl_calls(f, "load"))]
    fn = _pick(rng, kernels)
    t = _MaskSelect()
    t.visit(fn)
    return Applied(tree, f"{fn.name}:selects={t.n}") if t.n else None


def acc_precision(tree: ast.Module, rng: np.random.Generator) -> Applied | None:
    """One `.to(tl.float32)` of a kernel lowered to fp16, or one dot's input precision changed.
    Whether the task's tolerance allows it is the correctness check's answer, not this rule's."""
    sites: list[tuple[str, ast.Call, int]] = []
    for fn in jit_functions(tree):
        for n in ast.walk(fn):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "to"
                    and n.args and _is_tl(n.args[0], "float32")):
                sites.append(("upcast", n, len(sites)))
            elif isinstance(n, ast.Call) and _is_tl(n.func, "dot"):
                sites.append(("dot", n, len(sites)))
    if not sites:
        return None
    which = int(rng.integers(len(sites)))
    tree = copy.deepcopy(tree)
    fresh: list[ast.Call] = []
    for fn in jit_functions(tree):
        for n in ast.walk(fn):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "to"
                    and n.args and _is_tl(n.args[0], "float32")) or (
                    isinstance(n, ast.Call) and _is_tl(n.func, "dot")):
                fresh.append(n)
    kind, _, _ = sites[which]
    call = fresh[which]
    if kind == "upcast":
        call.args[0] = _tl_attr("float16")
        return Applied(tree, f"upcast{which}:fp32->fp16")
    prec = _pick(rng, ("ieee", "tf32x3", "tf32"))
    _set_kw(call, "input_precision", ast.Constant(prec))
    return Applied(tree, f"dot{which}:input_precision={prec}")


# -- launch restructuring ----------------------------------------------------------------------


class _ProgramId0(ast.NodeTransformer):
    """tl.program_id(0) / tl.program_id(axis=0) -> a replacement expression."""

    def __init__(self, make: Callable[[ast.Call], ast.expr]):
        self.make, self.n = make, 0

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if _is_tl(node.func, "program_id"):
            axis = node.args[0] if node.args else (_kw(node, "axis").value if _kw(node, "axis") else None)
            if _int_const(axis) == 0:
                self.n += 1
                return self.make(node)
        return node


def _restructurable(tree: ast.Module) -> list[tuple[ast.FunctionDef, ast.Call, str, ast.FunctionDef]]:
    """Launches of kernels that use program_id(0) but neither num_programs nor a return, launched
    as a statement with a grid that is a tuple (literal or a local name bound to one), and launched
    nowhere else: the rules add a kernel argument that only the rewritten launch passes (trimul's
    gate and layernorm kernels, each launched at two sites, came out missing it at the other)."""
    kernels = {f.name: f for f in jit_functions(tree)}
    launches = _launches(tree)
    sites = Counter(kname for _host, _call, kname in launches)
    out = []
    for host, call, kname in launches:
        if sites[kname] > 1:
            continue
        k = kernels[kname]
        if _tl_calls(k, "num_programs") or any(isinstance(n, ast.Return) for n in ast.walk(k)):
            continue
        if not any(_int_const(c.args[0] if c.args else None) == 0 for c in _tl_calls(k, "program_id")):
            continue
        if any(isinstance(n, ast.Lambda) for n in ast.walk(call.func.slice)):
            continue
        lambdas = {t.id for n in ast.walk(host) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Lambda)
                   for t in n.targets if isinstance(t, ast.Name)}
        if isinstance(call.func.slice, ast.Name) and call.func.slice.id in lambdas:
            continue
        if not any(isinstance(st, ast.Expr) and st.value is call for st in ast.walk(host)):
            continue
        if "PID0_OFFSET" in {a.arg for a in k.args.args} or "GRID0" in {a.arg for a in k.args.args}:
            continue
        out.append((host, call, kname, k))
    return out


def _replace_stmt(host: ast.FunctionDef, call: ast.Call, new: list[ast.stmt]) -> None:
    for parent in ast.walk(host):
        for field in ("body", "orelse"):
            stmts = getattr(parent, field, None)
            if isinstance(stmts, list):
                for i, st in enumerate(stmts):
                    if isinstance(st, ast.Expr) and st.value is call:
                        stmts[i:i + 1] = new
                        return


def _stmts(code: str) -> list[ast.stmt]:
    return ast.parse(code).body


def split_launch(tree: ast.Module, rng: np.random.Generator) -> Applied | None:
    """One launch becomes two over halves of grid axis 0; the kernel reads its program id as
    tl.program_id(0) + PID0_OFFSET (a new runtime argument)."""
    if not _restructurable(tree):
        return None
    tree = copy.deepcopy(tree)
    host, call, kname, k = _pick(rng, _restructurable(tree))
    k.args.args.append(ast.arg("PID0_OFFSET"))
    _ProgramId0(lambda n: ast.BinOp(n, ast.Add(), ast.Name("PID0_OFFSET", ast.Load()))).visit(k)
    grid = call.func.slice
    first, second = copy.deepcopy(call), copy.deepcopy(call)
    first.func.slice = ast.parse("(_half,) + _g[1:]", mode="eval").body
    second.func.slice = ast.parse("(_g[0] - _half,) + _g[1:]", mode="eval").body
    first.keywords.insert(0, ast.keyword("PID0_OFFSET", ast.Constant(0)))
    second.keywords.insert(0, ast.keyword("PID0_OFFSET", ast.Name("_half", ast.Load())))
    pre = _stmts("_g = tuple(GRID)\n_half = (_g[0] + 1) // 2")
    pre[0].value.args[0] = grid
    guard = _stmts("if _g[0] - _half > 0:\n    pass")[0]
    guard.body = [ast.Expr(second)]
    _replace_stmt(host, call, pre + [ast.Expr(first), guard])
    return Applied(tree, f"{kname}:two_launches")


def rows_per_program(tree: ast.Module, rng: np.random.Generator) -> Applied | None:
    """Each program of grid axis 0 does R (2 or 4) programs' work: the kernel body runs in a
    tl.static_range(R) loop on program id tl.program_id(0) * R + r, guarded by r < GRID0, and the
    launch grid shrinks to cdiv(grid[0], R)."""
    if not _restructurable(tree):
        return None
    tree = copy.deepcopy(tree)
    host, call, kname, k = _pick(rng, _restructurable(tree))
    rows = int(_pick(rng, (2, 4)))
    k.args.args.append(ast.arg("GRID0"))
    body = k.body
    doc = []
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        doc, body = [body[0]], body[1:]
    _ProgramId0(lambda n: ast.Name("_pid0", ast.Load())).visit(ast.Module(body=body, type_ignores=[]))
    loop = _stmts(f"for _r in tl.static_range({rows}):\n    _pid0 = tl.program_id(0) * {rows} + _r\n"
                  "    if _pid0 < GRID0:\n        pass")[0]
    loop.body[1].body = body
    k.body = doc + [loop]
    grid = call.func.slice
    call.func.slice = ast.parse(f"(triton.cdiv(_g[0], {rows}),) + _g[1:]", mode="eval").body
    call.keywords.insert(0, ast.keyword("GRID0", ast.parse("_g[0]", mode="eval").body))
    pre = _stmts("_g = tuple(GRID)")
    pre[0].value.args[0] = grid
    _replace_stmt(host, call, pre + [ast.Expr(call)])
    return Applied(tree, f"{kname}:rows_per_program={rows}")


RULES: dict[str, Rule] = {
    "inline_constant": inline_constant,
    "launch_warps": launch_warps,
    "launch_stages": launch_stages,
    "loop_pipeline": loop_pipeline,
    "loop_unroll": loop_unroll,
    "debug_barrier": debug_barrier,
    "load_hints": load_hints,
    "mask_select": mask_select,
    "acc_precision": acc_precision,
    "split_launch": split_launch,
    "rows_per_program": rows_per_program,
}


# =============================================================================================
# Children
# =============================================================================================


def _neutral_docstring(tree: ast.Module, task: str) -> ast.Module:
    doc = ast.Expr(ast.Constant(f"{task}: a Triton kernel module; custom_kernel(data) launches it."))
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    tree.body = [doc] + body
    return tree


def rewrite_source(
    source: str, task: str, rules: Sequence[str], seed: int, n_rules: int = 1
) -> tuple[str, list[str]] | None:
    """Apply `n_rules` of `rules` (tried in a seeded order; those with nothing to change are
    skipped) to `source`.

    Returns:
        (child source, ["rule:detail", ...]) or None when fewer than n_rules applied.

    Raises:
        RewriteError: the source does not parse or has no custom_kernel.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise RewriteError(f"source does not parse: {exc.msg} (line {exc.lineno})") from None
    if not any(isinstance(n, ast.FunctionDef) and n.name == "custom_kernel" for n in tree.body):
        raise RewriteError("source defines no custom_kernel")
    unknown = [r for r in rules if r not in RULES]
    if unknown:
        raise RewriteError(f"unknown rewrite rule(s): {', '.join(unknown)}; known: {', '.join(RULES)}")
    rng = np.random.default_rng(seed)
    done: list[str] = []
    for i in rng.permutation(len(rules)):
        name = rules[int(i)]
        applied = RULES[name](tree, rng)
        if applied is None:
            continue
        tree = applied.tree
        done.append(f"{name}:{applied.detail}")
        if len(done) == n_rules:
            break
    if len(done) < n_rules:
        return None
    tree = ast.fix_missing_locations(_neutral_docstring(tree, task))
    return ast.unparse(tree) + "\n", done


def child_record(parent: Mapping[str, Any], source: str, applied: Sequence[str]) -> dict[str, Any]:
    """KERNEL_BATCH_SCHEMA row of a rewritten child of `parent`: metadata empty, lineage set."""
    names = [a.split(":", 1)[0] for a in applied]
    return kernel_record(source, parent["task"], "triton", f"{GENERATOR}:{names[0]}" if len(names) == 1 else GENERATOR,
                         GENERATOR_VERSION, parent_kernel_id=parent["kernel_id"], mutation="; ".join(applied))


def rewrite_children(
    parents: Iterable[Mapping[str, Any]],
    seed: int,
    rules: Sequence[str] | None = None,
    max_rules: int = 2,
    tries: int = 4,
) -> list[dict[str, Any]]:
    """One rewritten child per parent (when one of `tries` seeded attempts gives a new kernel),
    1..max_rules rules each; ids unique across the output and distinct from every parent's."""
    rules = list(rules or RULES)
    rng = np.random.default_rng(seed)
    parents = list(parents)
    seen = {p["kernel_id"] for p in parents}
    out = []
    for parent in parents:
        for _ in range(tries):
            n = int(rng.integers(1, max_rules + 1))
            try:
                got = rewrite_source(parent["source"], parent["task"], rules, int(rng.integers(2**31)), n)
            except RewriteError:
                break
            if got is None:
                continue
            rec = child_record(parent, *got)
            if rec["kernel_id"] in seen:
                continue
            seen.add(rec["kernel_id"])
            out.append(rec)
            break
    return out


__all__ = [
    "GENERATOR",
    "GENERATOR_VERSION",
    "RULES",
    "RewriteError",
    "child_record",
    "jit_functions",
    "rewrite_children",
    "rewrite_source",
]
