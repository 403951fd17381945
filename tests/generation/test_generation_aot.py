"""AOT compile features for sm_90 on a machine without a GPU.

One compile_many call (two workers) compiles every case, so worker start-up is paid once.
Kernels run against the test-only task `tiny_scale` (y = 2x + 1 on a float32 vector).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipelines.generation import aot

TINY_TASK_FILE = Path(__file__).parent.parent / "fixtures_kernels" / "tiny_task.py"

GOOD = """
import torch
import triton
import triton.language as tl


@triton.jit
def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * 2.0 + 1.0, mask=mask)


def custom_kernel(data):
    y = torch.empty_like(data)
    n = data.numel()
    for start in range(0, n, 16):  # several launches of one specialisation: one compile
        _scale[(1,)](data[start:], y[start:], min(16, n - start), BLOCK=16)
    _scale[(triton.cdiv(n, 256),)](data, y, n, BLOCK=256, num_warps=2)
    return y
"""

# Two fp32 tiles of 64x1024 staged through shared memory for tl.dot: 512 KiB, far over 227 KiB.
HUGE_SHARED = """
import torch
import triton
import triton.language as tl


@triton.jit
def _dot(x_ptr, y_ptr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = tl.load(x_ptr + rm[:, None] * BK + rk[None, :])
    b = tl.load(x_ptr + rk[:, None] * BN + rn[None, :])
    tl.store(y_ptr + rm[:, None] * BN + rn[None, :], tl.dot(a, b))


def custom_kernel(data):
    y = torch.empty_like(data)
    _dot[(1,)](data, y, BM=64, BN=64, BK=1024, num_warps=4)
    return y
"""

SYNTAX_ERROR = "import torch\n\ndef custom_kernel(data)\n    return data\n"

TRITON_ERROR = GOOD.replace("x * 2.0 + 1.0", "undefined_name * 2.0")

NO_LAUNCH = "def custom_kernel(data):\n    return data * 2 + 1\n"

AUTOTUNED = """
import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=1),
                          triton.Config({"BLOCK": 1024}, num_warps=8)], key=["n"])
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

CASES = {
    "good": (GOOD, "triton"),
    "huge_shared": (HUGE_SHARED, "triton"),
    "syntax_error": (SYNTAX_ERROR, "triton"),
    "triton_error": (TRITON_ERROR, "triton"),
    "no_launch": (NO_LAUNCH, "triton"),
    "autotuned": (AUTOTUNED, "triton"),
    "reference": ("def custom_kernel(data):\n    return data\n", "pytorch"),
}


@pytest.fixture(scope="module")
def features():
    old = os.environ.get("KERNELCAST_TASK_MODULES")
    os.environ["KERNELCAST_TASK_MODULES"] = f"tiny_scale={TINY_TASK_FILE}"
    try:
        seen = []
        records = [
            {"task": "tiny_scale", "source": s, "language": lang} for s, lang in CASES.values()
        ]
        records.append({"task": "no_such_task", "source": GOOD})  # same worker pool, no extra start
        records.append({"task": "tiny_scale", "language": "triton"})  # no source: never sent to a child
        feats = aot.compile_many(
            records,
            n_workers=2,
            timeout_s=120,
            case="correctness",
            progress=lambda done, total: seen.append((done, total)),
        )
    finally:
        if old is None:
            os.environ.pop("KERNELCAST_TASK_MODULES")
        else:
            os.environ["KERNELCAST_TASK_MODULES"] = old
    assert seen[-1] == (len(records), len(records))
    return dict(zip([*CASES, "unknown_task", "no_source"], feats, strict=True))


def test_good_kernel_compiles_with_registers(features):
    f = features["good"]
    assert f.status == "compiled", f.error
    assert f.n_regs is not None and 0 < f.n_regs <= 255
    assert f.n_spills == 0
    # n=37: chunks of n=16, 16, 5 -> two integer specialisations (16 is divisible by 16), plus
    # the BLOCK=256 launch; the repeated launch compiles once, as on a GPU
    assert f.n_kernels == 3
    assert f.n_launches == 4
    assert {k["num_warps"] for k in f.kernels} == {4, 2}


def test_absurd_shared_memory_tile_is_rejected(features):
    f = features["huge_shared"]
    assert f.status == "rejected", f.error
    assert f.error.startswith("_dot: shared memory") and "232448" in f.error


def test_syntax_error_is_compile_failed(features):
    f = features["syntax_error"]
    assert f.status == "compile_failed"
    assert f.error.startswith("import: SyntaxError")


def test_triton_compile_error_is_compile_failed(features):
    f = features["triton_error"]
    assert f.status == "compile_failed"
    assert "undefined_name" in f.error and "\n" not in f.error


