"""The row-wise tasks (softmax, rms_norm, layer_norm, fp8_quant) honour the task contract on CPU."""

from __future__ import annotations

import inspect

import pytest
import torch

from pipelines.tasks import get_task

ROWWISE = ("softmax", "rms_norm", "layer_norm", "fp8_quant")


def _tensors(data):
    """The tensors inside one task input, in order."""
    return [d for d in data if isinstance(d, torch.Tensor)]


def _same(a, b) -> bool:
    ta, tb = _tensors(a), _tensors(b)
    return len(ta) == len(tb) and all(
        x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(ta, tb)
    )


@pytest.mark.parametrize("name", ROWWISE)
def test_task_identity_and_description(name):
    task = get_task(name)
    assert task.name == name
    assert len(task.description) > 200 and "bf" in task.description.lower()
    assert task.tolerances and all(v >= 0 for v in task.tolerances.values())


@pytest.mark.parametrize("name", ROWWISE)
def test_reference_passes_its_own_check_and_leaves_inputs_alone(name):
    task = get_task(name)
    assert 2 <= len(task.correctness_cases) <= 3
    for case in task.correctness_cases:
        data = task.generate_input(**case)
        before = [t.clone() for t in _tensors(data)]
        ok, msg = task.check_implementation(data, task.ref_kernel(data))
        assert ok, f"{name} {case}: {msg}"
        assert all(torch.equal(b, t) for b, t in zip(before, _tensors(data))), (
            "reference modified its input"
        )


@pytest.mark.parametrize("name", ROWWISE)
def test_inputs_are_deterministic_by_seed(name):
    task = get_task(name)
    case = dict(task.correctness_cases[0])
    a = task.generate_input(**case)
    b = task.generate_input(**case)
    case["seed"] += 1
    c = task.generate_input(**case)
    assert _same(a, b)
    assert not _same(a, c)
    assert all(t.device.type == "cpu" for t in _tensors(a))  # no GPU here: default_device() is cpu


def _assert_each_rejected(task, data, outputs) -> None:
    """Every output fails the task's check, with a message saying why."""
    for out in outputs:
        ok, msg = task.check_implementation(data, out)
        assert not ok and msg and msg != "ok"


@pytest.mark.parametrize("name", ("softmax", "rms_norm", "layer_norm"))
def test_wrong_outputs_fail_with_a_message(name):
    task = get_task(name)
    data = task.generate_input(**task.correctness_cases[0])
    ref = task.ref_kernel(data)
    wrong = [
        (ref.float() * 1.25).to(torch.bfloat16),  # off by 25 %
        torch.roll(ref, shifts=1, dims=0),  # rows swapped
        ref[:, :-1],  # wrong shape
        ref.float(),  # wrong dtype
    ]
    _assert_each_rejected(task, data, wrong)


def test_softmax_check_catches_all_zero_output():
    # With atol far below 1/N a zero output must fail, also through the row-sum test.
    task = get_task("softmax")
    data = task.generate_input(**task.correctness_cases[0])
    ok, msg = task.check_implementation(data, torch.zeros_like(task.ref_kernel(data)))
    assert not ok and "off" in msg


def test_fp8_wrong_outputs_fail_with_a_message():
    task = get_task("fp8_quant")
    data = task.generate_input(**task.correctness_cases[0])
    q, s = task.ref_kernel(data)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert s.shape == (q.shape[0], q.shape[1] // 128)
    wrong = [
        (q, s * 2),  # scales off
        ((q.float() * 0.5).to(torch.float8_e4m3fn), s),  # values off
        (q.float(), s),  # not fp8
        (q, s.double()),  # scales not fp32
        q,  # not a tuple
    ]
    _assert_each_rejected(task, data, wrong)


def test_fp8_scale_floor_on_an_all_zero_group():
    task = get_task("fp8_quant")
    data = task.generate_input(**task.correctness_cases[0])
    (x,) = data
    assert torch.count_nonzero(x[0, :128]) == 0
    q, s = task.ref_kernel(data)
    assert s[0, 0].item() == pytest.approx(1e-10 / 448, rel=1e-6)
    assert torch.count_nonzero(q[0, :128].float()) == 0


@pytest.mark.parametrize("name", ROWWISE)
def test_benchmark_cases_are_named_and_large(name):
    task = get_task(name)
    params = set(inspect.signature(task.generate_input).parameters)
    assert 3 <= len(task.benchmark_cases) <= 5
    for case in task.benchmark_cases:
        assert "seed" in case and set(case) <= params
        numel = case["M"] * case.get("N", case.get("K", 0))
        # the reference must run well over 50 us on an H200; the 256-row fp8 shapes are the paper's
        assert numel >= 2**20
    ids = {task.case_id(c) for c in task.benchmark_cases}
    assert len(ids) == len(task.benchmark_cases)


def test_fp8_benchmark_shapes_are_the_papers():
    shapes = {(c["M"], c["K"]) for c in get_task("fp8_quant").benchmark_cases}
    assert shapes == {(256, 4096), (256, 8192), (4096, 7168)}


def test_correctness_cases_are_ragged():
    for name in ("softmax", "rms_norm", "layer_norm"):
        cases = get_task(name).correctness_cases
        assert any(c["N"] & (c["N"] - 1) for c in cases), f"{name}: no non-power-of-two N"
        assert any(c["M"] & (c["M"] - 1) for c in cases), f"{name}: no non-power-of-two M"
