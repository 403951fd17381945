"""The fused closeness pass counts what torch.isclose on fp32 copies counts, and allclose_check
gives the same (ok, message) either way.

On a CPU host the kernels run under Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1
before anything imports triton) on CPU tensors; on a GPU host the same tests run them compiled on
CUDA tensors, where contraction into FMAs and flushed denormals would show. Small blocks and grids
(`block=128, programs=3`) make a few hundred elements span several tiles per program.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.tasks import closeness
from pipelines.tasks.contract import allclose_check, default_device

ROOT = Path(__file__).resolve().parents[2]
DEVICE = default_device()
INF, NAN = float("inf"), float("nan")
SMALL = {"block": 128, "programs": 3}  # tiles of 128; program p takes tiles p, p + 3, ...

pytestmark = [  # the interpreter's numpy: a loop bound read from an array, inf - inf, 3e38 + 3e38
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]


def torch_closeness(output, expected, rtol, atol) -> closeness.Closeness:
    """The four numbers by torch ops on fp32 copies, as allclose_check's torch path gets them."""
    out, exp = output.float(), expected.float()
    bad = ~torch.isclose(out, exp, rtol=rtol, atol=atol).reshape(-1)
    n_bad = int(bad.sum())
    return closeness.Closeness(
        n_bad,
        not bool(torch.isfinite(out).all()),
        not bool(torch.isfinite(exp).all()),
        int(bad.nonzero()[0]) if n_bad else None,
    )


def t(values, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).to(dtype).to(DEVICE)


def assert_same(output, expected, rtol, atol, **grid):
    fused = closeness.compare(output, expected, rtol, atol, **grid)
    assert fused == torch_closeness(output, expected, rtol, atol)
    return fused


# ---- the four numbers against torch ---------------------------------------------------------
@pytest.mark.parametrize("dtype", closeness.SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 383, 1000])  # 383: three tiles of 128 less one element
def test_random_data_of_every_dtype(dtype, n):
    gen = torch.Generator().manual_seed(n)
    scale = 4.0 if dtype == torch.float8_e4m3fn else 1.0  # e4m3: coarse steps, keep some close
    exp = (torch.randn(n, generator=gen) * scale).to(dtype)
    out = (exp.float() + torch.randn(n, generator=gen) * 0.02 * scale).to(dtype)
    exp, out = exp.to(DEVICE), out.to(DEVICE)
    found = assert_same(out, exp, 2e-2, 2e-2, **SMALL)
    assert found == closeness.compare(out, exp, 2e-2, 2e-2)  # the default grid
    if n > 1:
        assert 0 < found.n_bad < n  # the data exercises both verdicts


def test_mixed_dtypes_read_each_in_its_own():
    gen = torch.Generator().manual_seed(3)
    exp = torch.randn(300, generator=gen)
    out = (exp + torch.randn(300, generator=gen) * 0.01).to(torch.bfloat16)
    assert_same(out.to(DEVICE), exp.to(DEVICE), 1e-2, 1e-2, **SMALL)


@pytest.mark.parametrize(
    "out, exp",
    [
        ([1.0, NAN, 3.0], [1.0, 2.0, 3.0]),  # NaN in the output only
        ([1.0, 2.0, 3.0], [1.0, NAN, 3.0]),  # NaN in the expected only
        ([NAN, 2.0], [NAN, 2.0]),  # NaN against NaN is not close (equal_nan=False)
        ([INF, -INF, 1.0], [INF, -INF, 1.0]),  # equal infinities are close
        ([INF, -INF], [-INF, INF]),  # unequal infinities are not
        ([INF, 1.0], [1.0, INF]),  # infinity against a finite value, either side
        ([3e38, -3e38], [-3e38, 3e38]),  # finite values whose difference overflows to inf
    ],
)
def test_nan_and_infinities(out, exp):
    assert_same(t(out), t(exp), 1e-2, 1e-2)


def test_exact_boundary_is_close_and_the_next_float_is_not():
    # |a - b| == atol + rtol * |b| exactly in fp32: 0.75 == 0.5 + 0.25 * 1.0
    b = t([1.0, 1.0, -2.0])
    a = t([1.75, 1.75, -3.0])
    a[1] = torch.nextafter(a[1], a[1] + 1)  # the next fp32 above 1.75
    found = assert_same(a, b, 0.25, 0.5)
    assert (found.n_bad, found.first_bad) == (1, 1)


