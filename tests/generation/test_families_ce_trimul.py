"""Kernel families of cross_entropy and trimul: space size, rendering, interpreter correctness."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import itertools
import os
import random
import re

import numpy as np
import pytest

from pipelines.generation.space import Family
from pipelines.tasks import get_task

TASKS = ("cross_entropy", "trimul")
ALLOWED_IMPORTS = {"torch", "triton", "triton.language", "math"}
MIN_POINTS = 2000


def _families(task: str):
    module = importlib.import_module(f"pipelines.generation.families.{task}")
    return module.FAMILIES, module.SEED


def _valid_points(family: Family):
    names = [k.name for k in family.knobs]
    for combo in itertools.product(*(k.values for k in family.knobs)):
        values = dict(zip(names, combo))
        if family.is_valid(values):
            yield values


def _middle_point(family: Family) -> dict:
    """The middle value of every knob domain, or the valid point nearest to it (by index distance)."""
    middle = {k.name: k.values[len(k.values) // 2] for k in family.knobs}
    if family.is_valid(middle):
        return middle

    def distance(values):
        return sum(abs(k.values.index(values[k.name]) - len(k.values) // 2) for k in family.knobs)

    return min(_valid_points(family), key=distance)


def _all_families():
    return [(task, f) for task in TASKS for f in _families(task)[0]]


def _inputs(task, case):
    case = dict(case)
    seed = case.pop("seed")
    return task.generate_input(seed=seed, **case)


@pytest.fixture(scope="module", autouse=True)
def _interpreter_bf16_dot():
    """Triton 3.6's interpreter multiplies the raw uint16 bits of bf16 tl.dot operands; upcast
    them to fp32 first (what the tensor cores compute, up to accumulation order). GPUs are
    unaffected; without this the bf16 trimul kernels read as wrong on CPU."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_dot

    def upcast(handle):
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        data = interpreter._convert_float(handle.data, tl.bfloat16, tl.float32, None).view(np.float32)
        return interpreter.TensorHandle(data, tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, upcast(a), upcast(b), d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = create_dot
    yield
    interpreter.InterpreterBuilder.create_dot = original


# ---------------------------------------------------------------------------------------------
# The space
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("task_name", TASKS)
def test_space_has_enough_distinct_valid_points(task_name):
    families, _ = _families(task_name)
    points = [(f, v) for f in families for v in _valid_points(f)]
    assert len(points) >= MIN_POINTS
    for f in families:
        assert f.task == task_name
        assert any(True for _ in _valid_points(f)), f"{f.algorithm} has no valid point"
    assert len({f.algorithm for f in families}) == len(families) >= 5

    sample = random.Random(0).sample(points, 200)
    sources = {f.render(v) for f, v in sample}
    assert len(sources) == len(sample), "two knob points rendered the same source"


@pytest.mark.parametrize("task_name", TASKS)
def test_knob_domains_follow_the_naming_rules(task_name):
    for f in _families(task_name)[0]:
        for knob in f.knobs:
            assert knob.name.isupper() or knob.name.islower(), knob.name
            assert len(set(knob.values)) == len(knob.values) >= 2, f"{f.algorithm}.{knob.name}"
            if knob.name.isupper() and all(isinstance(x, int) for x in knob.values):
                assert list(knob.values) == sorted(knob.values), f"{f.algorithm}.{knob.name} unordered"


@pytest.mark.parametrize(("task_name", "family"), _all_families(), ids=lambda x: getattr(x, "algorithm", x))
def test_rendered_module_reads_like_a_tutorial(task_name, family):
    values = _middle_point(family)
    source = family.render(values)
    tree = ast.parse(source)
    doc = ast.get_docstring(tree)
    assert doc and family.algorithm in doc and task_name in doc
    for name, value in values.items():
        assert re.search(rf"\b{name}\b = {re.escape(repr(value))}", doc), f"knob {name} not in docstring"
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    assert imported <= ALLOWED_IMPORTS, imported
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "custom_kernel" in functions
    jitted = [
        n for n in functions.values()
        if any(ast.unparse(d).startswith("triton.jit") for d in n.decorator_list)
    ]
    assert jitted, "no @triton.jit kernel"
    for kernel in jitted:
        assert "# pointers" in ast.get_source_segment(source, kernel) or "# pointers" in source
    assert "print(" not in source and "time." not in source
    assert "num_warps=" in source
    # UPPER_CASE launch knobs appear as values in the code, not only in the docstring
    body = source.split('"""', 2)[2]
    for name, value in values.items():
        if name.isupper():
            assert str(value) in body, f"{name}={value} not in code"


@pytest.mark.parametrize("task_name", TASKS)
def test_seed_is_a_valid_point(task_name):
    families, (algorithm, values) = _families(task_name)
    family = {f.algorithm: f for f in families}[algorithm]
    assert family.is_valid(values)


# ---------------------------------------------------------------------------------------------
# Correctness under the Triton interpreter (CPU tensors)
# ---------------------------------------------------------------------------------------------

def _run_and_check(load_kernel, task_name, family, values, cases):
    task = get_task(task_name)
    module = load_kernel(family.render(values))
    for case in cases:
        data = _inputs(task, case)
        ok, msg = task.check_implementation(data, module.custom_kernel(data))
        assert ok, f"{family.algorithm} {values} on {task.case_id(case)}: {msg}"


_CE = [f for t, f in _all_families() if t == "cross_entropy"]
_TRIMUL = [f for t, f in _all_families() if t == "trimul"]


@pytest.mark.parametrize("family", _CE, ids=lambda f: f.algorithm)
def test_cross_entropy_family_middle_point_is_correct(load_kernel, family):
    task = get_task("cross_entropy")
    _run_and_check(load_kernel, "cross_entropy", family, _middle_point(family), task.correctness_cases[:1])


def test_cross_entropy_extreme_points_are_correct(load_kernel):
    """First and last valid points (smallest and largest tiles) of every family, ragged V = 517."""
    task = get_task("cross_entropy")
    case = min(task.correctness_cases, key=lambda c: c["B"] * c["V"])
    for family in _CE:
        points = list(_valid_points(family))
        for values in (points[0], points[-1]):
            _run_and_check(load_kernel, "cross_entropy", family, values, [case])


@pytest.mark.slow
@pytest.mark.parametrize("family", _TRIMUL, ids=lambda f: f.algorithm)
def test_trimul_family_middle_point_is_correct(load_kernel, family):
    task = get_task("trimul")
    _run_and_check(load_kernel, "trimul", family, _middle_point(family), task.correctness_cases[:1])


@pytest.mark.parametrize(
    "task_name", [pytest.param("cross_entropy"), pytest.param("trimul", marks=pytest.mark.slow)]
)
def test_seed_is_correct_on_every_correctness_case(load_kernel, task_name):
    families, (algorithm, values) = _families(task_name)
    family = {f.algorithm: f for f in families}[algorithm]
    _run_and_check(load_kernel, task_name, family, values, get_task(task_name).correctness_cases)
