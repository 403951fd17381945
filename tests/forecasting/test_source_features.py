"""Source features of kernels of several shapes of code, on a machine without a GPU.

One source_features_many call (two workers) extracts every case, so worker start-up is paid once.
Kernels run against the test-only tasks `tiny_scale` (16M and 64M floats) and `huge_scale`
(1 TiB and 4 TiB inputs: only a trace on fake tensors can call anything on them).
"""

from __future__ import annotations

import doctest
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.forecasting import source_features as sf
from pipelines.generation import aot

FIXTURES = Path(__file__).parent.parent / "fixtures_kernels"
TASKS = f"tiny_scale={FIXTURES / 'tiny_task.py'};huge_scale={FIXTURES / 'huge_task.py'}"

# The generator's shape of code: UPPER_CASE knobs, one program per block.
TEMPLATE = (FIXTURES / "good_triton.py").read_text()

# A different decomposition: a fixed grid of 2 x 66 programs, each striding over its blocks in a
# loop, 128-bit loads; the launcher also casts and allocates through torch.
PERSISTENT = """
import torch
import triton
import triton.language as tl


@triton.jit
def _scale_persistent(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    nprog = tl.num_programs(0) * tl.num_programs(1)
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + 1.0, mask=mask)


def custom_kernel(data):
    x = data.contiguous()
    y = torch.empty_like(x)
    _scale_persistent[(66, 2)](x, y, x.numel(), BLOCK=4096, num_warps=8)
    return y
"""

AUTOTUNED = """
import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 256}, num_warps=2),
                          triton.Config({"BLOCK": 2048}, num_warps=8)], key=["n"])
@triton.jit
def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + 1.0, mask=mask)


def custom_kernel(data):
    y = torch.empty_like(data)
    n = data.numel()
    _scale[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](data, y, n)
    return y
"""

PYTORCH = (FIXTURES / "good_torch.py").read_text()

# PyTorch with a matmul, so FLOPs are counted (x as a (n/64, 64) matrix times a 64 x 64 one).
PYTORCH_MATMUL = """
import torch


def custom_kernel(data):
    x = data.view(-1, 64)
    w = torch.ones(64, 64, dtype=x.dtype, device=x.device)
    return (x @ w).view(-1) * 0 + data * 2 + 1
"""

COMPILED = """
import torch


@torch.compile
def _fused(x):
    return x * 2.0 + 1.0


def custom_kernel(data):
    return _fused(data)
"""

CASES = {
    "template": ("tiny_scale", TEMPLATE, "triton"),
    "persistent": ("tiny_scale", PERSISTENT, "triton"),
    "autotuned": ("tiny_scale", AUTOTUNED, "triton"),
    "pytorch": ("tiny_scale", PYTORCH, "pytorch"),
    "pytorch_matmul": ("tiny_scale", PYTORCH_MATMUL, "pytorch"),
    "torch_compile": ("tiny_scale", COMPILED, "pytorch"),
    "huge": ("huge_scale", TEMPLATE, "triton"),
    "syntax_error": ("tiny_scale", (FIXTURES / "syntax_error.py").read_text(), "triton"),
    "no_entry": ("tiny_scale", (FIXTURES / "no_entry_point.py").read_text(), "triton"),
    "unknown_task": ("no_such_task", TEMPLATE, "triton"),
}


@pytest.fixture(scope="module")
def rows():
    old = os.environ.get("KERNELCAST_TASK_MODULES")
    os.environ["KERNELCAST_TASK_MODULES"] = TASKS
    try:
        seen = []
        records = [{"kernel_id": name, "task": t, "source": s, "language": lang}
                   for name, (t, s, lang) in CASES.items()]
        out = sf.source_features_many(records, n_workers=2, timeout_s=240,
                                      progress=lambda d, n: seen.append((d, n)))
    finally:
        if old is None:
            os.environ.pop("KERNELCAST_TASK_MODULES")
        else:
            os.environ["KERNELCAST_TASK_MODULES"] = old
    assert seen[-1] == (len(CASES), len(CASES))
    return {r["kernel_id"]: r for r in out}