def test_boundary_where_a_fused_multiply_add_would_decide_otherwise():
    # Found by search: |a - b| equals fma(rtol, |b|, atol) rounded once, one fp32 step above
    # torch's atol + rtol * |b| rounded after each operation; so torch says "not close" and a
    # kernel whose compiler contracted the product and sum into an FMA would say "close".
    rtol, atol = 0.3, 0.1
    b, a = float.fromhex("0x1.29a12p+0"), float.fromhex("0x1.9c84aap+0")
    f32 = torch.float32
    diff = torch.tensor(a, dtype=f32) - torch.tensor(b, dtype=f32)
    separate = torch.tensor(atol, dtype=f32) + torch.tensor(rtol, dtype=f32) * torch.tensor(b, dtype=f32)
    fused_once = torch.tensor(float(torch.tensor(rtol, dtype=f32)) * b + float(torch.tensor(atol, dtype=f32)),
                              dtype=f32)  # the product is exact in float64, the sum rounds once here
    assert separate < diff == fused_once
    found = assert_same(t([a]), t([b]), rtol, atol)
    assert found.n_bad == 1


def test_denormals_are_not_flushed():
    tiny = 2.0**-149  # the smallest fp32 denormal; bf16 shares fp32's exponent range
    a = t([tiny, 2 * tiny, 1e-40, 1e-39])
    b = t([2 * tiny, 2 * tiny, 2e-40, 0.0])
    assert assert_same(a, b, 0.0, 0.0).n_bad == 3  # zero tolerance: only equal values are close
    assert_same(a, b, 0.5, 0.0)  # products and sums of denormals
    bf = [1e-39, 2e-39, 1e-40]  # bf16 subnormals
    assert assert_same(t(bf, torch.bfloat16), t(bf[::-1], torch.bfloat16), 0.0, 0.0).n_bad == 2
    half = [1e-7, 2e-7, 6e-8]  # fp16 subnormals
    assert assert_same(t(half, torch.float16), t(half[::-1], torch.float16), 0.0, 0.0).n_bad == 2
    e4m3 = [2.0**-9, 2.0**-8, 3 * 2.0**-9]  # e4m3 subnormals
    assert assert_same(t(e4m3, torch.float8_e4m3fn), t(e4m3[::-1], torch.float8_e4m3fn), 0.0, 0.0).n_bad == 2


@pytest.mark.parametrize("shape", [(0,), (3, 0)])
def test_empty_tensor_finds_nothing(shape):
    empty = torch.empty(shape, device=DEVICE)
    assert assert_same(empty, empty, 1e-2, 1e-2) == closeness.Closeness(0, False, False, None)


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
def test_one_element(shape):
    assert_same(t(1.0).reshape(shape), t(1.5).reshape(shape), 1e-2, 1e-2)
    assert_same(t(1.0).reshape(shape), t(1.0).reshape(shape), 1e-2, 1e-2)


@pytest.mark.parametrize("bad_at", [[999, 700, 130, 500], [384, 128], [0, 999], [999]])
def test_first_bad_is_the_smallest_index_across_programs(bad_at):
    # 1000 elements: tiles of 128, three programs; 130 is program 1's, 384 program 0's second tile
    exp = torch.linspace(-1, 1, 1000).to(DEVICE)
    out = exp.clone()
    out[bad_at] += 1.0
    found = assert_same(out, exp, 1e-3, 1e-3, **SMALL)
    assert (found.n_bad, found.first_bad) == (len(bad_at), min(bad_at))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.floats(width=32), st.floats(width=32)), min_size=1, max_size=300),
    st.sampled_from([(0.0, 0.0), (1e-5, 1e-8), (2e-2, 2e-2), (0.5, 1.0)]),
)
def test_any_float32_pairs(pairs, tolerances):
    out, exp = zip(*pairs, strict=True)
    assert_same(t(list(out)), t(list(exp)), *tolerances, **SMALL)


# ---- which tensors take the fused path ------------------------------------------------------
def test_supports_only_dense_row_major_tensors_of_supported_dtypes():
    x = torch.zeros(4, 3)
    assert closeness.supports(x, x)
    assert not closeness.supports(x.t(), x.t())  # a transposed view has no row-major flat order
    assert not closeness.supports(x[:, :2], torch.zeros(4, 2))  # strided rows
    assert not closeness.supports(x.double(), x)
    assert not closeness.supports(x, torch.zeros(12))  # shapes differ
    assert closeness.supports(x[1:], torch.zeros(3, 3))  # an offset view of contiguous rows is fine
    with pytest.raises(ValueError):
        closeness.compare(x.t(), x.t(), 1e-2, 1e-2)


def test_allclose_check_on_cpu_tensors_takes_the_torch_path(monkeypatch):
    def no_fused_pass(*args, **kwargs):
        raise AssertionError("the fused pass ran on CPU tensors")

    monkeypatch.setattr(closeness, "compare", no_fused_pass)
    x = torch.ones(10)
    assert not closeness.applies(x, x, 1e-2, 1e-2)
    assert allclose_check(x, x, 1e-2, 1e-2) == (True, "ok")
    assert allclose_check(x + 1, x, 1e-2, 1e-2)[0] is False


