"""The library-triton style: records, determinism and spread of the generator; the device
questions its GPU sources ask and its interpreter renders answer; correctness of samples under
the Triton CPU interpreter (the product's checker); the file reader's compile and trace of a
sample per task on the sm_90 stand-in device."""

from __future__ import annotations

import json
import re

import pytest

from pipelines.generation.styles import library_triton as lt
from pipelines.generation.styles import style_module
from pipelines.generation.styles.library_kernels import space
from pipelines.tasks import TASK_MODULES
from warehouse.formats import KERNEL_BATCH_SCHEMA
from warehouse.ids import kernel_id

TASKS = tuple(TASK_MODULES)

# what a task's 200 programs must contain somewhere: how libraries ask the device and tune
DEVICE_MARKERS = {
    "sm_count": re.compile(r"multi_processor_count|\"multiprocessor_count\""),
    "driver": re.compile(r"triton\.runtime\.driver\.active"),
    "autotune": re.compile(r"@triton\.autotune"),
    "device_context": re.compile(r"torch\.cuda\.device\("),
}
NO_AUTOTUNE = {"fp8_quant"}  # the quantisers people bring launch fixed configs
DEVICE_QUERY = re.compile(r"torch\.cuda\.|driver\.active|\.warmup\(|_init_handles|n_regs")


@pytest.fixture(scope="module")
def batches():
    return {task: lt.generate(task, 200, 0) for task in TASKS}


def test_registered_as_a_style():
    assert style_module("library_triton") is lt
    assert lt.GENERATOR == "library-triton" and lt.GENERATOR_VERSION == "library-triton-1"


@pytest.mark.parametrize("task", TASKS)
def test_records_are_distinct_complete_and_deterministic(task, batches):
    records = batches[task]
    assert records == lt.generate(task, 200, 0)
    ids = [r["kernel_id"] for r in records]
    assert len(set(ids)) == len(ids) >= 150
    names = set(space(task).by_name)
    for r in records:
        assert list(r) == KERNEL_BATCH_SCHEMA.names
        assert r["task"] == task and r["language"] == "triton"
        assert (r["generator"], r["generator_version"]) == (lt.GENERATOR, lt.GENERATOR_VERSION)
        assert r["kernel_id"] == kernel_id(r["source"])
        assert r["algorithm"] in names
        assert r["parent_kernel_id"] is None and r["mutation"] is None
        assert r["knobs_json"] == json.dumps(json.loads(r["knobs_json"]), sort_keys=True)
        assert "def custom_kernel(data)" in r["source"] and "@triton.jit" in r["source"]
        compile(r["source"], r["kernel_id"], "exec")
    # every structure of the task is drawn
    assert {r["algorithm"] for r in records} == names


@pytest.mark.parametrize("task", TASKS)
def test_sources_ask_the_device_as_libraries_do(task, batches):
    text = "\n".join(r["source"] for r in batches[task])
    wanted = {k for k in DEVICE_MARKERS if not (k == "autotune" and task in NO_AUTOTUNE)}
    missing = [k for k in wanted if not DEVICE_MARKERS[k].search(text)]
    assert not missing, f"{task}: no program with {missing}"


@pytest.mark.parametrize("task", TASKS)
def test_interpreter_renders_answer_device_questions_with_constants(task, batches):
    for r in batches[task][:60]:
        check = lt.source_for_check(r)
        assert not DEVICE_QUERY.search(check), r["knobs_json"]
        assert check.count("triton.Config(") == check.count("@triton.autotune")  # one config each
        compile(check, "check", "exec")
    # the kernels themselves are the GPU source's: every @triton.jit function name survives
    r = batches[task][0]
    jit_names = set(re.findall(r"@triton\.jit\ndef (\w+)", r["source"]))
    assert jit_names <= set(re.findall(r"@triton\.jit\ndef (\w+)", lt.source_for_check(r)))


def test_seeds_pick_different_programs_and_counts_are_honoured():
    a, b = lt.generate("softmax", 50, 0), lt.generate("softmax", 50, 1)
    assert [r["kernel_id"] for r in a] != [r["kernel_id"] for r in b]
    assert len(lt.generate("trimul", 7, 3)) == 7
    assert lt.generate("rms_norm", 0, 0) == []


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown task 'no_such'"):
        lt.generate("no_such", 3, 0)
    with pytest.raises(ValueError, match="count must be >= 0"):
        lt.generate("softmax", -1, 0)
    with pytest.raises(ValueError, match="unknown structure"):
        lt.render("softmax", "no_such_structure", {})
    with pytest.raises(ValueError, match="not a library-triton record"):
        lt.source_for_check({"generator": "other", "task": "softmax", "algorithm": "row_block", "knobs_json": "{}"})


def _sample(task: str, per_task: int, seed: int) -> list[dict]:
    """`per_task` records of distinct structures (as far as they go), the lightest first for
    trimul, whose interpreter runs are the slowest."""
    records = lt.generate(task, 60, seed)
    picked, seen = [], set()
    for r in records:
        if r["algorithm"] not in seen and (task != "trimul" or r["algorithm"] != "unfused"):
            picked.append(r)
            seen.add(r["algorithm"])
        if len(picked) == per_task:
            break
    return picked


def _check(samples: list[tuple[str, dict]], config_of) -> list[str]:
    from pipelines.profiling.check import check_sources

    items = [(task, lt.source_for_check(r, config_of(r))) for task, r in samples]
    outcomes = check_sources(items, n_workers=2, timeout_s=300)
    return [f"{task} {r['algorithm']} {r['knobs_json']}: {o.failure_kind} {o.message}"
            for (task, r), o in zip(samples, outcomes, strict=True) if not o.ok]


def test_samples_are_correct_under_the_interpreter():
    samples = [(t, r) for t in TASKS for r in _sample(t, 1 if t == "trimul" else 2, seed=11)]
    failures = _check(samples, lambda r: 0)
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_wider_samples_are_correct_under_the_interpreter():
    samples = [(t, r) for t in TASKS for r in _sample(t, 3 if t == "trimul" else 8, seed=23)]
    # the autotune config the interpreter keeps rotates with the kernel id
    failures = _check(samples, lambda r: int(r["kernel_id"][:4], 16))
    assert not failures, "\n".join(failures)


def test_a_sample_per_task_compiles_for_sm90_and_traces():
    from pipelines.forecasting.source_features import source_features_many

    # a program per task that asks the device for its grid (persistent structures), fixed tiles
    records = []
    for task in TASKS:
        candidates = [r for r in lt.generate(task, 80, 5) if re.search(DEVICE_MARKERS["sm_count"], r["source"])
                      and "@triton.autotune" not in r["source"]]
        records.append(candidates[0])
    rows = source_features_many(records, n_workers=2, timeout_s=300)
    bad = [(r["task"], r["status"], r["compile_status"], r["error"]) for r in rows
           if r["status"] != "ok" or r["compile_status"] != "compiled"]
    assert not bad, bad
    assert all(r["n_kernels"] >= 1 and r["trace_cases"] >= 3 for r in rows)