def test_every_row_has_the_columns_and_a_known_status(rows):
    for r in rows.values():
        assert set(sf.ROW_COLUMNS) <= set(r) and r["status"] in sf.STATUSES


def test_template_kernel_compiles_and_traces_every_benchmark_shape(rows):
    r = rows["template"]
    assert r["status"] == "ok" and r["compile_status"] == "compiled" and r["error"] is None
    assert 0 < r["n_regs"] <= 255 and r["n_kernels"] == 1 and r["num_warps"] == 4
    assert r["ptx_ld_global"] >= 1 and r["ptx_st_global"] >= 1 and r["ptx_mma"] == 0
    assert r["trace_cases"] == 2 and r["trace_launches"] == 1
    # programs: n / 1024 for n = 2^24 and 2^26 -> log2(1 + programs) = 14 and 16
    assert r["trace_programs_log2_min"] == pytest.approx(14, abs=1e-3)
    assert r["trace_programs_log2_max"] == pytest.approx(16, abs=1e-3)
    # x and y, 4 B each per element, over 1024-element programs: 8 KiB per program
    assert r["trace_bytes_per_program_log2"] == pytest.approx(13, abs=1e-3)
    assert r["torch_allocs"] == 1 and r["torch_ops"] == 0  # empty_like only


def test_a_different_decomposition_reads_differently(rows):
    t, p = rows["template"], rows["persistent"]
    assert p["status"] == "ok", p["error"]
    assert p["trace_programs_log2"] == pytest.approx(7.05, abs=0.01)  # 132 programs, whatever the shape
    assert p["trace_wave_efficiency"] == 1.0 and p["trace_warps"] == 8 and p["num_warps"] == 8
    assert p["trace_bytes_per_program_log2"] > t["trace_bytes_per_program_log2"] + 5
    assert p["ptx_branch"] > t["ptx_branch"]  # the stride loop


def test_autotuned_kernel_compiles_every_config_and_traces_one(rows):
    r = rows["autotuned"]
    assert r["status"] == "ok" and r["n_kernels"] == 2 and r["num_warps"] == 8
    assert r["trace_launches"] == 1  # one call launches one config
    # instruction counts are the mean over configs: between the two configs' own counts
    assert r["ptx_instructions"] > 0


def test_pytorch_kernels_are_traced_with_their_torch_ops(rows):
    r = rows["pytorch"]
    assert r["status"] == "ok" and r["compile_status"] == "skipped" and r["n_regs"] is None
    assert r["trace_launches"] == 0 and r["torch_ops"] == 2 and r["torch_distinct_ops"] == 2
    # add reads x twice and writes y, add_ reads and writes y: 5 x 4 B per element, 2^24 and 2^26
    assert r["torch_bytes_log2"] == pytest.approx((sum(__import__("math").log2(1 + 20 * n) for n in (1 << 24, 1 << 26))) / 2, abs=1e-6)
    m = rows["pytorch_matmul"]
    assert m["status"] == "ok" and m["torch_flops_log2"] > 25  # 2 * (n/64) * 64 * 64 FLOPs


def test_torch_compile_is_traced_or_recorded(rows):
    r = rows["torch_compile"]
    assert r["status"] in ("ok", "failed")
    assert (r["status"] == "ok") == (r["error"] is None)


def test_big_benchmark_shapes_cost_no_memory(rows):
    r = rows["huge"]  # 1 TiB and 4 TiB inputs on a host with far less memory
    assert r["status"] == "ok" and r["compile_status"] == "compiled", r["error"]
    assert r["input_bytes_log2"] == pytest.approx(41, abs=1e-3)  # mean of log2(2^40) and log2(2^42)
    assert r["trace_programs_log2_max"] == pytest.approx(30, abs=1e-3)


