"""The pytorch-programs style: records, determinism, spread over compositions, readable modules,
and correctness of generated programs on the tasks' CPU inputs.

The fast tests run a sample of each task's programs (one per composition and one per driver) on
the task's smallest correctness case, in this process, and check them with the task's own
check_implementation; compiled programs run with torch.compile replaced by a recorder (Inductor
on this CPU takes minutes per graph), so the code handed to torch.compile is what is checked.
The slow test runs every program of generate(task, 250, 0) on every correctness case.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import sys
import types

import pytest
import torch

from pipelines.generation.styles import STYLE_MODULES, style_module
from pipelines.generation.styles import pytorch_programs as pp
from pipelines.generation.styles.pytorch_compositions.compose import DRIVER_KNOBS
from pipelines.tasks import TASK_MODULES, get_task
from warehouse.formats import KERNEL_BATCH_SCHEMA
from warehouse.ids import kernel_id

TASKS = list(TASK_MODULES)
COUNT = 250


@functools.cache
def _programs(task: str, count: int = COUNT, seed: int = 0) -> tuple[dict, ...]:
    return tuple(pp.generate(task, count, seed))


def _knobs(record: dict) -> dict:
    return json.loads(record["knobs_json"])


def _load(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    sys.modules[name] = module
    try:
        exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    finally:
        sys.modules.pop(name, None)
    return module


def _case_size(case: dict) -> int:
    size = 1
    for key, value in case.items():
        if key != "seed" and isinstance(value, int) and not isinstance(value, bool):
            size *= value
    return size


@functools.cache
def _smallest_case(task: str) -> tuple[dict, object]:
    """The task's smallest correctness case and its input (CPU: no GPU here)."""
    case = dict(min(get_task(task).correctness_cases, key=_case_size))
    seed = case.pop("seed")
    return case, get_task(task).generate_input(seed=seed, **case)


def _check(task: str, source: str, name: str, data=None) -> tuple[bool, str]:
    data = _smallest_case(task)[1] if data is None else data
    module = _load(source, name)
    return get_task(task).check_implementation(data, module.custom_kernel(data))


def _sample(task: str) -> list[dict]:
    """One uncompiled program per composition and one per driver, in generation order."""
    picked, seen = [], set()
    for record in _programs(task):
        knobs = _knobs(record)
        if knobs["compile"] is not None:
            continue
        for key in (("algorithm", record["algorithm"]), ("driver", knobs["driver"])):
            if key not in seen:
                seen.add(key)
                picked.append(record)
                break
    return picked


# ------------------------------------------------------------------------------------------------
# records


def test_the_style_is_registered_under_its_generator_name():
    assert STYLE_MODULES["pytorch_programs"] == pp.GENERATOR == "pytorch-programs"
    assert style_module("pytorch_programs") is pp
    assert pp.GENERATOR_VERSION == "pytorch-programs-1"


@pytest.mark.parametrize("task", TASKS)
def test_records_carry_the_schema_and_distinct_ids(task):
    records = _programs(task)
    assert len(records) >= 150
    ids = [r["kernel_id"] for r in records]
    assert len(set(ids)) == len(ids)
    names = {c.name for c in pp.space(task).compositions}
    for r in records:
        assert list(r) == KERNEL_BATCH_SCHEMA.names
        assert r["kernel_id"] == kernel_id(r["source"])
        assert (r["task"], r["language"], r["generator"], r["generator_version"]) == (
            task, "pytorch", "pytorch-programs", "pytorch-programs-1")
        assert r["parent_kernel_id"] is None and r["mutation"] is None
        assert r["algorithm"] in names
        knobs = _knobs(r)
        assert r["knobs_json"] == json.dumps(knobs, sort_keys=True)
        comp = next(c for c in pp.space(task).compositions if c.name == r["algorithm"])
        assert set(comp.axes) <= set(knobs) <= set(comp.axes) | set(DRIVER_KNOBS)


@pytest.mark.parametrize("task", TASKS)
def test_generation_is_deterministic_and_the_seed_matters(task):
    again = pp.generate(task, COUNT, 0)
    assert again == list(_programs(task))
    other = pp.generate(task, COUNT, 1)
    assert [r["kernel_id"] for r in other] != [r["kernel_id"] for r in again]
    # a smaller count draws the same programs first
    assert pp.generate(task, 40, 0) == list(_programs(task))[:40]


@pytest.mark.parametrize("task", TASKS)
def test_programs_spread_over_compositions_and_one_in_ten_is_compiled(task):
    records = _programs(task)
    by_algorithm: dict[str, int] = {}
    for r in records:
        by_algorithm[r["algorithm"]] = by_algorithm.get(r["algorithm"], 0) + 1
    assert set(by_algorithm) == {c.name for c in pp.space(task).compositions}
    assert max(by_algorithm.values()) <= 0.5 * len(records)
    compiled = [r for r in records if _knobs(r)["compile"] is not None]
    assert 0.05 * len(records) <= len(compiled) <= 0.15 * len(records)
    assert all(_knobs(r)["driver"] == "direct" for r in compiled)
    assert {_knobs(r)["driver"] for r in records} == {"direct", "split_cat", "chunk_cat",
                                                      "slice_assign", "split_copy"}


