"""Kernel families of the layer_norm task: y = (x - mean) * rstd * weight + bias, bf16 in/out.

The reference (upcast, PyTorch's fp32 LayerNorm, downcast) moves ~20 B/elt; a fused kernel 4 B/elt.
    row_in_registers             one read, one write, whole row in registers
    persistent_row_in_registers  same body over a fixed, persistent grid
    three_pass_looped            looped: mean, centred variance, normalise (x read three times)
    sum_sumsq_looped             looped: sum and sum of squares in one read, normalise in a second
    welford_looped               looped: per-lane Welford in one read, Chan combine, normalise
    unfused_multi_kernel         three kernels through an (M, N) temporary of x-hat
    torch_partial                statistics or normalisation left to PyTorch
"""

from __future__ import annotations

from pipelines.generation.families import _rowwise as rw
from pipelines.generation.space import Family, Knob, KnobValues

TASK = "layer_norm"

KNOB_DOCS = {
    "BLOCK_N": "columns per block",
    "BLOCK_M": "rows per 2-D tile",
    "NUM_WARPS": "warps per program",
    "NUM_STAGES": "software-pipelining depth of loops",
    "ROWS_PER_PROGRAM": "rows per program, one after another",
    "GRID_SIZE": "programs of the persistent grid (capped at M)",
}

VAR_ALGO = Knob(
    "var_algo",
    ("centered", "sumsq"),
    "variance as mean((x - mean)^2), or mean(x^2) - mean^2 from the same registers",
)
TMP_DTYPE = Knob("tmp_dtype", ("float32", "bfloat16"), "dtype of the x-hat (M, N) temporary")
FALLBACK = Knob("fallback", ("normalise_in_torch", "stats_in_torch"), "which half runs in PyTorch")

PROLOGUE = """\
def custom_kernel(data):
    x, weight, bias, eps = data
    assert x.ndim == 2 and x.dtype == torch.bfloat16, "layer_norm expects x: (M, N) bf16"
    assert weight.shape == bias.shape == (x.shape[1],), "weight and bias: (N,)"
    if x.stride(1) != 1:
        x = x.contiguous()  # the kernels step through columns with unit stride
    weight, bias = weight.contiguous(), bias.contiguous()
    M, N = x.shape
    y = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)"""

SIGNATURE = """\
    # pointers
    x_ptr, w_ptr, b_ptr, y_ptr,
    # sizes
    M, N,
    # strides (elements)
    stride_xm, stride_ym,
    # scalars
    eps,"""

AFFINE = "(xhat * w.to(tl.float32) + b.to(tl.float32)).to(tl.bfloat16)"


def _row_body(v: KnobValues) -> str:
    if v["var_algo"] == "centered":
        stats = """\
mean = tl.sum(x, axis=0) / N
# centre in registers; padding must not contribute (x - mean) to the variance
xc = tl.where(col_mask, x - mean, 0.0)
var = tl.sum(xc * xc, axis=0) / N
xhat = xc * tl.rsqrt(var + eps)"""
    else:
        stats = """\
mean = tl.sum(x, axis=0) / N
# E[x^2] - E[x]^2 from the same registers: both sums in one sweep, clamped at 0
var = tl.maximum(tl.sum(x * x, axis=0) / N - mean * mean, 0.0)
xhat = (x - mean) * tl.rsqrt(var + eps)"""
    return f"""\
# -- load the row once (2 B/elt), fp32 in registers; padding is 0
x = tl.load(x_ptr + row * stride_xm + cols, mask=col_mask, other=0.0{rw.evict(v)}).to(tl.float32)
{stats}
# -- affine epilogue and masked write-back (2 B/elt)
tl.store(y_ptr + row * stride_ym + cols, {AFFINE}, mask=col_mask)
"""


def _module(
    v: KnobValues,
    algorithm: str,
    summary: str,
    details: str,
    traffic: str,
    kernels: str,
    launcher: str,
) -> str:
    return rw.module(
        task=TASK,
        algorithm=algorithm,
        summary=summary,
        details=details,
        traffic=traffic,
        values=v,
        knob_docs=KNOB_DOCS,
        kernels=kernels,
        launcher=launcher,
    )


