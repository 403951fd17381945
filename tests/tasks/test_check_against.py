"""`check_against(data, output, expected)` gives check_implementation's verdict when `expected`
is the reference's output, on every task: the verifier runs the reference once per input."""

from __future__ import annotations

import pytest
import torch

from pipelines.profiling.inputs import InputCache
from pipelines.profiling.verifier import ExpectedOutputs
from pipelines.tasks import all_tasks, get_task


def _inputs(task, case, salt=0):
    case = dict(case)
    seed = case.pop("seed") + salt
    return task.generate_input(seed=seed, **case)


def _spoiled(output):
    """The output with its first tensor's values changed far past any tolerance."""
    if isinstance(output, torch.Tensor):
        bad = output.clone()
        flat = bad.view(-1)
        flat[: max(1, flat.numel() // 3)] = (flat[: max(1, flat.numel() // 3)].float() + 7.0).to(bad.dtype)
        return bad
    first, *rest = output
    return (_spoiled(first), *rest)


@pytest.mark.parametrize("name", [t.name for t in all_tasks()])
def test_check_against_gives_check_implementations_verdict(name):
    task = get_task(name)
    assert task.check_against is not None
    case = task.correctness_cases[0]
    data = _inputs(task, case)
    expected = task.ref_kernel(data)
    for output in (task.ref_kernel(data), _spoiled(task.ref_kernel(data)), "not a tensor"):
        assert task.check_against(data, output, expected) == task.check_implementation(data, output)
    assert task.check_against(data, expected, expected)[0]
    assert not task.check_against(data, _spoiled(expected), expected)[0]


def test_expected_outputs_run_the_reference_once_per_input_and_drop_other_tasks_first():
    inputs = InputCache(max_bytes=1 << 30)
    softmax, rms = get_task("softmax"), get_task("rms_norm")
    case_s, case_r = softmax.correctness_cases[0], rms.correctness_cases[0]
    one = ExpectedOutputs(inputs, max_bytes=1 << 30)
    first = one.get(softmax, case_s, 0, {})
    assert one.get(softmax, case_s, 0, {}) is first and one.computed == 1
    assert torch.equal(first, softmax.ref_kernel(_inputs(softmax, case_s)))
    other_salt = one.get(softmax, case_s, 5, {})
    assert one.computed == 2 and torch.equal(other_salt, softmax.ref_kernel(_inputs(softmax, case_s, 5)))
    # the switches the reference ran under are part of the key (gpumode hands the kernel's over)
    one.get(softmax, case_s, 0, {"matmul_precision": "high"})
    assert one.computed == 3
    # a budget short of both outputs by a byte: the new task's output pushes the other task's out
    size_s = first.numel() * first.element_size()
    out_r = rms.ref_kernel(_inputs(rms, case_r))
    size_r = out_r.numel() * out_r.element_size()
    small = ExpectedOutputs(inputs, max_bytes=size_s + size_r - 1)
    small.get(softmax, case_s, 0, {})
    small.get(rms, case_r, 0, {})
    assert list(small.items) == [("rms_norm", rms.case_id(case_r), 0, ())]
    # an output larger than the whole budget is answered and not kept
    tiny = ExpectedOutputs(inputs, max_bytes=size_s - 1)
    assert torch.equal(tiny.get(softmax, case_s, 0, {}), first) and not tiny.items
    # the cached input is never handed to the reference itself
    cached = inputs.peek(softmax, case_s, 0)[0].clone()
    assert torch.equal(inputs.peek(softmax, case_s, 0)[0], cached)