def test_bad_arguments_give_a_clear_error():
    with pytest.raises(ValueError, match="unknown task 'softmaks'"):
        pp.generate("softmaks", 10, 0)
    with pytest.raises(ValueError, match="count must be >= 0"):
        pp.generate("softmax", -1, 0)
    assert pp.generate("softmax", 0, 0) == []


# ------------------------------------------------------------------------------------------------
# the modules people read


@pytest.mark.parametrize("task", TASKS)
def test_every_program_is_a_readable_self_contained_module(task):
    for r in _programs(task):
        tree = ast.parse(r["source"])
        doc = ast.get_docstring(tree)
        assert doc and len(doc) > 80, r["algorithm"]
        kernels = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "custom_kernel"]
        assert len(kernels) == 1 and [a.arg for a in kernels[0].args.args] == ["data"]
        imported = {a.asname or a.name.split(".")[0] for n in tree.body
                    if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert "torch" in imported  # as in any kernel file, used or not
        assert imported - {"torch"} <= used, f"unused imports {imported - used} in {r['algorithm']}"
        assert not any(isinstance(n, (ast.Import, ast.ImportFrom)) for f in tree.body
                       if isinstance(f, ast.FunctionDef) for n in ast.walk(f))


@pytest.mark.parametrize("task", TASKS)
def test_compiled_programs_compile_lazily_once_with_their_mode(task, monkeypatch):
    """Importing compiles nothing; the first call compiles the core once, with the recorded mode,
    and the code it compiles is correct (run eagerly: torch.compile replaced by a recorder)."""
    calls: list[dict] = []

    def fake_compile(fn=None, **kw):
        calls.append(kw)
        return fn if fn is not None else (lambda f: f)

    compiled = [r for r in _programs(task) if _knobs(r)["compile"] is not None]
    assert compiled
    monkeypatch.setattr(torch, "compile", fake_compile)
    for i, r in enumerate(compiled[:6]):
        knobs = _knobs(r)
        calls.clear()
        ok, msg = _check(task, r["source"], f"pp_{task}_compiled_{i}")
        assert ok, f"{r['algorithm']} {r['knobs_json']}: {msg}"
        want = {} if knobs["compile"] == "default" else {"mode": knobs["compile"]}
        if knobs["dynamic"] is not None:
            want["dynamic"] = knobs["dynamic"]
        assert calls == [want], r["knobs_json"]
        if knobs["compile"] == "reduce-overhead":  # CUDA graphs reuse outputs: the program copies
            assert ".clone()" in r["source"]


# ------------------------------------------------------------------------------------------------
# correctness on the CPU


@pytest.mark.parametrize("task", TASKS)
def test_a_sample_of_programs_is_correct_on_the_smallest_case(task):
    failed = []
    for i, r in enumerate(_sample(task)):
        ok, msg = _check(task, r["source"], f"pp_{task}_{i}")
        if not ok:
            failed.append((r["algorithm"], r["knobs_json"], msg))
    assert not failed, failed


# Block-size constants of the drivers and of the compositions' own loops; GROUP (fp8's 128
# columns) and CHUNK (gdn's 64 tokens) are part of the task, never shrunk.
_BLOCK_CONSTANT = re.compile(r"^(\w+_PER_\w+|N_CHUNKS|BLOCK) = (\d+)$", re.M)


def _shrunk(source: str) -> str:
    """The program with every block small enough that the smallest case spans several blocks."""
    def small(m: re.Match) -> str:
        value = 1 if m.group(1) in ("HEADS_PER_BLOCK", "BATCHES_PER_BLOCK") else 3
        return f"{m.group(1)} = {value}"
    return _BLOCK_CONSTANT.sub(small, source)


@pytest.mark.parametrize("task", TASKS)
def test_blocked_programs_are_correct_when_the_input_spans_several_blocks(task):
    """The correctness cases are smaller than most blocks: shrink the blocks so that loops,
    slices, splits and the ragged last block run."""
    seen, failed = set(), []
    for i, r in enumerate(_programs(task)):
        knobs = _knobs(r)
        if knobs["compile"] is not None or not _BLOCK_CONSTANT.search(r["source"]):
            continue
        key = (r["algorithm"], knobs["driver"])
        if key in seen:
            continue
        seen.add(key)
        ok, msg = _check(task, _shrunk(r["source"]), f"pp_{task}_shrunk_{i}")
        if not ok:
            failed.append((r["algorithm"], r["knobs_json"], msg))
    assert len(seen) >= 4
    assert not failed, failed


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_all_programs_pass_every_correctness_case(task):
    """Every uncompiled program of generate(task, 250, 0) on every correctness case (CPU)."""
    t = get_task(task)
    inputs = []
    for case in t.correctness_cases:
        case = dict(case)
        seed = case.pop("seed")
        inputs.append(t.generate_input(seed=seed, **case))
    failed, ran = [], 0
    for i, r in enumerate(_programs(task)):
        if _knobs(r)["compile"] is not None:
            continue
        ran += 1
        for data in inputs:
            ok, msg = _check(task, r["source"], f"pp_{task}_all_{i}", data)
            if not ok:
                failed.append((r["algorithm"], r["knobs_json"], msg))
                break
    assert ran >= 0.85 * len(_programs(task))
    assert not failed, failed