# -----------------------------------------------------------------------------
# row_in_registers / persistent_row_in_registers
# -----------------------------------------------------------------------------
def render_row_in_registers(v: KnobValues) -> str:
    kernels = f"""\
@triton.jit
def layer_norm_kernel(
{SIGNATURE}
    # meta-parameters
    BLOCK_N: tl.constexpr,  # next_pow2(N): one block holds a whole row
    ROWS_PER_PROGRAM: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    # -- map program to ROWS_PER_PROGRAM consecutive rows; weight and bias loaded once
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=col_mask, other=0.0)
{rw.rows_loop(v["row_guard"], _row_body(v))}
"""
    launcher = f"""\
{PROLOGUE}
    BLOCK_N = triton.next_power_of_2(N)
    grid = (triton.cdiv(M, ROWS_PER_PROGRAM),)
    layer_norm_kernel[grid](
        x, weight, bias, y, M, N, x.stride(0), y.stride(0), eps,
        BLOCK_N=BLOCK_N, ROWS_PER_PROGRAM=ROWS_PER_PROGRAM, NUM_STAGES=NUM_STAGES,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return y
"""
    return _module(
        v,
        "row_in_registers",
        "fused single pass, the whole row held in registers",
        f"""Each program loads whole rows (BLOCK_N = next_pow2(N)) into registers, computes
        mean and variance in fp32 ({v["var_algo"]}), applies weight and bias and writes the row
        once; weight and bias are loaded once per program for its ROWS_PER_PROGRAM rows;
        {rw.guard_words(v["row_guard"])}.""",
        "2 B read + 2 B written per element, one kernel.",
        kernels,
        launcher,
    )


def render_persistent(v: KnobValues) -> str:
    kernels = f"""\
@triton.jit
def layer_norm_kernel(
{SIGNATURE}
    # meta-parameters
    BLOCK_N: tl.constexpr,  # next_pow2(N): one block holds a whole row
    NUM_STAGES: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    # weight and bias stay in registers for every row this program visits
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=col_mask, other=0.0)
{rw.persistent_loop(_row_body(v))}
"""
    launcher = f"""\
{PROLOGUE}
    BLOCK_N = triton.next_power_of_2(N)
    grid = (min(GRID_SIZE, M),)
    layer_norm_kernel[grid](
        x, weight, bias, y, M, N, x.stride(0), y.stride(0), eps,
        BLOCK_N=BLOCK_N, NUM_STAGES=NUM_STAGES,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return y
"""
    return _module(
        v,
        "persistent_row_in_registers",
        "fused single pass over a fixed, persistent grid",
        f"""GRID_SIZE programs (capped at M) stride over the rows; each row is loaded whole into
        registers, normalised ({v["var_algo"]} variance) and written once, the row loop
        software-pipelined NUM_STAGES deep. A grid far below the SM count leaves the GPU
        idle.""",
        "2 B read + 2 B written per element, one kernel.",
        kernels,
        launcher,
    )


# -----------------------------------------------------------------------------
# looped families: three_pass_looped, sum_sumsq_looped, welford_looped
# -----------------------------------------------------------------------------
def _looped_kernel(stats: str) -> str:
    return f"""\
@triton.jit
def layer_norm_kernel(
{SIGNATURE}
    # meta-parameters
    BLOCK_N: tl.constexpr,  # columns per loop step
):
    # -- map program to row
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_xm
    y_row = y_ptr + row * stride_ym
    cols = tl.arange(0, BLOCK_N)
{stats}
    rstd = tl.rsqrt(var + eps)
    # -- last pass: normalise, affine, write bf16
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        mask = offs < N
        x = tl.load(x_row + offs, mask=mask, other=0.0{{ev}}).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        b = tl.load(b_ptr + offs, mask=mask, other=0.0)
        xhat = (x - mean) * rstd
        tl.store(y_row + offs, {AFFINE}, mask=mask)
"""


