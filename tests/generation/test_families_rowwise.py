"""Kernel families of the row-wise tasks: the space is large and distinct, and kernels are correct
under the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1 on CPU hosts)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import itertools
import random

import pytest
import torch

from pipelines.generation.families import _rowwise as rw
from pipelines.tasks import get_task

# The interpreter itself indexes with 1-element arrays (numpy deprecation); not our code.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)

TASKS = ("softmax", "rms_norm", "layer_norm", "fp8_quant")
ALLOWED_IMPORTS = {"torch", "triton", "triton.language", "math"}


def families(task: str):
    return importlib.import_module(f"pipelines.generation.families.{task}")


def valid_points(fam):
    """Every valid knob assignment of a family, in domain order."""
    names = [k.name for k in fam.knobs]
    for combo in itertools.product(*[k.values for k in fam.knobs]):
        values = dict(zip(names, combo))
        if fam.is_valid(values):
            yield values


def run_and_check(load_kernel, task_name: str, source: str, case: dict) -> None:
    task = get_task(task_name)
    data = task.generate_input(**case)
    out = load_kernel(source).custom_kernel(data)
    ok, msg = task.check_implementation(data, out)
    assert ok, f"{task_name} {case}: {msg}"


FAMILY_IDS = [(t, f.algorithm) for t in TASKS for f in families(t).FAMILIES]


# -----------------------------------------------------------------------------
# The space
# -----------------------------------------------------------------------------
@pytest.mark.parametrize("task", TASKS)
def test_space_has_at_least_2000_valid_points(task):
    mod = families(task)
    counts = {f.algorithm: sum(1 for _ in valid_points(f)) for f in mod.FAMILIES}
    assert all(n > 0 for n in counts.values()), counts
    assert sum(counts.values()) >= 2000, counts
    assert len(mod.FAMILIES) >= 5
    assert len({f.algorithm for f in mod.FAMILIES}) == len(mod.FAMILIES)


@pytest.mark.parametrize("task", TASKS)
def test_sampled_points_render_distinct_tutorial_style_sources(task):
    mod = families(task)
    points = [(f, v) for f in mod.FAMILIES for v in valid_points(f)]
    sample = random.Random(0).sample(points, 200)
    sources = set()
    for fam, values in sample:
        src = fam.render(values)
        sources.add(src)
        tree = ast.parse(src)
        doc = ast.get_docstring(tree)
        assert doc.startswith(f"{task}: {fam.algorithm}")
        for name, value in values.items():
            assert f"{name}={value}" in doc
            if name.isupper():
                assert f"\n{name} = {value!r}" in src
        imports = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imports |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert imports <= ALLOWED_IMPORTS, imports
        assert "def custom_kernel(data)" in src and "@triton.jit" in src
        assert "print(" not in src and "time." not in src
        assert "num_warps=NUM_WARPS" in src
    assert len(sources) == len(sample)


@pytest.mark.parametrize("task", TASKS)
def test_knob_domains_and_seed(task):
    mod = families(task)
    for fam in mod.FAMILIES:
        assert fam.task == task
        for knob in fam.knobs:
            assert knob.name.isupper() or knob.name.islower(), knob.name
            assert len(knob.values) >= 2 and len(set(knob.values)) == len(knob.values)
        assert fam.is_valid(rw.default_point(fam))
    algorithm, values = mod.SEED
    seed_family = next(f for f in mod.FAMILIES if f.algorithm == algorithm)
    assert seed_family.is_valid(values)


def test_constraints_reject_register_hungry_blocks():
    fam = next(f for f in families("softmax").FAMILIES if f.algorithm == "three_pass")
    base = {"BLOCK_N": 4096, "NUM_WARPS": 1, "NUM_STAGES": 1, "eviction": "none", "exp_impl": "exp"}
    assert not fam.is_valid(base)
    assert fam.is_valid({**base, "NUM_WARPS": 2})


# -----------------------------------------------------------------------------
# Correctness under the interpreter
# -----------------------------------------------------------------------------
@pytest.mark.parametrize(("task", "algorithm"), FAMILY_IDS, ids=[f"{t}-{a}" for t, a in FAMILY_IDS])
def test_family_default_point_is_correct(task, algorithm, load_kernel):
    fam = next(f for f in families(task).FAMILIES if f.algorithm == algorithm)
    case = get_task(task).correctness_cases[0]
    run_and_check(load_kernel, task, fam.render(rw.default_point(fam)), case)


@pytest.mark.parametrize("task", TASKS)
def test_seed_kernel_is_correct_on_every_case(task, load_kernel):
    algorithm, values = families(task).SEED
    fam = next(f for f in families(task).FAMILIES if f.algorithm == algorithm)
    source = fam.render(values)
    for case in get_task(task).correctness_cases:
        run_and_check(load_kernel, task, source, case)


@pytest.mark.slow
@pytest.mark.parametrize("task", ("softmax", "rms_norm", "layer_norm"))
def test_extreme_points_are_correct(task, load_kernel):
    """The smallest and largest blocks of the looped families (masking at both ends)."""
    case = {"M": 3, "N": 100, "seed": 5}  # ragged and short, so BLOCK_N=16 loops stay cheap
    for fam in families(task).FAMILIES:
        if fam.knobs[0].name != "BLOCK_N":
            continue
        points = list(valid_points(fam))
        for values in (points[0], points[-1]):
            run_and_check(load_kernel, task, fam.render(values), case)


@pytest.mark.parametrize("rounding", ("cvt", "bits"))
def test_fp8_kernel_rounds_like_torch_across_binades(rounding, load_kernel):
    """Values whose e4m3 rounding carries into the next binade (the interpreter's own cast gets
    127.99 -> 64); the kernel's q must equal torch's cast bit for bit (up to the sign of zero)."""
    fam = next(f for f in families("fp8_quant").FAMILIES if f.algorithm == "group_tile")
    values = {
        "GROUPS_PER_PROGRAM": 2,
        "NUM_WARPS": 4,
        "scale_math": "div",
        "rounding": rounding,
        "eviction": "none",
    }
    module = load_kernel(fam.render(values))
    # group 0: absmax 448 -> scale 1, so q = x exactly; values just below powers of two and odd steps
    edges = torch.tensor(
        [448.0, 127.5, 63.9, 31.99, 15.9, 7.97, 3.99, 1.99, 0.999, 0.0155, 0.003, -0.002]
    )
    row0 = torch.cat([edges, torch.linspace(-448.0, 448.0, 128 - edges.numel())])
    row1 = torch.linspace(-3.0, 5.0, 128)  # group 1: a scale that is not a power of two
    x = torch.cat([row0, row1]).reshape(1, 256).to(torch.bfloat16)
    q, s = module.custom_kernel((x,))
    q_ref, s_ref = get_task("fp8_quant").ref_kernel((x,))
    assert torch.allclose(s, s_ref, rtol=1e-6, atol=0)
    differ = (q.view(torch.uint8) != q_ref.view(torch.uint8)) & (q_ref.float() != 0)
    assert not differ.any(), (q.float()[differ], q_ref.float()[differ])
    assert torch.equal(q.float() == 0, q_ref.float() == 0)


@pytest.mark.parametrize("task", TASKS)
def test_seed_kernel_honours_row_strides(task, load_kernel):
    """Inputs that are row-strided views (padding after each row) give the same answer."""
    t = get_task(task)
    case = {"M": 3, "K": 256, "seed": 7} if task == "fp8_quant" else {"M": 3, "N": 300, "seed": 7}
    x, *rest = t.generate_input(**case)
    padded = torch.zeros(x.shape[0], x.shape[1] + 128, dtype=x.dtype)
    padded[:, : x.shape[1]] = x
    view = padded[:, : x.shape[1]]
    assert view.stride(0) != view.shape[1]
    data = (view, *rest)
    algorithm, values = families(task).SEED
    fam = next(f for f in families(task).FAMILIES if f.algorithm == algorithm)
    out = load_kernel(fam.render(values)).custom_kernel(data)
    ok, msg = t.check_implementation(data, out)
    assert ok, msg
