"""The file reader takes kernels that ask the device, as library code does: each is read on a
stand-in device of the hardware forecast for (pipelines.profiling.standin), never refused for
asking. The kernels are tests/fixtures_kernels/device_query/ (their README says how each asks)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipelines.forecasting.files import read_kernel_files
from pipelines.profiling import standin

KERNELS = Path(__file__).resolve().parents[1] / "fixtures_kernels" / "device_query"
CASES = {  # file -> (task, language)
    "driver_warmup_softmax.py": ("softmax", "triton"),
    "torch_props_rms_norm.py": ("rms_norm", "triton"),
    "autotuned_layer_norm.py": ("layer_norm", "triton"),
    "moves_to_cuda_softmax.py": ("softmax", "pytorch"),
}


@pytest.fixture(scope="module")
def read():
    """Each fixture read once (one child per file, two at a time)."""
    out = {}
    for task in sorted({t for t, _ in CASES.values()}):
        names = [n for n, (t, _) in CASES.items() if t == task]
        for name, f in zip(names, read_kernel_files(task, [KERNELS / n for n in names]), strict=True):
            out[name] = f
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_kernel_that_asks_the_device_is_read_not_refused(read, name):
    task, language = CASES[name]
    f = read[name]
    assert f.refused is None, f.refused
    assert f.notes == [], f.notes
    rec = f.record
    assert rec["language"] == language and rec["task"] == task
    assert rec["trace_cases"] == 4  # every benchmark case traced
    if language == "triton":
        # loads of a pipelined loop are cp.async on sm_90, not ld.global
        assert rec["n_regs"] > 0 and rec["ptx_ld_global"] + rec["ptx_cp_async"] > 0 and rec["trace_launches"] == 1
    else:
        assert rec["torch_ops"] >= 2 and rec["n_regs"] is None


def test_a_persistent_grid_is_sized_from_the_stand_in_devices_sms(read):
    """The warm-up kernel's launcher reads the registers of its compiled kernel (one per row
    width) and the device's SM count, and launches occupancy x SMs programs on every case (all
    have more rows than that)."""
    rec = read["driver_warmup_softmax.py"].record
    for log2 in (rec["trace_programs_log2_min"], rec["trace_programs_log2_max"]):
        programs = round(2**log2 - 1)  # trace columns are log2(1 + x)
        assert programs % standin.H200.sm_count == 0 and programs >= standin.H200.sm_count, programs
    assert rec["trace_programs_log2_max"] > rec["trace_programs_log2_min"]  # wider rows, fewer per SM


def test_an_autotuned_kernel_compiles_every_config(read):
    rec = read["autotuned_layer_norm.py"].record
    assert rec["n_kernels"] == 4 and rec["num_warps"] == 16


def test_the_stand_in_answers_inside_and_leaves_no_trace_outside():
    from triton.runtime.driver import driver

    before = (torch.cuda.is_available, torch.cuda.get_device_properties, driver._active)
    with standin.standin_device(standin.H100) as d:
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        assert torch.cuda.get_device_properties(0).total_memory == standin.H100.total_memory_bytes
        assert driver.active is d and driver.active.get_current_target().arch == 90
        props = driver.active.utils.get_device_properties(0)
        assert props["multiprocessor_count"] == 132 and props["mem_clock_rate"] == 2619000
        with torch.cuda.device(0), torch.cuda.stream(torch.cuda.Stream()):
            t = torch.empty(3, device="cuda")  # outside fake mode "cuda" is where the inputs are
        assert t.device.type == "cpu" and torch.ones(2).cuda().device.type == "cpu"
    assert (torch.cuda.is_available, torch.cuda.get_device_properties, driver._active) == before


def test_under_fake_tensors_the_stand_in_answers_as_the_gpu_and_takes_every_view():
    """Tensors answer `is_cuda` as on the GPU; "cuda" is where the inputs are, so a launcher's
    slices, transposes and copies work on the trace's fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    constant = torch.tensor([1.0, 2.0])  # a real CPU tensor made at import, moved at call
    with standin.standin_device(), FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.randn(2, 3, 8, 4)
        assert x.is_cuda and constant.is_cuda
        moved = constant.to("cuda")
        assert moved.is_cuda and moved.shape == (2,)
        assert x.to("cuda", torch.bfloat16).dtype == torch.bfloat16
        y = torch.empty_like(x[..., 1:3, :].transpose(1, 2).contiguous(), device="cuda")
        y.copy_(x[..., 1:3, :].transpose(1, 2))
        y[:, 0] = 1.0
        assert y.shape == (2, 2, 3, 4) and (y * constant.cuda().sum()).is_cuda
    assert not torch.randn(2).is_cuda