LOOPED_LAUNCHER = f"""\
{PROLOGUE}
    layer_norm_kernel[(M,)](
        x, weight, bias, y, M, N, x.stride(0), y.stride(0), eps,
        BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return y
"""

STATS_THREE_PASS = """\
    # -- pass 1: mean
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        acc += tl.load(x_row + offs, mask=offs < N, other=0.0{ev}).to(tl.float32)
    mean = tl.sum(acc, axis=0) / N
    # -- pass 2: centred variance; padding is masked out of (x - mean)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        mask = offs < N
        x = tl.load(x_row + offs, mask=mask, other=0.0{ev}).to(tl.float32)
        xc = tl.where(mask, x - mean, 0.0)
        acc += xc * xc
    var = tl.sum(acc, axis=0) / N"""

STATS_SUMSQ = """\
    # -- pass 1: sum and sum of squares together, one read of x
    s1 = tl.zeros([BLOCK_N], dtype=tl.float32)
    s2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < N, other=0.0{ev}).to(tl.float32)
        s1 += x
        s2 += x * x
    mean = tl.sum(s1, axis=0) / N
    # E[x^2] - E[x]^2 can dip below 0 by rounding: clamp
    var = tl.maximum(tl.sum(s2, axis=0) / N - mean * mean, 0.0)"""

STATS_WELFORD = """\
    # -- pass 1: per-lane Welford (count, mean, M2), one read of x; lanes past N do not count
    cnt = tl.zeros([BLOCK_N], dtype=tl.float32)
    mu = tl.zeros([BLOCK_N], dtype=tl.float32)
    m2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        mask = offs < N
        x = tl.load(x_row + offs, mask=mask, other=0.0{ev}).to(tl.float32)
        cnt += mask.to(tl.float32)
        delta = x - mu
        mu += tl.where(mask, delta / tl.maximum(cnt, 1.0), 0.0)
        m2 += tl.where(mask, delta * (x - mu), 0.0)
    # -- combine the lanes (Chan et al.): M2 = sum(M2_i + n_i * (mu_i - mean)^2)
    mean = tl.sum(cnt * mu, axis=0) / N
    dev = mu - mean
    var = tl.sum(m2 + cnt * dev * dev, axis=0) / N"""


def _render_looped(
    v: KnobValues, algorithm: str, summary: str, stats: str, details: str, traffic: str
) -> str:
    ev = rw.evict(v)
    kernels = _looped_kernel(stats).replace("{ev}", ev)
    return _module(v, algorithm, summary, details, traffic, kernels, LOOPED_LAUNCHER)


def render_three_pass(v: KnobValues) -> str:
    return _render_looped(
        v,
        "three_pass_looped",
        "looped: mean, centred variance, then normalise",
        STATS_THREE_PASS,
        """One program per row loops over the columns BLOCK_N at a time, three times: the
        mean, the variance of the centred values (numerically the safest), then the
        normalised, affine write.""",
        "3 x 2 B read + 2 B written per element (re-reads hit L2 only for short rows).",
    )


def render_sum_sumsq(v: KnobValues) -> str:
    return _render_looped(
        v,
        "sum_sumsq_looped",
        "looped: sum and sum of squares in one read, normalise in a second",
        STATS_SUMSQ,
        """One program per row loops over the columns BLOCK_N at a time: pass 1 accumulates sum
        and sum of squares per lane (var = E[x^2] - E[x]^2, clamped), pass 2 re-reads x and
        writes the normalised, affine output.""",
        "2 x 2 B read + 2 B written per element.",
    )


def render_welford(v: KnobValues) -> str:
    return _render_looped(
        v,
        "welford_looped",
        "looped: per-lane Welford in one read, normalise in a second",
        STATS_WELFORD,
        """One program per row loops over the columns BLOCK_N at a time: pass 1 runs Welford's
        update per lane (a division per element, numerically stable), the lanes are merged
        with Chan's formula, pass 2 re-reads x and writes the normalised, affine output.""",
        "2 x 2 B read + 2 B written per element, one fp32 division per element in pass 1.",
    )


