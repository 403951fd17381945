"""Identities of what a verdict and a timing depend on, so a kernel that patches them is caught.

A kernel runs in the same process as the harness code that times it, so it could replace the
timer (`torch.cuda.Event.elapsed_time`), the synchronisation, the reference's ops or the
harness's own functions. `Watch` records, in a clean process before any kernel is imported:

* every callable and submodule of torch, torch.nn.functional, torch.linalg, torch.special,
  torch.fft, torch.cuda, torch.random, time, math, builtins, numpy, and every attribute of the
  harness modules (HARNESS_MODULES: runner and the modules it runs kernels with, timing and its
  loops, fresh_values, verify, shipping, integrity, child; the task modules; the GPU MODE
  helpers), by object identity, with each Python function's code, defaults and closure, and the
  method tables of the classes those modules define (`Measurer.time_fn`, `Timing.as_dict`);
* the method tables of torch.Tensor, its C base, torch.cuda.Event and Stream, torch.Generator;
* process-wide hooks: trace and profile functions, torch function and dispatch modes, Python
  kernels registered for aten/prims ops on real backends, the dispatcher entries of hot ops,
  and threads started by code that is not torch's or triton's.

`Watch.changes()` lists what differs from the baseline, taken once per child before any kernel
exists in it and never again (a call of `rebase` is refused and reported as a change, so a
kernel that patches the clock and then re-bases is caught); the children call it before each
kernel, after the import, after the correctness cases, after timing and after unloading the
kernel, and a kernel with any change is recorded as `tampered` (its child is then replaced, so
no later kernel runs in a patched process).
Reads only the standard library and torch. Attributes a module adds later (torch imports its
submodules lazily) are not changes; only replaced or removed ones are.
"""

from __future__ import annotations

import builtins
import math
import sys
import threading
import time
import types
from typing import Any

import torch

WATCHED_MODULES = (
    "torch", "torch.nn.functional", "torch.linalg", "torch.special", "torch.fft", "torch.cuda", "torch.random",
    "torch.backends.cuda", "torch.backends.cudnn", "time", "math", "numpy", "gc",
)
HARNESS_MODULES = (
    "pipelines.profiling.runner", "pipelines.profiling.kernel_loading", "pipelines.profiling.checked_calls",
    "pipelines.profiling.compile_child", "pipelines.profiling.timing", "pipelines.profiling.call_feed",
    "pipelines.profiling.clock_checks", "pipelines.profiling.cuda_timing", "pipelines.profiling.gpumode_timing",
    "pipelines.profiling.cpu_timing", "pipelines.profiling.verify", "pipelines.profiling.verifier",
    "pipelines.profiling.verdicts",
    "pipelines.profiling.shipping", "pipelines.profiling.ipc_handles", "pipelines.profiling.inputs",
    "pipelines.profiling.fresh_values", "pipelines.profiling.integrity", "pipelines.profiling.child",
    "pipelines.tasks.contract", "pipelines.tasks.gpumode_utils", "pipelines.tasks.gpumode",
)
WATCHED_CLASSES = ("torch.Tensor", "torch._C.TensorBase", "torch.cuda.Event", "torch.cuda.Stream", "torch.Generator")
HOT_OPS = (
    "aten::mm", "aten::bmm", "aten::addmm", "aten::matmul", "aten::linear", "aten::_softmax", "aten::softmax.int",
    "aten::native_layer_norm", "aten::layer_norm", "aten::add.Tensor", "aten::mul.Tensor", "aten::sub.Tensor",
    "aten::div.Tensor", "aten::sigmoid", "aten::exp", "aten::sum.dim_IntList", "aten::mean.dim", "aten::copy_",
    "aten::_to_copy", "aten::clone", "aten::empty.memory_format", "aten::gelu", "aten::_log_softmax",
    "aten::isclose", "aten::allclose", "aten::abs", "aten::sqrt", "aten::rsqrt", "aten::pow.Tensor_Scalar",
    "aten::amax", "aten::max.dim", "aten::einsum", "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention", "aten::scaled_dot_product_attention", "aten::baddbmm",
    "aten::fill_.Scalar", "aten::zero_", "aten::ne.Tensor", "aten::eq.Tensor", "aten::gt.Tensor",
)
REAL_KEYS = ("CPU", "CUDA", "CompositeImplicitAutograd", "CompositeExplicitAutograd", "Autograd", "AutogradCPU",
             "AutogradCUDA", "AutogradOther")