@pytest.mark.parametrize("hardware, want", [(None, "NVIDIA H200"), (90, "NVIDIA H200"),
                                            ("nvidia-h100-80gb-hbm3-sm90", "NVIDIA H100 80GB HBM3"), (80, "sm_80")])
def test_the_stand_in_for_each_hardware(hardware, want):
    spec = standin.device_for(hardware)
    assert spec.name == want and spec.sm_count == 132
    with pytest.raises(ValueError, match="no stand-in device for 'nvidia-a100'"):
        standin.device_for("nvidia-a100")


def test_refusals_name_their_cause(tmp_path):
    """Refused only for what no GPU would run: a module that does not import, a Triton module
    that does not compile; a PyTorch module whose trace fails is read with a note."""
    raises = tmp_path / "raises_at_import.py"
    raises.write_text("import torch\nraise ImportError('needs a package this host lacks')\n\n\n"
                      "def custom_kernel(data):\n    return data[0]\n")
    bad_triton = tmp_path / "bad_triton.py"
    bad_triton.write_text((KERNELS / "torch_props_rms_norm.py").read_text().replace(
        "tl.sum(x * x, axis=1)", "tl.sum(x * x, axis=1) + undefined_name"))
    host = tmp_path / "reads_values.py"
    host.write_text("import torch\n\n\ndef custom_kernel(data):\n    (x,) = data\n"
                    "    if float(x.float().abs().max()) > 1e9:\n        raise ValueError('overflow')\n"
                    "    return torch.softmax(x.float(), -1).to(x.dtype)\n")
    f_raises, f_host = read_kernel_files("softmax", [raises, host])
    (f_bad,) = read_kernel_files("rms_norm", [bad_triton])
    assert f_raises.refused == "does not import: ImportError: needs a package this host lacks"
    assert f_bad.refused.startswith("the sm_90 compile on the task's benchmark input failed:")
    assert "undefined_name" in f_bad.refused and "\n" not in f_bad.refused
    assert f_host.refused is None and f_host.record is not None
    assert len(f_host.notes) == 1 and f_host.notes[0].startswith("no source features: trace:")


def test_a_device_ordinal_pinned_memory_and_nvtx_ranges_are_answered_under_fake_tensors():
    """Launchers written for one GPU name it by number (`device=torch.cuda.current_device()`,
    `.to(0)`), pin host buffers before copying them over, and mark profiler ranges; on the stand-in
    each works as on the GPU (a build without CUDA raises on all three)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with standin.standin_device(), FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.randn(4, 8)
        for t in (torch.empty(4, device=torch.cuda.current_device()), torch.zeros(3, device=0), x.to(0),
                  x.to(0, torch.bfloat16), torch.ones(2).pin_memory()):
            assert t.is_cuda and t[1:].shape[0] == t.shape[0] - 1
        assert x.to(0, torch.bfloat16).dtype == torch.bfloat16
        torch.cuda.nvtx.range_push("launch")
        with torch.cuda.nvtx.range("launch"):
            torch.cuda.nvtx.mark("here")
        torch.cuda.nvtx.range_pop()
    with pytest.raises(RuntimeError):  # outside, the build's own answer again
        torch.cuda.nvtx.range_push("launch")


@pytest.mark.parametrize("fallback", ["normalise_in_torch", "stats_in_torch"])
def test_a_half_triton_half_pytorch_kernel_traces_and_compiles_on_the_stand_in(fallback):
    """The softmax template's torch_partial family (a Triton kernel for half the work, PyTorch
    for the rest, fp32 copies of the input) is read in one child: its trace on fake tensors
    compiles it for sm_90 and counts its torch ops, so the reader never compiles it a second
    time on a real input (which it did while the stand-in's fake CUDA tensors took no index,
    transpose or copy: "PyTorch is not linked with support for cuda devices")."""
    from pipelines.forecasting.files import read_kernel_sources
    from pipelines.forecasting.source_features import source_features_many
    from pipelines.generation import registry

    point = next(p for p in registry.iter_points("softmax") if p.algorithm == "torch_partial"
                 and p.knobs["fallback"] == fallback and registry.is_valid_point(p))
    src = registry.render_point(point)
    (row,) = source_features_many([{"kernel_id": "tp", "task": "softmax", "source": src, "language": "triton"}],
                                  n_workers=1, hardware="nvidia-h200-sm90")
    assert (row["status"], row["compile_status"], row["error"]) == ("ok", "compiled", None)
    assert row["n_regs"] > 0 and row["trace_cases"] == 4 and row["trace_launches"] == 1
    assert row["torch_ops"] >= 3  # the PyTorch half: casts, exp, divide or reductions
    (f,) = read_kernel_sources("softmax", [src], "nvidia-h200-sm90")
    assert f.refused is None and f.notes == [] and f.record["n_regs"] == row["n_regs"]