# -----------------------------------------------------------------------------
# unfused_multi_kernel
# -----------------------------------------------------------------------------
def render_unfused(v: KnobValues) -> str:
    kernels = """\
@triton.jit
def stats_kernel(
    # pointers
    x_ptr, mean_ptr, rstd_ptr,
    # sizes
    N,
    # strides (elements)
    stride_xm,
    # scalars
    eps,
    # meta-parameters
    BLOCK_N: tl.constexpr,
):
    # -- one program per row: looped mean, then centred variance -> fp32 (M,) temporaries
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        acc += tl.load(x_ptr + row * stride_xm + offs, mask=offs < N, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        mask = offs < N
        x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
        xc = tl.where(mask, x - mean, 0.0)
        acc += xc * xc
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, tl.rsqrt(tl.sum(acc, axis=0) / N + eps))


@triton.jit
def normalise_kernel(
    # pointers
    x_ptr, mean_ptr, rstd_ptr, h_ptr,
    # sizes
    M, N,
    # strides (elements)
    stride_xm, stride_hm,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # -- 2-D tiles: x-hat = (x - mean) * rstd into the (M, N) temporary
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0)
    mean = tl.load(mean_ptr + rows, mask=rows < M, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
    h = (x.to(tl.float32) - mean[:, None]) * rstd[:, None]
    tl.store(h_ptr + rows[:, None] * stride_hm + cols[None, :], h.to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def affine_kernel(
    # pointers
    h_ptr, w_ptr, b_ptr, y_ptr,
    # sizes
    M, N,
    # strides (elements)
    stride_hm, stride_ym,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # -- 2-D tiles: y = x-hat * w + b, bf16
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    h = tl.load(h_ptr + rows[:, None] * stride_hm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    y = h * w[None, :] + b[None, :]
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(tl.bfloat16), mask=mask)
"""
    launcher = f"""\
{PROLOGUE}
    mean = torch.empty((M,), dtype=torch.float32, device=x.device)
    rstd = torch.empty((M,), dtype=torch.float32, device=x.device)
    h = torch.empty((M, N), dtype=torch.{v["tmp_dtype"]}, device=x.device)
    tiles = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    launch = dict(num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    stats_kernel[(M,)](x, mean, rstd, N, x.stride(0), eps, BLOCK_N=BLOCK_N, **launch)
    normalise_kernel[tiles](x, mean, rstd, h, M, N, x.stride(0), h.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **launch)
    affine_kernel[tiles](h, weight, bias, y, M, N, h.stride(0), y.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **launch)
    return y
"""
    nbytes = 4 if v["tmp_dtype"] == "float32" else 2
    return _module(
        v,
        "unfused_multi_kernel",
        "stats, normalise, affine as three kernels through an (M, N) temporary",
        f"""No fusion: a looped per-row kernel writes mean and rstd (two passes over x) to fp32
        (M,) temporaries, a 2-D tiled kernel writes x-hat to an (M, N) {v["tmp_dtype"]}
        temporary, and a third 2-D tiled kernel applies weight and bias.""",
        f"x read three times (3 x 2 B), temporary written and read ({nbytes} + {nbytes} B), y written (2 B) per element.",
        kernels,
        launcher,
    )