def test_a_failing_fused_pass_falls_back_to_torch_for_good(monkeypatch):
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("no compiler for this GPU")

    # Stand in for a CUDA host whose Triton cannot compile: applies() says yes until disabled.
    monkeypatch.setattr(closeness, "_disabled", False)  # restored after the test
    monkeypatch.setattr(closeness, "applies", lambda *args: not closeness._disabled)
    monkeypatch.setattr(closeness, "compare", broken)
    x = torch.ones(10)
    assert allclose_check(x + 1, x, 1e-2, 1e-2) == allclose_check(x + 1, x, 1e-2, 1e-2, fused=False)
    assert allclose_check(x, x, 1e-2, 1e-2) == (True, "ok")
    assert len(calls) == 1 and closeness._disabled


@pytest.mark.skipif(DEVICE != "cuda", reason="the fused path applies to CUDA tensors only")
def test_applies_to_cuda_tensors_until_disabled(monkeypatch):
    x = torch.ones(10, device="cuda")
    assert closeness.applies(x, x, 1e-2, 1e-2)
    assert not closeness.applies(x, x, -1.0, 1e-2)  # torch.isclose raises on it: keep its way
    monkeypatch.setattr(closeness, "_disabled", False)
    closeness.disable()
    assert not closeness.applies(x, x, 1e-2, 1e-2)


# ---- allclose_check's verdicts and messages, fused against torch ----------------------------
def _scenarios():
    gen = torch.Generator().manual_seed(7)
    base = torch.randn(4, 5, 6, generator=gen)
    off = base.clone()
    off[1, 2, 3] += 1.0
    off[3, 4, 5] -= 2.0
    off[0, 0, 1] *= 1.5
    nan_out = base.clone()
    nan_out[2, 1, 0] = NAN
    nan_both = nan_out.clone()
    inf_exp = base.clone()
    inf_exp[0, 3, 3] = INF
    return {
        "passes": (base.clone(), base),
        "several_off_3d": (off, base),
        "nan_in_output_only": (nan_out, base),
        "nan_in_both": (nan_out, nan_both),
        "inf_in_expected_only": (base, inf_exp),
        "bf16_output_fp32_expected": (off.to(torch.bfloat16), base),
        "bf16_both_2d": (off.reshape(20, 6).to(torch.bfloat16), base.reshape(20, 6).to(torch.bfloat16)),
        "fp16_close": (base.half(), base.half()),
        "fp8_off": ((off * 8).to(torch.float8_e4m3fn), (base * 8).to(torch.float8_e4m3fn)),
        "zero_dim_off": (torch.tensor(1.0), torch.tensor(2.0)),
        "empty": (torch.empty(0, 3), torch.empty(0, 3)),
    }


SCENARIOS = _scenarios()


@pytest.mark.parametrize("name", SCENARIOS)
def test_allclose_check_gives_the_same_verdict_and_message_both_ways(name):
    out, exp = (x.to(DEVICE) for x in SCENARIOS[name])
    torch_way = allclose_check(out, exp, 1e-2, 1e-2, what="grad", fused=False)
    assert allclose_check(out, exp, 1e-2, 1e-2, what="grad", fused=True) == torch_way
    assert allclose_check(out, exp, 1e-2, 1e-2, what="grad") == torch_way  # as the verifier calls it


def test_dtype_and_shape_checks_come_first_either_way():
    x = torch.zeros(3, device=DEVICE)
    for fused in (True, False):
        assert allclose_check(x, x, 1e-2, 1e-2, dtype=torch.bfloat16, fused=fused) == (
            False, "output: dtype torch.float32 != torch.bfloat16")
        assert allclose_check(x, x[:2], 1e-2, 1e-2, fused=fused) == (False, "output: shape (3,) != expected (2,)")


# ---- what the GPU compiler makes of it ------------------------------------------------------
# Triton compiles for sm_90 on any host (no GPU, no driver); the interpreter this process runs
# under cannot be switched off once triton is imported, so a fresh process compiles.
COMPILE_FOR_HOPPER = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pipelines.tasks import closeness

partials, _ = closeness._kernels()
signature = {"out_ptr": "*bf16", "exp_ptr": "*fp32", "partials_ptr": "*i64", "n": "i32",
             "rtol": "fp32", "atol": "fp32", "BLOCK": "constexpr"}
source = ASTSource(partials, signature=signature, constexprs={"BLOCK": closeness.BLOCK})
target = GPUTarget("cuda", 90, 32)
sys.stdout.write(triton.compile(source, target=target, options=closeness.COMPILE_OPTIONS).asm["ptx"])
"""


@pytest.mark.slow  # a fresh process importing torch and triton, and one compile: about 2 s
def test_compiled_for_hopper_rounds_every_operation_and_keeps_denormals(tmp_path):
    """The launch's options (enable_fp_fusion=False) leave the tolerance a separate multiply and add (an
    FMA rounds once: see the FMA boundary test) and nothing flushes denormals (.ftz)."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", COMPILE_FOR_HOPPER], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    ptx = done.stdout
    assert "mul.rn.f32" in ptx and "add.rn.f32" in ptx
    assert "fma." not in ptx and "mad.rn" not in ptx and ".ftz" not in ptx