TRUSTED_THREAD_PREFIXES = ("torch", "triton", "threading", "concurrent", "multiprocessing", "queue", "logging", "tqdm")
# Replaced by torch itself when a kernel imports torch._dynamo (a wrapper whose __wrapped__ is
# the original): not a patch.
WRAPPED_BY_TORCH = ("torch.manual_seed", "torch.random.manual_seed")


def _resolve(dotted: str) -> Any:
    """An attribute path like 'torch._C.TensorBase' (None when missing)."""
    parts = dotted.split(".")
    obj = sys.modules.get(parts[0])
    for p in parts[1:]:
        obj = getattr(obj, p, None)
    return obj


def _function_identity(v: Any) -> tuple:
    """The identity of a callable: the object, and for Python functions what runs when called."""
    fn = getattr(v, "__func__", v)  # bound and class methods: the function inside
    if isinstance(fn, types.FunctionType):
        cells = tuple(id(c.cell_contents) if _filled(c) else None for c in (fn.__closure__ or ()))
        return (id(v), id(fn.__code__), id(fn.__defaults__), id(fn.__kwdefaults__), cells)
    return (id(v),)


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
        return True
    except ValueError:
        return False


def _module_entries(name: str, everything: bool) -> dict[str, tuple]:
    module = sys.modules.get(name)
    if module is None:
        return {}
    out: dict[str, tuple] = {}
    for attr, v in list(vars(module).items()):
        if everything or callable(v) or isinstance(v, types.ModuleType):
            out[f"{name}.{attr}"] = _function_identity(v) if callable(v) else (id(v),)
    out[f"sys.modules[{name}]"] = (id(module),)
    return out


def _class_entries(dotted: str) -> dict[str, tuple]:
    """A class's own attributes, plus the set of their names: an attribute added to a subclass
    (torch.Tensor.__mul__ over its C base's) shadows the inherited one, so additions count."""
    cls = _resolve(dotted)
    if not isinstance(cls, type):
        return {}
    own = dict(vars(cls))
    out = {f"{dotted}.{attr}": _function_identity(v) for attr, v in own.items()}
    out[f"{dotted} (attribute names)"] = tuple(sorted(own))
    return out


def _harness_classes(name: str) -> dict[str, tuple]:
    """The method tables of the classes module `name` defines (patched at class level, a method
    changes every instance at once)."""
    module = sys.modules.get(name)
    out: dict[str, tuple] = {}
    for attr, v in list(vars(module).items()) if module is not None else ():
        if isinstance(v, type) and v.__module__ == name:
            out.update(_class_entries(f"{name}.{attr}"))
    return out


def _dispatch_state() -> dict[str, tuple]:
    """Python kernels on real backends of aten/prims ops, and the hot ops' dispatcher lines."""
    out: dict[str, tuple] = {}
    dump = getattr(torch._C, "_dispatch_dump", None)
    if dump is not None:
        for op in HOT_OPS:
            try:
                text = dump(op)
            except RuntimeError:
                continue  # not an op of this torch version
            lines = tuple(ln for ln in text.splitlines() if ln.split(":", 1)[0].split(" ")[0] in REAL_KEYS)
            out[f"dispatcher {op}"] = lines
    for name, private in (("torch function modes", "_len_torch_function_stack"),
                          ("torch dispatch modes", "_len_torch_dispatch_stack")):
        counter = getattr(torch._C, private, None)  # private API: absent in some torch versions
        if counter is not None:
            out[name] = (counter(),)
    return out


def _library_impls() -> set[str]:
    """Python kernels registered through torch.library, as 'namespace/op.overload/key'."""
    return set(getattr(torch.library, "_impls", ()))


def _op_names() -> set[str]:
    try:
        return set(torch._C._dispatch_get_all_op_names())
    except (AttributeError, RuntimeError):
        return set()