# -----------------------------------------------------------------------------
# torch_partial
# -----------------------------------------------------------------------------
def render_torch_partial(v: KnobValues) -> str:
    ev = rw.evict(v)
    if v["fallback"] == "normalise_in_torch":
        kernels = f"""\
@triton.jit
def stats_kernel(
    # pointers
    x_ptr, mean_ptr, rstd_ptr,
    # sizes
    N,
    # strides (elements)
    stride_xm,
    # scalars
    eps,
    # meta-parameters
    BLOCK_N: tl.constexpr,  # columns per loop step
):
    # -- one program per row: sum and sum of squares in one read -> mean, rstd (fp32)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    s1 = tl.zeros([BLOCK_N], dtype=tl.float32)
    s2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < N, other=0.0{ev}).to(tl.float32)
        s1 += x
        s2 += x * x
    mean = tl.sum(s1, axis=0) / N
    var = tl.maximum(tl.sum(s2, axis=0) / N - mean * mean, 0.0)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, tl.rsqrt(var + eps))
"""
        body = """\
    mean = torch.empty((M,), dtype=torch.float32, device=x.device)
    rstd = torch.empty((M,), dtype=torch.float32, device=x.device)
    stats_kernel[(M,)](
        x, mean, rstd, N, x.stride(0), eps,
        BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    # -- PyTorch fallback for the elementwise half: fp32 copies of x and every intermediate
    xhat = (x.float() - mean[:, None]) * rstd[:, None]
    y.copy_(xhat * weight.float() + bias.float())
    return y
"""
        details = """Per-row mean and rstd come from a looped Triton kernel (sum and sum of
        squares); normalisation and the affine epilogue are left to PyTorch, which
        materialises fp32 copies."""
        traffic = "Triton reads 2 B; PyTorch then moves ~30 B per element (upcast, centre, scale, affine, copy)."
    else:
        kernels = f"""\
@triton.jit
def layer_norm_apply_kernel(
    # pointers
    x_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, y_ptr,
    # sizes
    N,
    # strides (elements)
    stride_xm, stride_ym,
    # meta-parameters
    BLOCK_N: tl.constexpr,  # columns per loop step
):
    # -- one program per row: y = (x - mean) * rstd * w + b with statistics from PyTorch
    row = tl.program_id(0)
    mean = tl.load(mean_ptr + row)
    rstd = tl.load(rstd_ptr + row)
    cols = tl.arange(0, BLOCK_N)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        mask = offs < N
        x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0{ev}).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        b = tl.load(b_ptr + offs, mask=mask, other=0.0)
        xhat = (x - mean) * rstd
        tl.store(y_ptr + row * stride_ym + offs, {AFFINE}, mask=mask)
"""
        body = """\
    # -- PyTorch fallback for the statistics: an fp32 copy of x, its mean and biased variance
    xf = x.float()
    var, mean = torch.var_mean(xf, dim=-1, correction=0)
    rstd = torch.rsqrt(var + eps)
    layer_norm_apply_kernel[(M,)](
        x, weight, bias, mean, rstd, y, N, x.stride(0), y.stride(0),
        BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return y
"""
        details = """Per-row statistics come from PyTorch (an fp32 copy of x, var_mean); only
        the normalise-and-affine pass is a looped Triton kernel."""
        traffic = (
            "PyTorch moves ~10 B per element for the statistics; Triton reads 2 B and writes 2 B."
        )
    return _module(
        v,
        "torch_partial",
        "half Triton, half PyTorch fallback",
        details + f" fallback={v['fallback']}.",
        traffic,
        kernels,
        f"{PROLOGUE}\n{body}",
    )


# -----------------------------------------------------------------------------
# grid_capped_sum_sumsq
# -----------------------------------------------------------------------------
def render_grid_capped(v: KnobValues) -> str:
    body = f"""\
# -- pass 1: sum and sum of squares of the row in one read (fp32 per-lane accumulators)
s1 = tl.zeros([BLOCK_N], dtype=tl.float32)
s2 = tl.zeros([BLOCK_N], dtype=tl.float32)
for start in tl.range(0, N, BLOCK_N, num_stages=NUM_STAGES):
    offs = start + cols
    x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < N, other=0.0).to(tl.float32)
    s1 += x
    s2 += x * x
mean = tl.sum(s1, axis=0) / N
var = tl.maximum(tl.sum(s2, axis=0) / N - mean * mean, 0.0)
rstd = tl.rsqrt(var + eps)
# -- pass 2: re-read the row, normalise, affine, write bf16
for start in tl.range(0, N, BLOCK_N, num_stages=NUM_STAGES):
    offs = start + cols
    mask = offs < N
    x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0)
    xhat = (x - mean) * rstd
    tl.store(y_ptr + row * stride_ym + offs, {AFFINE}, mask=mask)
"""
    kernels = f"""\
@triton.jit
def layer_norm_kernel(
{SIGNATURE}
    # meta-parameters
    BLOCK_N: tl.constexpr,  # columns per loop step
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the column loops
):
    cols = tl.arange(0, BLOCK_N)
{rw.capped_rows_loop(body)}"""
    launcher = f"""\
{PROLOGUE}
    grid = (min(PROGRAMS, M),)  # deliberately few programs: each walks M / PROGRAMS rows
    layer_norm_kernel[grid](
        x, weight, bias, y, M, N, x.stride(0), y.stride(0), eps,
        BLOCK_N=BLOCK_N, NUM_STAGES=NUM_STAGES,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return y
"""
    return rw.module(
        task=TASK,
        algorithm="grid_capped_sum_sumsq",
        summary="looped sum/sum-of-squares LayerNorm on a capped grid of PROGRAMS programs",
        details=rw.CAPPED_DETAILS
        + """ Per row: sum and sum of squares in one looped read, then a second read that
        normalises and applies weight and bias.""",
        traffic="2 x 2 B read + 2 B written per element, but at the bandwidth PROGRAMS programs reach.",
        values=v,
        knob_docs={**KNOB_DOCS, "PROGRAMS": rw.PROGRAMS_DOC},
        kernels=kernels,
        launcher=launcher,
    )