def test_broken_files_are_recorded_failures(rows):
    assert rows["syntax_error"]["status"] == "failed" and "SyntaxError" in rows["syntax_error"]["error"]
    assert rows["no_entry"]["status"] == "failed" and "custom_kernel" in rows["no_entry"]["error"]
    assert rows["unknown_task"]["status"] == "error" and "no_such_task" in rows["unknown_task"]["error"]
    for name in ("syntax_error", "no_entry", "unknown_task"):
        assert "\n" not in rows[name]["error"]


def test_the_command_writes_a_resumable_zstd_file(tmp_path, monkeypatch):
    import pyarrow as pa

    monkeypatch.setenv("KERNELCAST_TASK_MODULES", TASKS)
    kernels = tmp_path / "kernels.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"kernel_id": "a", "task": "tiny_scale", "source": PYTORCH, "language": "pytorch"},
        {"kernel_id": "b", "task": "tiny_scale", "source": "def custom_kernel(data)\n", "language": "pytorch"},
    ]), kernels)
    out = tmp_path / "features.parquet"
    assert sf.main(["--kernels", str(kernels), "--out", str(out), "--workers", "1", "--limit", "1"]) == 0
    assert pq.read_table(out).column("kernel_id").to_pylist() == ["a"]
    assert sf.main(["--kernels", str(kernels), str(kernels), "--out", str(out), "--workers", "1"]) == 0
    table = pq.read_table(out)
    assert sorted(table.column("kernel_id").to_pylist()) == ["a", "b"]  # a kept, b added once
    assert pq.ParquetFile(out).metadata.row_group(0).column(0).compression == "ZSTD"
    assert sf.main(["--kernels", str(tmp_path / "missing.parquet"), "--out", str(out)]) == 2


def test_a_compile_run_cut_short_keeps_the_trace_rows_it_has_not_redone(tmp_path, monkeypatch):
    """Rows of an earlier trace-only run are compiled again, one chunk at a time; a run stopped
    after the first chunk leaves the other kernels' trace rows in the file, not nothing."""
    import pyarrow as pa

    names = sf._schema().names
    out = tmp_path / "features.parquet"
    earlier = [{**dict.fromkeys(names), "kernel_id": k, "task": "tiny_scale", "target": "sm_90", "status": "ok",
                "compile_status": "not_run", "seconds": 0.1} for k in ("a", "b")]
    pq.write_table(pa.Table.from_pylist(earlier, schema=sf._schema()), out)
    calls = []

    def one_chunk_then_stopped(part, **kw):
        calls.append([r["kernel_id"] for r in part])
        if len(calls) > 1:
            raise KeyboardInterrupt  # the run's time is up
        return [{"kernel_id": r["kernel_id"], "task": r["task"], "target": "sm_90", "status": "ok",
                 "compile_status": "compiled", "seconds": 0.2} for r in part]

    monkeypatch.setattr(sf, "source_features_many", one_chunk_then_stopped)
    records = [{"kernel_id": k, "task": "tiny_scale", "source": PYTORCH, "language": "pytorch"} for k in ("a", "b")]
    with pytest.raises(KeyboardInterrupt):
        sf.extract_to_file(records, out, workers=1, chunk=1, log=lambda m: None)
    got = {r["kernel_id"]: r["compile_status"] for r in pq.read_table(out).to_pylist()}
    assert calls == [["a"], ["b"]] and got == {"a": "compiled", "b": "not_run"}


def test_doctests():
    for module in (sf, aot):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0


def test_a_pool_of_other_children_is_refused_before_any_starts():
    with aot.CompilePool(1) as compile_children:
        with pytest.raises(ValueError, match="not the source-feature reader"):
            sf.source_features_many([{"task": "softmax", "source": "x = 1\n"}], pool=compile_children)
        assert compile_children.running == 0
    with sf.feature_pool(1) as readers:
        assert readers.entry == sf.CHILD and readers.running == 0
