"""Per-token-group (1 x 128) fp8 e4m3 quantisation of a bf16 activation matrix, as DeepSeek-V3.

For each row and each group of 128 consecutive columns:
    scale = max(absmax(group), 1e-10) / 448            (fp32)
    q     = clamp(x / scale, -448, 448).to(float8_e4m3fn)
Output: (q (M, K) float8_e4m3fn, scales (M, K // 128) fp32). The reference is the plain
PyTorch expression through fp32 temporaries (view, upcast, abs, amax, divide, clamp, cast),
about 40 B of HBM traffic per element against 3 B/elt (read 2, write 1) for a fused kernel.
"""

from __future__ import annotations

import torch

from pipelines.tasks.contract import (
    Task,
    allclose_check,
    default_device,
    reference_check,
    seeded_generator,
)

GROUP = 128
FP8_MAX = 448.0
SCALE_FLOOR = 1e-10
SCALE_RTOL = 1e-3
# e4m3 keeps 3 mantissa bits: one unit in the last place is at most 1/8 of the value, so a
# dequantised element within one ulp of x is within |x| / 8; subnormals step by 2^-9 * scale.
DEQUANT_RTOL = 0.125
DEQUANT_ATOL_SCALES = 2.0**-9


def generate_input(seed: int, M: int, K: int) -> tuple[torch.Tensor]:
    """x: (M, K) bf16, N(0,1) times a per-row log-normal magnitude, with rare 20x outliers and
    one all-zero group (row 0, columns 0..127) to exercise the 1e-10 scale floor."""
    if K % GROUP:
        raise ValueError(f"K={K} must be a multiple of {GROUP}")
    dev = default_device()
    gen = seeded_generator(seed, dev)
    x = torch.randn(M, K, generator=gen, device=dev, dtype=torch.float32)
    x = x * torch.exp(torch.randn(M, 1, generator=gen, device=dev, dtype=torch.float32))
    outliers = torch.rand(M, K, generator=gen, device=dev) < 1e-3
    x = torch.where(outliers, x * 20.0, x)
    x[0, :GROUP] = 0.0
    return (x.to(torch.bfloat16),)


def ref_kernel(data: tuple[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(q (M, K) float8_e4m3fn, scales (M, K // 128) fp32)."""
    (x,) = data
    M, K = x.shape
    xg = x.view(M, K // GROUP, GROUP).float()  # 2R + 4W B/elt
    amax = xg.abs().amax(dim=-1)  # 4R + 4W, then 4R
    scales = amax.clamp(min=SCALE_FLOOR) / FP8_MAX  # (M, K//128), negligible
    q = (xg / scales.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX)  # 4R + 4W, then 4R + 4W
    return q.to(torch.float8_e4m3fn).view(M, K), scales  # 4R + 1W


def check_against(data, output, expected) -> tuple[bool, str]:
    """Scales within rtol 1e-3 of the reference; q is float8_e4m3fn and q * scale is within one
    e4m3 ulp of x (|q*s - x| <= |x|/8 + 2^-9 * s)."""
    (x,) = data
    if not (isinstance(output, (tuple, list)) and len(output) == 2):
        return False, "output: expected a tuple (q, scales)"
    q, scales = output
    if not isinstance(q, torch.Tensor) or q.dtype != torch.float8_e4m3fn:
        return (
            False,
            f"q: expected a torch.float8_e4m3fn tensor, got {getattr(q, 'dtype', type(q).__name__)}",
        )
    if not isinstance(scales, torch.Tensor) or scales.dtype != torch.float32:
        return (
            False,
            f"scales: expected a float32 tensor, got {getattr(scales, 'dtype', type(scales).__name__)}",
        )
    q_ref, s_ref = expected
    ok, msg = allclose_check(scales, s_ref, rtol=SCALE_RTOL, atol=0.0, what="scales")
    if not ok:
        return ok, msg
    if q.shape != q_ref.shape:
        return False, f"q: shape {tuple(q.shape)} != expected {tuple(q_ref.shape)}"
    s_full = s_ref.repeat_interleave(GROUP, dim=1)  # (M, K)
    deq = q.float() * s_full
    xf = x.float()
    if not torch.isfinite(deq).all():
        return False, "q: contains NaN (an unclamped value cast to e4m3) or inf"
    bound = DEQUANT_RTOL * xf.abs() + DEQUANT_ATOL_SCALES * s_full
    bad = (deq - xf).abs() > bound
    n_bad = int(bad.sum())
    if n_bad:
        i, j = bad.nonzero()[0].tolist()
        return False, (
            f"q * scale: {n_bad}/{bad.numel()} elements further than one e4m3 ulp from x; first at "
            f"[{i}, {j}]: got {deq[i, j].item():.6g}, x = {xf[i, j].item():.6g}"
        )
    return True, "ok"


check_implementation = reference_check(ref_kernel, check_against)


TASK = Task(
    name="fp8_quant",
    description=(
        "Per-token-group fp8 quantisation (DeepSeek-V3 style, group 1x128): given x of shape (M, K) "
        "in bfloat16 (row-major, K a multiple of 128), for every row and every group of 128 "
        "consecutive columns compute scale = max(absmax(group), 1e-10) / 448 in fp32 and "
        "q = clamp(x / scale, -448, 448) cast to float8_e4m3fn; return (q of shape (M, K) in "
        "float8_e4m3fn, scales of shape (M, K/128) in float32). The PyTorch reference is the plain "
        "expression through fp32 temporaries (upcast, abs, amax, divide, clamp, cast: about seven "
        "kernels, ~40 bytes of HBM traffic per element) where a fused kernel reads 2 B and writes "
        "1 B per element plus 4 B per 128 elements of scales. Each group's 128 values (256 bytes) "
        "fit in one tile, so the reduction is local; the small benchmark shapes (256 rows) are "
        "launch- and latency-bound, the large one (4096 x 7168) bandwidth-bound."
    ),
    generate_input=generate_input,
    ref_kernel=ref_kernel,
    check_implementation=check_implementation,
    check_against=check_against,
    correctness_cases=(
        {"M": 6, "K": 640, "seed": 1},
        {"M": 13, "K": 256, "seed": 2},
        {"M": 2, "K": 2048, "seed": 3},
    ),
    # The paper's shapes. Reference on an H200: ~7 launches (~25-40 us) for the 256-row shapes,
    # ~40 B/elt / 3.5e12 B/s ~ 340 us for 4096x7168.
    benchmark_cases=(
        {"M": 256, "K": 4096, "seed": 11},
        {"M": 256, "K": 8192, "seed": 12},
        {"M": 4096, "K": 7168, "seed": 13},
    ),
    tolerances={
        "scale_rtol": SCALE_RTOL,
        "dequant_rtol": DEQUANT_RTOL,
        "dequant_atol_scales": DEQUANT_ATOL_SCALES,
    },
)