# -----------------------------------------------------------------------------
# The space
# -----------------------------------------------------------------------------
LOOPED_KNOBS = (rw.BLOCK_N_LOOP, rw.NUM_WARPS, rw.NUM_STAGES, rw.EVICTION)

FAMILIES: tuple[Family, ...] = (
    rw.family(
        TASK,
        "row_in_registers",
        "fused single pass, whole row in registers, rows looped per program",
        (rw.ROWS_PER_PROGRAM, rw.NUM_WARPS_ROW, rw.NUM_STAGES, rw.EVICTION, VAR_ALGO, rw.ROW_GUARD),
        render_row_in_registers,
    ),
    rw.family(
        TASK,
        "persistent_row_in_registers",
        "fused single pass over a persistent grid striding rows",
        (rw.GRID_SIZE, rw.NUM_WARPS_ROW, rw.NUM_STAGES, rw.EVICTION, VAR_ALGO),
        render_persistent,
    ),
    rw.family(
        TASK,
        "three_pass_looped",
        "looped mean, centred variance, normalise: three reads of x",
        LOOPED_KNOBS,
        render_three_pass,
        rw.looped_constraint,
    ),
    rw.family(
        TASK,
        "sum_sumsq_looped",
        "looped sum and sum of squares in one read, normalise in a second",
        LOOPED_KNOBS,
        render_sum_sumsq,
        rw.looped_constraint,
    ),
    rw.family(
        TASK,
        "welford_looped",
        "looped per-lane Welford in one read, normalise in a second",
        LOOPED_KNOBS,
        render_welford,
        rw.looped_constraint,
    ),
    rw.family(
        TASK,
        "unfused_multi_kernel",
        "stats, normalise, affine as three kernels through an (M, N) temporary",
        (rw.BLOCK_M_TILE, rw.BLOCK_N_TILE, rw.NUM_WARPS, rw.NUM_STAGES, TMP_DTYPE),
        render_unfused,
        rw.tile_constraint,
    ),
    rw.family(
        TASK,
        "torch_partial",
        "statistics or normalisation left to PyTorch",
        (FALLBACK, rw.BLOCK_N_TILE, rw.NUM_WARPS, rw.NUM_STAGES, rw.EVICTION),
        render_torch_partial,
        rw.looped_constraint,
    ),
    rw.family(
        TASK,
        "grid_capped_sum_sumsq",
        "looped sum/sumsq LayerNorm on a capped grid of PROGRAMS programs (under-occupancy)",
        (rw.PROGRAMS, rw.BLOCK_N_CAPPED, rw.NUM_WARPS_CAPPED, rw.NUM_STAGES),
        render_grid_capped,
        rw.looped_constraint,
    ),
)

SEED: tuple[str, dict] = (
    "three_pass_looped",
    {"BLOCK_N": 1024, "NUM_WARPS": 4, "NUM_STAGES": 2, "eviction": "none"},
)
