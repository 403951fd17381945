"""GPU MODE's submission contract: `task` and `utils` modules, trimul's inputs, reference and check.

Submissions in GPU MODE's style, written for these tests, live in tests/fixtures_kernels/gpumode/.
The facts checked against GPU MODE's trimul problem (reference-kernels, problems/bioml/trimul)
are its call sequence for inputs, its tolerance rule and its helpers' behaviour.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from orchestration.cli import app
from pipelines.tasks import get_task, gpumode, gpumode_utils

SUBMISSIONS = Path(__file__).parent.parent / "fixtures_kernels" / "gpumode"


def test_task_module_names_and_utils_are_importable_as_a_submission_does():
    task = get_task("trimul")
    gpumode.install(task)
    try:
        from task import TestSpec, input_t, output_t  # noqa: PLC0415 - what a submission writes
        from utils import (  # noqa: F401, PLC0415
            DisableCuDNNTF32,
            clear_l2_cache,
            make_match_reference,
            set_seed,
            verbose_allclose,
        )

        assert input_t.__name__ == "input_t" and output_t.__bound__ is not None
        assert set(TestSpec.__annotations__) >= {"seqlen", "bs", "dim", "hiddendim", "seed", "nomask"}
        import reference  # noqa: PLC0415

        case = dict(task.correctness_cases[0])
        x = reference.generate_input(**case)[0]
        assert x.shape == (case["bs"], case["seqlen"], case["seqlen"], case["dim"])
    finally:
        gpumode.uninstall()
    assert "task" not in sys.modules


def test_verbose_allclose_follows_gpu_modes_rule():
    nan, inf = float("nan"), float("inf")
    ok, _ = gpumode_utils.verbose_allclose(torch.tensor([1.0, nan, inf]), torch.tensor([1.0, nan, inf]))
    assert ok  # equal NaNs and equal infinities match
    ok, why = gpumode_utils.verbose_allclose(torch.tensor([1.0, 2.0]), torch.tensor([1.0, nan]))
    assert not ok and why[0] == "Number of mismatched elements: 1"
    ok, why = gpumode_utils.verbose_allclose(torch.tensor([inf]), torch.tensor([-inf]))
    assert not ok
    # |received - expected| <= atol + rtol * |expected|: 1.05 against 1.0 passes at rtol 0.05, 1.06 does not
    assert gpumode_utils.verbose_allclose(torch.tensor([1.05]), torch.tensor([1.0]), rtol=0.05, atol=0.0)[0]
    assert not gpumode_utils.verbose_allclose(torch.tensor([1.06]), torch.tensor([1.0]), rtol=0.05, atol=0.0)[0]
    assert gpumode_utils.verbose_allclose(torch.zeros(2), torch.zeros(3))[1] == ["SIZE MISMATCH"]
    check = gpumode_utils.make_match_reference(lambda d: d * 2, rtol=0, atol=0)
    assert check(torch.ones(2), torch.full((2,), 2.0)) == (True, "Maximum error: 0.0")
    assert not check(torch.ones(2), torch.ones(2))[0]


def test_disable_cudnn_tf32_restores_and_leaves_cublas_alone():
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic)
    cublas = torch.backends.cuda.matmul.allow_tf32
    with gpumode_utils.DisableCuDNNTF32():
        assert torch.backends.cudnn.allow_tf32 is False and torch.backends.cudnn.deterministic is True
        assert torch.backends.cuda.matmul.allow_tf32 == cublas  # as GPU MODE's: cuBLAS untouched
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic) == before


@pytest.mark.parametrize("distribution,nomask", [("normal", False), ("cauchy", True)])
def test_trimul_inputs_are_gpu_modes_call_sequence(distribution, nomask):
    """GPU MODE: normal input and mask from a Generator seeded with the case seed; Cauchy input
    and weights from the global generator (here seeded from the case seed, then restored)."""
    task = get_task("trimul")
    seed, bs, n, d, h = 4242, 1, 6, 8, 4
    state = torch.get_rng_state()
    x, mask, w, config = task.generate_input(seed=seed, seqlen=n, bs=bs, dim=d, hiddendim=h, nomask=nomask,
                                             distribution=distribution)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's global generator is untouched
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if distribution == "cauchy":
        ex = torch.distributions.Cauchy(0, 2).sample((bs, n, n, d)).to(torch.float32)
    else:
        ex = torch.randn((bs, n, n, d), dtype=torch.float32, generator=gen)
    emask = torch.ones(bs, n, n) if nomask else torch.randint(0, 2, (bs, n, n), generator=gen)
    expected_w = {
        "norm.weight": torch.randn(d), "norm.bias": torch.randn(d),
        "left_proj.weight": torch.randn(h, d) / math.sqrt(h), "right_proj.weight": torch.randn(h, d) / math.sqrt(h),
        "left_gate.weight": torch.randn(h, d) / math.sqrt(h), "right_gate.weight": torch.randn(h, d) / math.sqrt(h),
        "out_gate.weight": torch.randn(h, d) / math.sqrt(h), "to_out_norm.weight": torch.randn(h),
        "to_out.weight": torch.randn(d, h) / math.sqrt(d), "to_out_norm.bias": torch.randn(h),
    }
    torch.set_rng_state(state)
    assert torch.equal(x, ex) and torch.equal(mask, emask) and mask.dtype == emask.dtype
    assert list(w) == list(expected_w) and all(torch.equal(w[k], expected_w[k]) for k in w)
    assert config == {"hidden_dim": h, "dim": d}


def test_trimul_check_is_make_match_reference():
    task = get_task("trimul")
    case = dict(task.correctness_cases[2])  # Cauchy, masked
    data = task.generate_input(**case)
    ref = task.ref_kernel(data)
    assert task.check_implementation(data, ref)[0]
    # inside 2e-2 + 2e-2 |ref| everywhere: passes; one element just outside: fails with GPU MODE's report
    assert task.check_implementation(data, ref + 0.019 * (1 + ref.abs()))[0]
    bad = ref.clone()
    bad.view(-1)[3] += 0.021 * (1 + ref.view(-1)[3].abs()) + 1e-3
    ok, msg = task.check_implementation(data, bad)
    assert not ok and "Number of mismatched elements: 1" in msg and "\n" not in msg


@pytest.mark.parametrize("task,name", [("trimul", "trimul_submission.py"), ("softmax", "softmax_submission.py")])
def test_kernelcast_check_passes_gpu_mode_style_submissions(task, name, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    res = CliRunner().invoke(app, ["check", "--task", task, "--kernel", str(SUBMISSIONS / name), "--json"])
    assert res.exit_code == 0, res.output
    report = __import__("json").loads(res.stdout)
    assert report["ok"] and report["failure_kind"] is None
    assert {"env", "tmpdir"} <= set(report["sandbox"].split(","))  # the layers it ran under
    assert all(isinstance(v, str) and v for v in report["sandbox_missing"].values())  # and why others are not


def test_kernelcast_check_refuses_a_wrong_gpu_mode_submission(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    wrong = tmp_path / "wrong.py"
    wrong.write_text((SUBMISSIONS / "trimul_submission.py").read_text().replace(
        "return (out * torch.sigmoid(og))", "return 1.1 * (out * torch.sigmoid(og))"))
    res = CliRunner().invoke(app, ["check", "--task", "trimul", "--kernel", str(wrong)])
    assert res.exit_code == 1 and "incorrect" in res.stdout and "Number of mismatched elements" in res.stdout
