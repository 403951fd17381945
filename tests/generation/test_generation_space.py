"""Generation: registry, mutations, samplers and candidates, on a toy space and the real ones.

The toy space covers the test-only task `tiny_scale` (tests/fixtures_kernels/tiny_task.py,
y = 2x + 1), reached by child processes through KERNELCAST_TASK_MODULES.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from pipelines.generation import candidates, mutations, reference, registry, sampler
from pipelines.generation.registry import KernelPoint
from pipelines.generation.space import Family, Knob
from pipelines.tasks import TASK_MODULES
from warehouse.formats import KERNEL_BATCH_SCHEMA
from warehouse.ids import kernel_id

TOY = "tiny_scale"
TINY_TASK_FILE = Path(__file__).parent.parent / "fixtures_kernels" / "tiny_task.py"

_HEADER = '''"""tiny_scale: y = 2x + 1, family `{alg}`; knobs {knobs}."""
import torch
import triton
import triton.language as tl
'''


def _render_blocked(v) -> str:
    expr = "x * 2.0 + 1.0" if v["expr"] == "mul_add" else "tl.fma(x, 2.0, 1.0)"
    return (
        _HEADER.format(alg="blocked", knobs=json.dumps(dict(v), sort_keys=True))
        + f"""

@triton.jit
def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, {expr}, mask=mask)


def custom_kernel(data):
    y = torch.empty_like(data)
    n = data.numel()
    _scale[(triton.cdiv(n, {v["BLOCK"]}),)](data, y, n, BLOCK={v["BLOCK"]}, num_warps={v["NUM_WARPS"]})
    return y
"""
    )


def _render_grid_stride(v) -> str:
    return (
        _HEADER.format(alg="grid_stride", knobs=json.dumps(dict(v), sort_keys=True))
        + f"""

