"""Task contracts of cross_entropy and trimul: references, determinism, checks, benchmark cases."""

from __future__ import annotations

import pytest
import torch

from pipelines.tasks import get_task

TASKS = ("cross_entropy", "trimul")


def _inputs(task, case):
    case = dict(case)
    seed = case.pop("seed")
    return task.generate_input(seed=seed, **case)


def _tensors(data):
    """Every tensor inside a task input (tuples and weight dicts flattened)."""
    out = []
    for item in data:
        if isinstance(item, torch.Tensor):
            out.append(item)
        elif isinstance(item, dict):
            out.extend(v for v in item.values() if isinstance(v, torch.Tensor))
    return out


@pytest.mark.parametrize("name", TASKS)
def test_reference_passes_its_own_check_on_every_correctness_case(name):
    task = get_task(name)
    assert 2 <= len(task.correctness_cases) <= 3
    for case in task.correctness_cases:
        data = _inputs(task, case)
        before = [t.clone() for t in _tensors(data)]
        ok, msg = task.check_implementation(data, task.ref_kernel(data))
        assert ok, f"{task.case_id(case)}: {msg}"
        # the reference must not modify its inputs
        for old, new in zip(before, _tensors(data), strict=True):
            assert torch.equal(old, new)


@pytest.mark.parametrize("name", TASKS)
def test_inputs_are_deterministic_by_seed(name):
    task = get_task(name)
    case = dict(task.correctness_cases[0])
    a, b = _inputs(task, case), _inputs(task, case)
    c = _inputs(task, {**case, "seed": case["seed"] + 1})
    for x, y in zip(_tensors(a), _tensors(b), strict=True):
        assert torch.equal(x, y)
    assert not torch.equal(_tensors(a)[0], _tensors(c)[0])


def test_cross_entropy_reference_matches_autograd():
    task = get_task("cross_entropy")
    logits, targets = _inputs(task, task.correctness_cases[1])
    loss, grad = task.ref_kernel((logits, targets))
    x = logits.float().requires_grad_(True)
    expected = torch.nn.functional.cross_entropy(x, targets, reduction="none")
    expected.sum().backward()
    assert loss.dtype == torch.float32 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss, expected.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.float(), x.grad, rtol=1e-2, atol=1e-6)


def test_cross_entropy_check_rejects_wrong_outputs():
    task = get_task("cross_entropy")
    data = _inputs(task, task.correctness_cases[0])
    loss, grad = task.ref_kernel(data)

    ok, msg = task.check_implementation(data, (loss + 0.5, grad))
    assert not ok and "loss" in msg
    # the softmax part is ~1/V per entry: dropping it must fail despite its tiny magnitude
    onehot_only = torch.zeros_like(grad)
    onehot_only[torch.arange(grad.shape[0]), data[1]] = -1.0
    ok, msg = task.check_implementation(data, (loss, onehot_only))
    assert not ok and "grad" in msg
    ok, msg = task.check_implementation(data, (loss, grad.float()))
    assert not ok and "dtype" in msg
    ok, msg = task.check_implementation(data, loss)
    assert not ok
    # bf16 re-rounding noise of the right answer passes
    assert task.check_implementation(data, (loss * (1 + 1e-4), grad))[0]


def test_trimul_check_rejects_wrong_outputs():
    task = get_task("trimul")
    data = _inputs(task, task.correctness_cases[1])
    out = task.ref_kernel(data)
    ok, msg = task.check_implementation(data, out * 1.1 + 0.05)
    assert not ok and "Number of mismatched elements" in msg  # GPU MODE's verbose_allclose
    ok, msg = task.check_implementation(data, out[..., :-1])
    assert not ok and "SIZE MISMATCH" in msg
    # GPU MODE's check compares a tensor: a tuple is refused, as its verbose_allclose would
    ok, msg = task.check_implementation(data, (out, {}))
    assert not ok and "expected a tensor" in msg
    # NaN where the reference has NaN matches (GPU MODE), anywhere else it does not
    bad = out.clone()
    bad.view(-1)[0] = float("nan")
    assert not task.check_implementation(data, bad)[0]


def test_trimul_data_layout_matches_gpu_mode():
    task = get_task("trimul")
    x, mask, weights, config = _inputs(task, task.correctness_cases[1])  # masked, bs=2
    assert x.shape == (2, 20, 20, 48) and x.dtype == torch.float32
    assert mask.shape == (2, 20, 20) and set(mask.unique().tolist()) <= {0, 1}
    assert config == {"hidden_dim": 32, "dim": 48}
    assert weights["left_proj.weight"].shape == (32, 48)
    assert weights["to_out.weight"].shape == (48, 32)
    assert set(weights) == {
        "norm.weight", "norm.bias", "left_proj.weight", "right_proj.weight", "left_gate.weight",
        "right_gate.weight", "out_gate.weight", "to_out_norm.weight", "to_out_norm.bias", "to_out.weight",
    }
    _, mask_nm, _, _ = _inputs(task, task.correctness_cases[0])  # nomask
    assert torch.equal(mask_nm, torch.ones_like(mask_nm))


def test_trimul_reference_matches_explicit_loops():
    task = get_task("trimul")
    x, mask, w, config = _inputs(task, task.correctness_cases[1])
    out = task.ref_kernel((x, mask, w, config))
    ln = torch.nn.functional.layer_norm
    xn = ln(x, (48,), w["norm.weight"], w["norm.bias"])
    m = mask.float()[..., None]
    left = (xn @ w["left_proj.weight"].T) * m * torch.sigmoid(xn @ w["left_gate.weight"].T)
    right = (xn @ w["right_proj.weight"].T) * m * torch.sigmoid(xn @ w["right_gate.weight"].T)
    tri = torch.zeros_like(left)
    for k in range(x.shape[1]):  # out[b, i, j] += left[b, i, k] * right[b, j, k]
        tri += left[:, :, k, None, :] * right[:, None, :, k, :]
    y = ln(tri, (32,), w["to_out_norm.weight"], w["to_out_norm.bias"])
    y = (y * torch.sigmoid(xn @ w["out_gate.weight"].T)) @ w["to_out.weight"].T
    torch.testing.assert_close(out, y, rtol=1e-4, atol=1e-4)


def test_benchmark_cases():
    ce = get_task("cross_entropy")
    assert [(c["B"], c["V"]) for c in ce.benchmark_cases] == [(4096, 32000), (4096, 50264), (4096, 128256)]
    tri = get_task("trimul")
    got = [
        (c["seqlen"], c["bs"], c["dim"], c["hiddendim"], c["seed"], c["nomask"], c["distribution"])
        for c in tri.benchmark_cases
    ]
    assert got == [  # GPU MODE bioml/trimul task.yml, benchmarks
        (256, 2, 128, 128, 9371, True, "normal"),
        (768, 1, 128, 128, 381, True, "cauchy"),
        (256, 2, 384, 128, 2301, False, "normal"),
        (512, 1, 128, 128, 12819, True, "normal"),
        (1024, 1, 128, 128, 381, True, "cauchy"),
        (768, 1, 384, 128, 481, False, "normal"),
        (1024, 1, 384, 128, 23291, True, "normal"),
    ]
    assert tri.tolerances == {"rtol": 2e-2, "atol": 2e-2} and tri.source == "gpumode"
    for task in (ce, tri):
        assert task.description and "\n" not in task.description
        for case in task.benchmark_cases + task.correctness_cases:
            assert "seed" in case