def _overrides(new_impls: set[str], known_ops: set[str]) -> list[str]:
    """New Python kernels for ops that existed before, on a backend that really runs them
    (inductor defines new prims ops of its own, and meta kernels compute no values)."""
    out = []
    for entry in sorted(new_impls):
        parts = entry.split("/")
        if len(parts) == 3 and parts[0] in ("aten", "prims") and parts[2] in REAL_KEYS \
                and f"{parts[0]}::{parts[1]}" in known_ops:
            out.append(f"torch.library kernel {entry}")
    return out


def _hooks() -> dict[str, tuple]:
    out = {
        "sys.gettrace()": (id(sys.gettrace()),),
        "sys.getprofile()": (id(sys.getprofile()),),
        "threading trace hook": (id(getattr(threading, "_trace_hook", None)),),
        "threading profile hook": (id(getattr(threading, "_profile_hook", None)),),
        "sys.excepthook": (id(sys.excepthook),),
    }
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:  # Python 3.12+
        out["sys.monitoring tools"] = tuple(monitoring.get_tool(i) for i in range(6))
    return out


def _foreign_threads(known: set[int]) -> list[str]:
    """Live threads that were not there before and were not started by torch/triton code."""
    out = []
    for t in threading.enumerate():
        if t.ident in known or t is threading.main_thread():
            continue
        target = getattr(t, "_target", None) or getattr(type(t), "run", None)
        module = getattr(target, "__module__", "") or ""
        if not module.startswith(TRUSTED_THREAD_PREFIXES):
            out.append(f"thread {t.name!r} started by {module or 'unknown code'}")
    return out


_MISSING = object()
_EMPTY_CELL = object()


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY_CELL


def _held(v: Any) -> tuple | None:
    """What `_function_identity` reads of a Python function, as the objects themselves."""
    fn = getattr(v, "__func__", v)
    if not isinstance(fn, types.FunctionType):
        return None
    return (fn, fn.__code__, fn.__defaults__, fn.__kwdefaults__, tuple(_cell_value(c) for c in (fn.__closure__ or ())))


def _held_entries(name: str, everything: bool) -> list[tuple]:
    """`_module_entries` as (namespace, key, object, `_held` of it) rows that hold the objects."""
    module = sys.modules.get(name)
    if module is None:
        return []
    namespace = vars(module)
    rows = [(sys.modules, name, module, None)]
    for attr, v in list(namespace.items()):
        if everything or callable(v) or isinstance(v, types.ModuleType):
            rows.append((namespace, attr, v, _held(v) if callable(v) else None))
    return rows


def _held_class(dotted: str) -> tuple[list[tuple], list[tuple]]:
    """`_class_entries` as held rows, and (dotted name, class, its namespace, its names)."""
    cls = _resolve(dotted)
    if not isinstance(cls, type):
        return [], []
    namespace = cls.__dict__  # a live view of the class's attributes
    rows = [(namespace, attr, v, _held(v)) for attr, v in namespace.items()]
    return rows, [(dotted, cls, namespace, frozenset(namespace))]


class HeldBaseline:
    """The baseline's objects themselves (not their ids), for a quick "nothing changed" test.

    `Watch.changes` asks this first: when every watched name still refers to the very object it
    did (and each Python function to its code, defaults and closure contents), when no class
    gained an attribute and the dispatcher and hooks read the same, the full comparison would
    find nothing either, and is skipped. Anything else falls back to that comparison, which
    names the change. Holding the objects also keeps a freed original's id from being reused by
    a replacement. On 2 cores the test takes about a third of the full comparison's time
    (benchmarks/integrity.py).
    """

    def __init__(self, extra_modules: tuple[str, ...], baseline: dict[str, tuple]):
        self.rows: list[tuple] = []
        self.classes: list[tuple] = []
        for name in WATCHED_MODULES:
            self.rows += _held_entries(name, everything=False)
        for name in HARNESS_MODULES + tuple(extra_modules):
            self.add_module(name)
            module = sys.modules.get(name)
            for attr, v in list(vars(module).items()) if module is not None else ():
                if isinstance(v, type) and v.__module__ == name:
                    self._add_class(f"{name}.{attr}")
        for dotted in WATCHED_CLASSES:
            self._add_class(dotted)
        self.rows += _held_entries("builtins", everything=False)
        self.state = {k: v for k, v in baseline.items() if k.startswith("dispatcher ") or k in _STATE_KEYS}

    def add_module(self, name: str) -> None:
        self.rows += _held_entries(name, everything=True)

    def _add_class(self, dotted: str) -> None:
        rows, classes = _held_class(dotted)
        self.rows += rows
        self.classes += classes

    def unchanged(self) -> bool:
        for namespace, key, obj, held in self.rows:
            if namespace.get(key, _MISSING) is not obj:
                return False
            if held is not None:
                fn, code, defaults, kwdefaults, cells = held
                if fn.__code__ is not code or fn.__defaults__ is not defaults or fn.__kwdefaults__ is not kwdefaults:
                    return False
                for cell, value in zip(fn.__closure__ or (), cells):
                    if _cell_value(cell) is not value:
                        return False
        for dotted, cls, namespace, names in self.classes:
            if _resolve(dotted) is not cls or not names.issuperset(namespace):
                return False
        now = {**_dispatch_state(), **_hooks()}
        return all(now.get(k, ("missing",)) == v for k, v in self.state.items())