@triton.jit
def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr, PROGRAMS: tl.constexpr):
    for start in range(tl.program_id(0) * BLOCK, n, PROGRAMS * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(y_ptr + offs, x * 2.0 + 1.0, mask=mask)


def custom_kernel(data):
    y = torch.empty_like(data)
    n = data.numel()
    _scale[({v["PROGRAMS"]},)](data, y, n, BLOCK={v["BLOCK"]}, PROGRAMS={v["PROGRAMS"]},
                               num_warps={v["NUM_WARPS"]})
    return y
"""
    )


def _fits(v) -> bool:
    # at most 64 elements per thread: keeps registers sane
    return v["BLOCK"] // (32 * v["NUM_WARPS"]) <= 64


BLOCKS = (128, 256, 512, 1024, 2048, 4096, 8192)
WARPS = (1, 2, 4, 8)
TOY_FAMILIES = (
    Family(
        TOY,
        "blocked",
        "one masked block per program",
        (Knob("BLOCK", BLOCKS), Knob("NUM_WARPS", WARPS), Knob("expr", ("mul_add", "fma"))),
        _render_blocked,
        _fits,
    ),
    Family(
        TOY,
        "grid_stride",
        "a fixed grid strides over the vector",
        (Knob("BLOCK", BLOCKS), Knob("NUM_WARPS", WARPS), Knob("PROGRAMS", (64, 128, 256, 512))),
        _render_grid_stride,
        _fits,
    ),
)
TOY_SEED = ("blocked", {"BLOCK": 1024, "NUM_WARPS": 4, "expr": "mul_add"})


@pytest.fixture
def toy_space(monkeypatch):
    registry.register_space(TOY, TOY_FAMILIES, TOY_SEED)
    monkeypatch.setenv("KERNELCAST_TASK_MODULES", f"{TOY}={TINY_TASK_FILE}")
    yield TOY
    registry.unregister_space(TOY)


def _valid_count(fam: Family) -> int:
    return sum(1 for _ in registry.iter_family_points(fam))


# -- registry ----------------------------------------------------------------------------------


def test_missing_families_is_a_one_line_error():
    with pytest.raises(ValueError, match="no kernel families") as info:
        registry.families_for("no_such_task")
    assert "\n" not in str(info.value)


def test_count_and_iter_points_apply_the_constraint(toy_space):
    expected = sum(_valid_count(f) for f in TOY_FAMILIES)
    assert expected < 7 * 4 * 2 + 7 * 4 * 4  # the constraint removes some
    assert registry.count_points(TOY) == expected
    points = list(registry.iter_points(TOY))
    assert len({p.key for p in points}) == expected
    assert all(registry.is_valid_point(p) for p in points)


def test_make_record_matches_the_batch_schema(toy_space):
    point = registry.seed_point(TOY)
    rec = registry.make_record(point)
    assert list(rec) == KERNEL_BATCH_SCHEMA.names
    assert rec["kernel_id"] == kernel_id(rec["source"])
    assert rec["language"] == "triton" and rec["generator"] == "kernelcast-space"
    assert rec["generator_version"] == registry.GENERATOR_VERSION
    assert rec["knobs_json"] == '{"BLOCK": 1024, "NUM_WARPS": 4, "expr": "mul_add"}'
    assert rec["parent_kernel_id"] is None and rec["mutation"] is None
    assert registry.point_from_record(rec) == point


def test_render_refuses_an_invalid_point(toy_space):
    bad = KernelPoint(TOY, "blocked", {"BLOCK": 8192, "NUM_WARPS": 1, "expr": "fma"})  # 256/thread
    with pytest.raises(ValueError, match="invalid knobs"):
        registry.render_point(bad)


# -- mutations ---------------------------------------------------------------------------------


def test_neighbours_are_valid_and_change_exactly_one_choice(toy_space):
    for point in list(registry.iter_points(TOY))[::7]:
        kids = mutations.neighbours(point)
        assert kids, point.key
        assert len({c.key for c, _ in kids}) == len(kids)
        for child, label in kids:
            assert registry.is_valid_point(child)
            changed = mutations.changed_choices(point, child)
            assert len(changed) == 1, (point.key, child.key)
            name, _, values = label.partition(":")
            assert name == changed[0]
            old, new = values.split("->")
            if name == "algorithm":
                assert (old, new) == (point.algorithm, child.algorithm)
            else:
                assert (old, new) == (str(point.knobs[name]), str(child.knobs[name]))
                if name.isupper():  # ordered knob: an adjacent step
                    dom = registry.family(TOY, point.algorithm).knob(name).values
                    assert abs(dom.index(point.knobs[name]) - dom.index(child.knobs[name])) == 1


def test_family_switch_keeps_shared_knobs_and_fills_the_rest(toy_space):
    point = KernelPoint(TOY, "blocked", {"BLOCK": 256, "NUM_WARPS": 2, "expr": "fma"})
    switches = {lab: c for c, lab in mutations.family_switches(point)}
    child = switches["algorithm:blocked->grid_stride"]
    assert child.knobs == {"BLOCK": 256, "NUM_WARPS": 2, "PROGRAMS": 256}  # PROGRAMS: the middle
    back = {lab: c for c, lab in mutations.family_switches(child)}["algorithm:grid_stride->blocked"]
    assert back.knobs == {"BLOCK": 256, "NUM_WARPS": 2, "expr": "mul_add"}  # expr: the seed's


def test_random_mutation_is_deterministic(toy_space):
    point = registry.seed_point(TOY)
    a = [mutations.random_mutation(point, np.random.default_rng(3)) for _ in range(3)]
    b = [mutations.random_mutation(point, np.random.default_rng(3)) for _ in range(3)]
    assert [(c.key, m) for c, m in a] == [(c.key, m) for c, m in b]
    everything = {c.key for c, _ in mutations.neighbours(point)}
    assert mutations.random_mutation(point, np.random.default_rng(0), exclude=everything) is None


def test_space_mutator_makes_a_child_record(toy_space):
    parent = registry.make_record(registry.seed_point(TOY))
    child = mutations.SpaceMutator().mutate(parent, np.random.default_rng(1))
    assert child["parent_kernel_id"] == parent["kernel_id"]
    assert child["kernel_id"] != parent["kernel_id"] and ":" in child["mutation"]


# -- samplers ----------------------------------------------------------------------------------


def test_lineage_is_deterministic_and_a_tree(toy_space):
    a = sampler.generate_lineage(TOY, 60, seed=7)
    b = sampler.generate_lineage(TOY, 60, seed=7)
    c = sampler.generate_lineage(TOY, 60, seed=8)
    ids = [r["kernel_id"] for r in a]
    assert ids == [r["kernel_id"] for r in b]
    assert ids != [r["kernel_id"] for r in c]
    assert len(set(ids)) == 60
    assert a[0]["parent_kernel_id"] is None and a[0]["mutation"] is None
    assert a[0]["kernel_id"] == registry.make_record(registry.seed_point(TOY))["kernel_id"]
    position = {k: i for i, k in enumerate(ids)}
    for i, rec in enumerate(a[1:], start=1):
        assert position[rec["parent_kernel_id"]] < i  # every parent exists, made earlier
        parent = registry.point_from_record(a[position[rec["parent_kernel_id"]]])
        assert mutations.changed_choices(parent, registry.point_from_record(rec))
        assert rec["mutation"]
    assert {r["algorithm"] for r in a} == {"blocked", "grid_stride"}


def test_lineage_exhausts_the_space_then_says_so(toy_space):
    total = registry.count_points(TOY)
    assert sampler.reachable_count(TOY) == total  # family switches connect the whole toy space
    full = sampler.generate_lineage(TOY, total, seed=0)
    assert len({r["kernel_id"] for r in full}) == total
    with pytest.raises(ValueError, match="reachable"):
        sampler.generate_lineage(TOY, total + 1, seed=0)


def test_uniform_sample_is_stratified_and_deterministic(toy_space):
    a = sampler.sample_uniform(TOY, 40, seed=1)
    assert [r["kernel_id"] for r in a] == [
        r["kernel_id"] for r in sampler.sample_uniform(TOY, 40, seed=1)
    ]
    counts = pl.DataFrame(a).group_by("algorithm").len()
    assert dict(counts.iter_rows()) == {"blocked": 20, "grid_stride": 20}
    assert all(r["parent_kernel_id"] is None for r in a)
    small = _valid_count(TOY_FAMILIES[0])  # more than one family's worth: the other takes over
    b = sampler.sample_uniform(TOY, small + 30, seed=2)
    assert len({r["kernel_id"] for r in b}) == small + 30


# -- the real task spaces ----------------------------------------------------------------------


def _families_exist(task: str) -> bool:
    return importlib.util.find_spec(f"pipelines.generation.families.{task}") is not None


@pytest.mark.parametrize("task", list(TASK_MODULES))
def test_every_task_space_reaches_2000_kernels(task):
    if not _families_exist(task):
        pytest.skip(f"no families module for {task} yet")
    assert sampler.reachable_count(task, limit=2000) >= 2000
    # and a lineage renders distinct sources from the seed on
    recs = sampler.generate_lineage(task, 40, seed=0)
    assert len({r["kernel_id"] for r in recs}) == 40
    assert all("def custom_kernel" in r["source"] for r in recs)


def test_reference_record_wraps_the_task_reference():
    rec = reference.reference_record("softmax")
    assert list(rec) == KERNEL_BATCH_SCHEMA.names
    assert (rec["language"], rec["generator"], rec["algorithm"]) == (
        "pytorch",
        "reference",
        "reference",
    )
    assert rec["kernel_id"] == kernel_id(rec["source"])
    assert "from pipelines.tasks.softmax import TASK" in rec["source"]
    namespace: dict = {}
    exec(compile(rec["source"], "<reference>", "exec"), namespace)  # noqa: S102 - our own code
    import torch

    from pipelines.tasks import get_task

    task = get_task("softmax")
    case = dict(task.correctness_cases[0])
    data = task.generate_input(seed=case.pop("seed"), **case)
    assert torch.equal(namespace["custom_kernel"](data), task.ref_kernel(data))
    with pytest.raises(ValueError, match="unknown task"):
        reference.reference_record("nope")


# -- candidates --------------------------------------------------------------------------------


def test_candidates_without_workers_and_batch_roundtrip(toy_space, tmp_path):
    stages = []
    frame = candidates.build_candidates(
        TOY, 12, seed=3, compile=False, progress=lambda s, d, n: stages.append(s)
    )
    assert frame.height == 12 and set(stages) == {"generate"}  # tiny_scale is not a registry task
    assert frame.columns == KERNEL_BATCH_SCHEMA.names + list(candidates.FEATURE_COLUMNS)
    assert frame["compile_status"].null_count() == 12
    path = candidates.write_batch(frame, tmp_path / "b" / "batch.parquet")
    schema = pq.read_schema(path)
    assert schema.names[: len(KERNEL_BATCH_SCHEMA)] == KERNEL_BATCH_SCHEMA.names
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).compression == "ZSTD"
    back = pl.read_parquet(path)
    assert back["kernel_id"].to_list() == frame["kernel_id"].to_list()
    with pytest.raises(ValueError, match="mode"):
        candidates.build_candidates(TOY, 2, seed=0, compile=False, mode="nope")


@pytest.mark.slow
def test_candidates_compile_and_check_and_generation_rate(toy_space, tmp_path, capsys):
    start = time.perf_counter()
    frame = candidates.build_candidates(
        TOY,
        8,
        seed=5,
        check=True,
        compile=True,
        case="correctness",
        n_workers=2,
        check_timeout_s=120,
    )
    seconds = time.perf_counter() - start
    assert frame["compile_status"].to_list() == ["compiled"] * 8, frame["compile_error"].to_list()
    assert all(r > 0 for r in frame["n_regs"].to_list())
    assert frame["check_ok"].to_list() == [True] * 8, frame["check_message"].to_list()
    candidates.write_batch(frame, tmp_path / "batch.parquet")
    with capsys.disabled():
        print(f"\n[generation] 8 toy kernels generated+compiled+checked in {seconds:.1f} s")


def test_a_smaller_count_gives_a_prefix(toy_space):
    # the kernel_candidates asset checks a prefix sample of the same lineage on CPU
    for draw in (sampler.generate_lineage, sampler.sample_uniform):
        long = [r["kernel_id"] for r in draw(TOY, 50, seed=4)]
        short = [r["kernel_id"] for r in draw(TOY, 9, seed=4)]
        assert short == long[:9], draw.__name__


# -- restricted samples (batches biased to chosen algorithms) -------------------------------------


def test_bin_fill_algorithms_name_real_families():
    for task, algorithms in sampler.BIN_FILL_ALGORITHMS.items():
        for name in algorithms:
            assert registry.family(task, name).algorithm == name


def test_sample_algorithms_is_restricted_distinct_and_deterministic():
    recs = sampler.sample_algorithms("rms_norm", 30, seed=3)
    again = sampler.sample_algorithms("rms_norm", 30, seed=3)
    assert [r["kernel_id"] for r in recs] == [r["kernel_id"] for r in again]
    assert len({r["kernel_id"] for r in recs}) == 30
    assert {r["algorithm"] for r in recs} == {"grid_capped_two_pass"}
    assert all(list(r) == KERNEL_BATCH_SCHEMA.names for r in recs)
    assert all(r["parent_kernel_id"] is None and r["mutation"] is None for r in recs)
    other = sampler.sample_algorithms("rms_norm", 30, seed=4)
    assert [r["kernel_id"] for r in other] != [r["kernel_id"] for r in recs]
    two = sampler.sample_algorithms("softmax", 10, seed=0, algorithms=["grid_capped_online", "three_pass"])
    assert {r["algorithm"] for r in two} == {"grid_capped_online", "three_pass"}
    with pytest.raises(ValueError, match="no algorithm"):
        sampler.sample_algorithms("softmax", 3, seed=0, algorithms=["nope"])
