"""Kernel families of matmul_bias_gelu, causal_attention and gdn_chunk_fwd_o under the interpreter.

Every family's test point runs on the first correctness case; each task's SEED runs on all of
them; every lower-case (algorithm) knob value runs once; the spaces hold >= 2000 distinct points.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import itertools
import os
import random
from typing import Any

import pytest

from pipelines.generation.space import Family
from pipelines.tasks import get_task

TASKS = ("matmul_bias_gelu", "causal_attention", "gdn_chunk_fwd_o")
# Interpreter noise: masked-out rows (past the sequence end) compute exp(-inf - -inf) = nan and
# are never stored; loop bounds computed in-kernel reach range() as 1-element arrays.
pytestmark = [
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning"),
]
# Knobs whose larger values mean fewer, bigger programs: the interpreter runs those faster.
SPEED_KNOBS = ("BLOCK", "KEYS", "UNROLL", "ROWS", "EW_BLOCK")


def _families(task: str) -> tuple[tuple[Family, ...], tuple[str, dict]]:
    mod = importlib.import_module(f"pipelines.generation.families.{task}")
    return mod.FAMILIES, mod.SEED


def _valid_points(fam: Family):
    names = [k.name for k in fam.knobs]
    for combo in itertools.product(*(k.values for k in fam.knobs)):
        values = dict(zip(names, combo, strict=True))
        if fam.is_valid(values):
            yield values


def _test_point(fam: Family, **fixed: Any) -> dict[str, Any]:
    """The valid point nearest to 'speed knobs at their largest, others at their middle'."""
    target = {}
    for k in fam.knobs:
        if k.name in fixed:
            target[k.name] = k.values.index(fixed[k.name])
        elif k.name.startswith(SPEED_KNOBS):
            target[k.name] = len(k.values) - 1
        else:
            target[k.name] = (len(k.values) - 1) / 2
    best = None
    for values in _valid_points(fam):
        if any(values[n] != v for n, v in fixed.items()):
            continue
        dist = sum(abs(k.values.index(values[k.name]) - target[k.name]) for k in fam.knobs)
        if best is None or dist < best[0]:
            best = (dist, values)
    assert best is not None, f"{fam.algorithm}: no valid point with {fixed}"
    return best[1]


@pytest.fixture(scope="module", autouse=True)
def _interpreter_bf16_dot():
    """Triton 3.6's interpreter multiplies the raw uint16 bits of bf16 tl.dot operands
    (triton-lang/triton#11584); convert them to fp32 first, as the GPU's fp32 accumulate does."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16:
            a = self.cast_impl(a, tl.float32)
        if b.dtype.scalar == tl.bfloat16:
            b = self.cast_impl(b, tl.float32)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = create_dot
    yield
    interpreter.InterpreterBuilder.create_dot = original


def _run(load_kernel, task_name: str, fam: Family, values: dict, case_index: int = 0) -> None:
    task = get_task(task_name)
    data = task.generate_input(**task.correctness_cases[case_index])
    module = load_kernel(fam.render(values))
    ok, msg = task.check_implementation(data, module.custom_kernel(data))
    assert ok, f"{task_name}/{fam.algorithm} {values} case {case_index}: {msg}"


FAMILY_IDS = [(t, f.algorithm) for t in TASKS for f in _families(t)[0]]
SLOW_FAMILIES = {("gdn_chunk_fwd_o", "token_scalar"), ("gdn_chunk_fwd_o", "cuda_core_sub_chunk")}


def _family(task: str, algorithm: str) -> Family:
    return next(f for f in _families(task)[0] if f.algorithm == algorithm)


@pytest.mark.parametrize(
    ("task_name", "algorithm"),
    [
        pytest.param(*fid, marks=pytest.mark.slow) if fid in SLOW_FAMILIES else fid
        for fid in FAMILY_IDS
    ],
)
def test_family_test_point_is_correct(load_kernel, task_name: str, algorithm: str) -> None:
    fam = _family(task_name, algorithm)
    _run(load_kernel, task_name, fam, _test_point(fam))


@pytest.mark.parametrize("task_name", TASKS)
def test_seed_is_correct_on_every_correctness_case(load_kernel, task_name: str) -> None:
    families, (algorithm, values) = _families(task_name)
    fam = next(f for f in families if f.algorithm == algorithm)
    assert fam.is_valid(values)
    for i in range(len(get_task(task_name).correctness_cases)):
        _run(load_kernel, task_name, fam, values, case_index=i)


VARIANTS = [
    (t, f.algorithm, k.name, value)
    for t in TASKS
    for f in _families(t)[0]
    if (t, f.algorithm) not in SLOW_FAMILIES
    for k in f.knobs
    if k.name.islower()
    for value in k.values
    if value != _test_point(f)[k.name]
]


@pytest.mark.slow
@pytest.mark.parametrize(("task_name", "algorithm", "knob", "value"), VARIANTS)
def test_every_algorithm_choice_is_correct(
    load_kernel, task_name: str, algorithm: str, knob: str, value
) -> None:
    fam = _family(task_name, algorithm)
    _run(load_kernel, task_name, fam, _test_point(fam, **{knob: value}))


@pytest.mark.parametrize("task_name", TASKS)
def test_space_has_2000_distinct_valid_points(task_name: str) -> None:
    families, _ = _families(task_name)
    points = [(fam, values) for fam in families for values in _valid_points(fam)]
    assert len(points) >= 2000
    assert len({f.algorithm for f in families}) == len(families) >= 5
    sample = random.Random(0).sample(points, 200) + [(f, _test_point(f)) for f in families]
    sources = set()
    for fam, values in sample:
        src = fam.render(values)
        ast.parse(src)  # a syntactically valid module
        assert "def custom_kernel(data)" in src and "@triton.jit" in src
        assert "print(" not in src
        for name, value in values.items():
            assert f"{name} = {value!r}" in src  # the docstring states every knob
        sources.add(src)
    assert len(sources) == len({(f.algorithm, tuple(sorted(v.items()))) for f, v in sample})


@pytest.mark.parametrize("task_name", TASKS)
def test_knobs_follow_the_naming_convention(task_name: str) -> None:
    families, _ = _families(task_name)
    for fam in families:
        assert fam.task == task_name
        for knob in fam.knobs:
            assert knob.name.isupper() or knob.name.islower(), knob.name
            assert len(knob.values) >= 2 and len(set(knob.values)) == len(knob.values)


# Bin-fill families of gdn_chunk_fwd_o (aimed at 0.7x-2x of the reference on the H200).
GDN_BIN_FILL = ("grid_capped_fused", "torch_intra_triton_inter", "torch_terms_triton_gate")


@pytest.mark.parametrize("algorithm", GDN_BIN_FILL)
def test_gdn_bin_fill_family_is_correct_on_every_case(load_kernel, algorithm: str) -> None:
    fam = _family("gdn_chunk_fwd_o", algorithm)
    for i in range(len(get_task("gdn_chunk_fwd_o").correctness_cases)):
        _run(load_kernel, "gdn_chunk_fwd_o", fam, _test_point(fam), case_index=i)


def test_gdn_grid_capped_program_walks_several_tiles(load_kernel) -> None:
    """3 programs over 16 tiles (2 heads x 4 chunks, the last partial, x 2 ragged V blocks)."""
    task = get_task("gdn_chunk_fwd_o")
    fam = _family("gdn_chunk_fwd_o", "grid_capped_fused")
    values = _test_point(fam, PROGRAMS=3, BLOCK_V=64)
    data = task.generate_input(seed=41, B=1, T=200, H=2, K=32, V=80)
    ok, msg = task.check_implementation(data, load_kernel(fam.render(values)).custom_kernel(data))
    assert ok, f"grid_capped_fused {values}: {msg}"


def test_gdn_bin_fill_algorithms_are_sampled() -> None:
    from pipelines.generation import sampler

    assert set(GDN_BIN_FILL) <= set(sampler.BIN_FILL_ALGORITHMS["gdn_chunk_fwd_o"])
    records = sampler.sample_algorithms("gdn_chunk_fwd_o", 30, seed=7)
    assert len({r["kernel_id"] for r in records}) == 30
    assert {r["algorithm"] for r in records} == set(sampler.BIN_FILL_ALGORITHMS["gdn_chunk_fwd_o"])