_STATE_KEYS = ("torch function modes", "torch dispatch modes", "sys.gettrace()", "sys.getprofile()",
               "threading trace hook", "threading profile hook", "sys.excepthook", "sys.monitoring tools")


def snapshot(extra_modules: tuple[str, ...] = ()) -> dict[str, tuple]:
    """The identities listed in the module docstring, keyed by a readable name."""
    snap: dict[str, tuple] = {}
    for name in WATCHED_MODULES:
        snap.update(_module_entries(name, everything=False))
    for name in HARNESS_MODULES + tuple(extra_modules):
        snap.update(_module_entries(name, everything=True))
        snap.update(_harness_classes(name))
    for dotted in WATCHED_CLASSES:
        snap.update(_class_entries(dotted))
    snap.update(_module_entries("builtins", everything=False))
    snap.update(_dispatch_state())
    snap.update(_hooks())
    return snap


class Watch:
    """A baseline of identities and a way to list what changed since.

    >>> w = Watch()
    >>> w.changes()
    []
    """

    def __init__(self, extra_modules: tuple[str, ...] = ()):
        self.extra_modules = tuple(extra_modules)
        self.rebased = False
        self._take()

    def rebase(self) -> None:
        """Refused: the baseline is taken once, when the watch is made. A call (only a kernel
        would make one) is remembered and listed by `changes`."""
        self.rebased = True

    def _take(self) -> None:
        self.baseline = snapshot(self.extra_modules)
        self.held = HeldBaseline(self.extra_modules, self.baseline)
        self.threads = {t.ident for t in threading.enumerate()}
        self.impls = _library_impls()
        self.ops = _op_names()
        self.originals = {name: _resolve(name) for name in WRAPPED_BY_TORCH}

    def add_module(self, name: str) -> None:
        """Watch one more module (a task module, loaded after the baseline) from now on."""
        if name not in self.extra_modules:
            self.extra_modules += (name,)
            self.baseline.update(_module_entries(name, everything=True))
            self.held.add_module(name)

    def _wrapped(self, name: str) -> bool:
        """A function torch itself wraps lazily, still wrapping the original."""
        if name not in self.originals:
            return False
        inner = getattr(_resolve(name), "__wrapped__", None)
        return inner is not None and inner is self.originals[name]

    def changes(self, limit: int = 5) -> list[str]:
        """Names whose identity changed or that disappeared (at most `limit`, plus a count)."""
        changed = ["the integrity baseline (a re-base was asked for)"] if self.rebased else []
        if not self.held.unchanged():  # the full comparison names what changed
            now = snapshot(self.extra_modules)
            changed += [k for k, v in self.baseline.items()
                        if now.get(k, ("missing",)) != v and not self._wrapped(k) and not k.endswith("(attribute names)")]
            for k, v in self.baseline.items():
                if k.endswith("(attribute names)"):
                    added = sorted(set(now.get(k, ())) - set(v))
                    changed += [f"{k[:-len(' (attribute names)')]}.{a} (added)" for a in added]
        changed += _overrides(_library_impls() - self.impls, self.ops)
        changed += _foreign_threads(self.threads)
        if len(changed) > limit:
            return changed[:limit] + [f"and {len(changed) - limit} more"]
        return changed


# Names the module keeps to itself: referenced so the harness modules' watch covers them too.
_WATCH_TOOLS = (builtins, math, time)