def test_module_without_triton_launch(features):
    assert features["no_launch"].status == "compile_failed"
    assert "no Triton kernel" in features["no_launch"].error


def test_autotune_compiles_every_config(features):
    f = features["autotuned"]
    assert f.status == "compiled", f.error
    assert f.n_kernels == 2 and {k["num_warps"] for k in f.kernels} == {1, 8}


def test_pytorch_records_are_skipped(features):
    assert features["reference"].status == "skipped"


@pytest.mark.slow
def test_timeout_kills_the_worker_and_the_next_kernel_still_compiles(monkeypatch):
    monkeypatch.setenv("KERNELCAST_TASK_MODULES", f"tiny_scale={TINY_TASK_FILE}")
    hang = "import time\n\ndef custom_kernel(data):\n    time.sleep(600)\n"
    records = [{"task": "tiny_scale", "source": s} for s in (hang, GOOD)]
    # 15 s: long enough for the replacement worker to start (import torch + triton) and compile
    # the good kernel on a loaded 2-core machine; the hanging kernel sleeps 600 s.
    hung, good = aot.compile_many(records, n_workers=1, timeout_s=15, case="correctness")
    assert hung.status == "compile_failed" and "timeout" in hung.error
    assert good.status == "compiled"


def test_unknown_task_is_an_error_not_a_crash(features):
    f = features["unknown_task"]
    assert f.status == "error" and "task input" in f.error


def test_record_without_source_is_an_error_not_a_crash(features):
    f = features["no_source"]
    assert f.status == "error" and "source" in f.error


def test_pool_keeps_its_child_between_runs_and_stops_it_on_close(monkeypatch):
    monkeypatch.setenv("KERNELCAST_TASK_MODULES", f"tiny_scale={TINY_TASK_FILE}")
    job = {"source": GOOD, "task": "tiny_scale", "target": [90, 32], "case": "correctness"}
    answers: list[tuple[str, dict]] = []
    with aot.CompilePool(1) as pool:
        assert pool.running == 0  # started on first use only
        pool.run([("first", job)], 120, lambda key, msg: answers.append((key, msg)))
        pid = pool._children[0].proc.pid
        pool.run([("second", job)], 120, lambda key, msg: answers.append((key, msg)))
        assert pool.running == 1 and pool._children[0].proc.pid == pid  # the same child answered both
        root = pool._root
    assert [k for k, _ in answers] == ["first", "second"]
    assert all(m["status"] == "compiled" for _, m in answers)
    assert pool.running == 0 and not os.path.exists(root)
    with pytest.raises(RuntimeError, match="closed"):
        pool.run([("third", job)], 120, lambda key, msg: None)


# The algorithms added for the empty speedup bins (grid-capped persistent kernels, the
# Hopper-tuned fused matmul, gdn_chunk_fwd_o's capped-grid and PyTorch-fp32 partial ports):
# each family's default point compiles for sm_90 without spills.
NEW_FAMILIES = (
    ("softmax", "grid_capped_online"),
    ("rms_norm", "grid_capped_two_pass"),
    ("layer_norm", "grid_capped_sum_sumsq"),
    ("fp8_quant", "grid_capped_tiles"),
    ("cross_entropy", "grid_capped_online"),
    ("matmul_bias_gelu", "hopper_tuned_fused"),
    ("gdn_chunk_fwd_o", "grid_capped_fused"),
    ("gdn_chunk_fwd_o", "torch_intra_triton_inter"),
    ("gdn_chunk_fwd_o", "torch_terms_triton_gate"),
)


def test_new_algorithms_compile_for_sm90():
    from pipelines.generation import registry
    from pipelines.generation.families._rowwise import default_point

    records = []
    for task, algorithm in NEW_FAMILIES:
        fam = registry.family(task, algorithm)
        point = registry.KernelPoint(task, algorithm, default_point(fam))
        records.append(registry.make_record(point))
    # the tuned matmul at its fastest measured H200 point (128x256x64, 8 warps, 3 stages: 1.61x)
    fast = {
        "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8,
        "NUM_WARPS": 8, "NUM_STAGES": 3, "gelu": "tanh_sigmoid",
    }
    records.append(registry.make_record(registry.KernelPoint("matmul_bias_gelu", "hopper_tuned_fused", fast)))
    feats = aot.compile_many(records, n_workers=2, timeout_s=300, case="correctness")
    for rec, f in zip(records, feats, strict=True):
        assert f.status == "compiled", (rec["task"], rec["algorithm"], rec["knobs_json"], f.error)
        assert f.n_regs and f.n_spills == 0, (rec["algorithm"], f.n_regs, f.n_spills)
