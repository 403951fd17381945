"""Kernel families of the rms_norm task: y = weight * (x * rsqrt(mean(x^2) + eps)).to(bf16).

The reference is the unfused LlamaRMSNorm expression (~36 B/elt); a fused kernel moves 4 B/elt.
    row_in_registers             one read, one write, whole row in registers, weight kept per program
    persistent_row_in_registers  same body over a fixed, persistent grid
    two_pass_looped              looped: sum of squares, then normalise (x read twice)
    multi_row_tile               looped 2-D [BLOCK_M, BLOCK_N] tiles: several rows per program
    split_row_atomic             each row split over SPLIT programs, partial sums via atomics
    unfused_multi_kernel         three kernels through an (M, N) temporary
    torch_partial                statistics or normalisation left to PyTorch
"""

from __future__ import annotations

from pipelines.generation.families import _rowwise as rw
from pipelines.generation.space import Family, Knob, KnobValues

TASK = "rms_norm"

KNOB_DOCS = {
    "BLOCK_N": "columns per block",
    "BLOCK_M": "rows per 2-D tile",
    "NUM_WARPS": "warps per program",
    "NUM_STAGES": "software-pipelining depth of loops",
    "ROWS_PER_PROGRAM": "rows per program, one after another",
    "GRID_SIZE": "programs of the persistent grid (capped at M)",
    "SPLIT": "programs sharing one row",
}

EPILOGUE = Knob(
    "epilogue",
    ("fp32_weight", "bf16_weight"),
    "x * rstd * w in fp32 with one rounding, or (x * rstd) rounded to bf16 then times w in bf16",
)
TMP_DTYPE = Knob("tmp_dtype", ("float32", "bfloat16"), "dtype of the normalised (M, N) temporary")
FALLBACK = Knob("fallback", ("normalise_in_torch", "stats_in_torch"), "which half runs in PyTorch")
BLOCK_M_ROWS = Knob("BLOCK_M", (2, 4, 8, 16), "rows per 2-D tile")
SPLIT = Knob("SPLIT", (2, 4, 8, 16), "programs sharing one row")

PROLOGUE = """\
def custom_kernel(data):
    x, weight, eps = data
    assert x.ndim == 2 and x.dtype == torch.bfloat16, "rms_norm expects x: (M, N) bf16"
    assert weight.shape == (x.shape[1],) and weight.dtype == torch.bfloat16, "weight: (N,) bf16"
    if x.stride(1) != 1:
        x = x.contiguous()  # the kernels step through columns with unit stride
    weight = weight.contiguous()
    M, N = x.shape
    y = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)"""

SIGNATURE = """\
    # pointers
    x_ptr, w_ptr, y_ptr,
    # sizes
    M, N,
    # strides (elements)
    stride_xm, stride_ym,
    # scalars
    eps,"""


def _epilogue(v: KnobValues, x: str, rstd: str, w: str) -> str:
    """bf16 output expression from fp32 x, fp32 rstd and bf16 w (already broadcast)."""
    if v["epilogue"] == "bf16_weight":
        # LlamaRMSNorm's rounding: normalise in fp32, round to bf16, multiply by the bf16 weight.
        # The fp32 product of two bf16 values is exact, so rounding it once more is exactly a
        # bf16 multiply (and it runs under the Triton interpreter, which cannot multiply bf16).
        return (
            f"(({x} * {rstd}).to(tl.bfloat16).to(tl.float32) * {w}.to(tl.float32)).to(tl.bfloat16)"
        )
    return f"({x} * {rstd} * {w}.to(tl.float32)).to(tl.bfloat16)"


def _row_body(v: KnobValues) -> str:
    return f"""\
# -- load the row once (2 B/elt), fp32 in registers; padding is 0 and adds nothing
x = tl.load(x_ptr + row * stride_xm + cols, mask=col_mask, other=0.0{rw.evict(v)}).to(tl.float32)
rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
# -- normalise, scale by the weight, masked write-back (2 B/elt)
tl.store(y_ptr + row * stride_ym + cols, {_epilogue(v, "x", "rstd", "w")}, mask=col_mask)
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
        details=details + f" epilogue={v.get('epilogue', 'fp32_weight')}.",
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
def rms_norm_kernel(
{SIGNATURE}
    # meta-parameters
    BLOCK_N: tl.constexpr,  # next_pow2(N): one block holds a whole row
    ROWS_PER_PROGRAM: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    # -- map program to ROWS_PER_PROGRAM consecutive rows; the weight is loaded once per program
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0)
{rw.rows_loop(v["row_guard"], _row_body(v))}
"""
    launcher = f"""\
{PROLOGUE}
    BLOCK_N = triton.next_power_of_2(N)
    grid = (triton.cdiv(M, ROWS_PER_PROGRAM),)
    rms_norm_kernel[grid](
        x, weight, y, M, N, x.stride(0), y.stride(0), eps,
        BLOCK_N=BLOCK_N, ROWS_PER_PROGRAM=ROWS_PER_PROGRAM, NUM_STAGES=NUM_STAGES,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return y
"""
    return _module(
        v,
        "row_in_registers",
        "fused single pass, the whole row held in registers",
        f"""Each program loads whole rows (BLOCK_N = next_pow2(N)) into registers, reduces the
        sum of squares in fp32 and writes the normalised, weighted row once; the weight vector
        is loaded once per program and reused for its ROWS_PER_PROGRAM rows;
        {rw.guard_words(v["row_guard"])}.""",
        "2 B read + 2 B written per element, one kernel; weight 2 B/col per program.",
        kernels,
        launcher,
    )


def render_persistent(v: KnobValues) -> str:
    kernels = f"""\
@triton.jit
def rms_norm_kernel(
{SIGNATURE}
    # meta-parameters
    BLOCK_N: tl.constexpr,  # next_pow2(N): one block holds a whole row
    NUM_STAGES: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    # the weight stays in registers for every row this program visits
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0)
{rw.persistent_loop(_row_body(v))}
"""
    launcher = f"""\
{PROLOGUE}
    BLOCK_N = triton.next_power_of_2(N)
    grid = (min(GRID_SIZE, M),)
    rms_norm_kernel[grid](
        x, weight, y, M, N, x.stride(0), y.stride(0), eps,
        BLOCK_N=BLOCK_N, NUM_STAGES=NUM_STAGES,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return y
"""
    return _module(
        v,
        "persistent_row_in_registers",
        "fused single pass over a fixed, persistent grid",
        """GRID_SIZE programs (capped at M) stride over the rows; each row is loaded whole into
        registers, reduced and written once, the row loop software-pipelined NUM_STAGES deep.
        The weight is loaded once per program. A grid far below the SM count leaves the GPU
        idle.""",
        "2 B read + 2 B written per element, one kernel.",
        kernels,
        launcher,
    )


# -----------------------------------------------------------------------------
# two_pass_looped
# -----------------------------------------------------------------------------
def render_two_pass(v: KnobValues) -> str:
    ev = rw.evict(v)
    kernels = f"""\
@triton.jit
def rms_norm_kernel(
{SIGNATURE}
    # meta-parameters
    BLOCK_N: tl.constexpr,  # columns per loop step
):
    # -- map program to row
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_xm
    y_row = y_ptr + row * stride_ym
    cols = tl.arange(0, BLOCK_N)
    # -- pass 1: per-lane sum of squares in fp32, reduced once after the loop
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < N, other=0.0{ev}).to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    # -- pass 2: read x again, normalise, weight, write bf16
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        mask = offs < N
        x = tl.load(x_row + offs, mask=mask, other=0.0{ev}).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        tl.store(y_row + offs, {_epilogue(v, "x", "rstd", "w")}, mask=mask)
"""
    launcher = f"""\
{PROLOGUE}
    rms_norm_kernel[(M,)](
        x, weight, y, M, N, x.stride(0), y.stride(0), eps,
        BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return y
"""
    return _module(
        v,
        "two_pass_looped",
        "looped: sum of squares, then a second read to normalise",
        """One program per row loops over the columns BLOCK_N at a time (any N, fixed register
        budget): pass 1 accumulates squares per lane in fp32, pass 2 reads x again with the
        weight and writes the output.""",
        "2 x 2 B read + 2 B written per element (the second read hits L2 for short rows).",
        kernels,
        launcher,
    )


# -----------------------------------------------------------------------------
# multi_row_tile
# -----------------------------------------------------------------------------
def render_multi_row(v: KnobValues) -> str:
    ev = rw.evict(v)
    kernels = f"""\
@triton.jit
def rms_norm_kernel(
{SIGNATURE}
    # meta-parameters
    BLOCK_M: tl.constexpr,  # rows per program, processed together as a 2-D tile
    BLOCK_N: tl.constexpr,  # columns per loop step
):
    # -- map program to BLOCK_M rows
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    cols = tl.arange(0, BLOCK_N)
    # -- pass 1: [BLOCK_M, BLOCK_N] tile of squares, reduced along columns after the loop
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        mask = row_mask[:, None] & (offs[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + offs[None, :], mask=mask, other=0.0{ev})
        x = x.to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)  # (BLOCK_M,)
    # -- pass 2: normalise tile by tile; the weight block is shared by the BLOCK_M rows
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        mask = row_mask[:, None] & (offs[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + offs[None, :], mask=mask, other=0.0{ev})
        x = x.to(tl.float32)
        w = tl.load(w_ptr + offs, mask=offs < N, other=0.0)
        y = {_epilogue(v, "x", "rstd[:, None]", "w[None, :]")}
        tl.store(y_ptr + rows[:, None] * stride_ym + offs[None, :], y, mask=mask)
"""
    launcher = f"""\
{PROLOGUE}
    grid = (triton.cdiv(M, BLOCK_M),)
    rms_norm_kernel[grid](
        x, weight, y, M, N, x.stride(0), y.stride(0), eps,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return y
"""
    return _module(
        v,
        "multi_row_tile",
        "looped 2-D tiles of BLOCK_M rows x BLOCK_N columns per program",
        """Each program owns BLOCK_M rows and walks them together in [BLOCK_M, BLOCK_N] tiles,
        twice (sum of squares, then normalise); fewer, fatter programs that share each weight
        block, good for short rows, with less parallelism for few rows.""",
        "2 x 2 B read + 2 B written per element.",
        kernels,
        launcher,
    )


# -----------------------------------------------------------------------------
# split_row_atomic
# -----------------------------------------------------------------------------
def render_split(v: KnobValues) -> str:
    ev = rw.evict(v)
    kernels = f"""\
@triton.jit
def sumsq_split_kernel(
    # pointers
    x_ptr, ss_ptr,
    # sizes
    N, chunk,
    # strides (elements)
    stride_xm,
    # meta-parameters
    BLOCK_N: tl.constexpr,  # columns per loop step
):
    # -- program (row, s) sums the squares of columns [s * chunk, (s + 1) * chunk)
    row = tl.program_id(0)
    lo = tl.program_id(1) * chunk
    hi = tl.minimum(lo + chunk, N)
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs = start + cols
        x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < hi, other=0.0{ev}).to(tl.float32)
        acc += x * x
    # -- SPLIT programs meet in one fp32 word per row (order of the adds is not fixed)
    tl.atomic_add(ss_ptr + row, tl.sum(acc, axis=0))


@triton.jit
def rms_norm_apply_kernel(
{SIGNATURE}
    ss_ptr,
    chunk,
    # meta-parameters
    BLOCK_N: tl.constexpr,
):
    # -- program (row, s) normalises its chunk with the row's completed sum of squares
    row = tl.program_id(0)
    lo = tl.program_id(1) * chunk
    hi = tl.minimum(lo + chunk, N)
    rstd = tl.rsqrt(tl.load(ss_ptr + row) / N + eps)
    cols = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        offs = start + cols
        mask = offs < hi
        x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0{ev}).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        tl.store(y_ptr + row * stride_ym + offs, {_epilogue(v, "x", "rstd", "w")}, mask=mask)
"""
    launcher = f"""\
{PROLOGUE}
    sumsq = torch.zeros((M,), dtype=torch.float32, device=x.device)  # atomics accumulate here
    chunk = triton.cdiv(triton.cdiv(N, SPLIT), BLOCK_N) * BLOCK_N  # columns per program
    grid = (M, SPLIT)
    launch = dict(num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    sumsq_split_kernel[grid](x, sumsq, N, chunk, x.stride(0), BLOCK_N=BLOCK_N, **launch)
    rms_norm_apply_kernel[grid](
        x, weight, y, M, N, x.stride(0), y.stride(0), eps, sumsq, chunk, BLOCK_N=BLOCK_N, **launch
    )
    return y
"""
    return _module(
        v,
        "split_row_atomic",
        "each row split over SPLIT programs; partial sums meet via atomics",
        """More parallelism per row: a grid of (M, SPLIT) programs each sums the squares of a
        column chunk and atomically adds it to an fp32 per-row total; a second launch over the
        same grid normalises each chunk. Costs a zero-fill, atomics and a second read of x.""",
        "2 x 2 B read + 2 B written per element, plus M atomics x SPLIT and a 4 B/row zero-fill.",
        kernels,
        launcher,
    )


# -----------------------------------------------------------------------------
# unfused_multi_kernel
# -----------------------------------------------------------------------------
def render_unfused(v: KnobValues) -> str:
    kernels = """\
@triton.jit
def rstd_kernel(
    # pointers
    x_ptr, rstd_ptr,
    # sizes
    N,
    # strides (elements)
    stride_xm,
    # scalars
    eps,
    # meta-parameters
    BLOCK_N: tl.constexpr,
):
    # -- one program per row: looped sum of squares -> rstd, an fp32 (M,) temporary
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < N, other=0.0).to(tl.float32)
        acc += x * x
    tl.store(rstd_ptr + row, tl.rsqrt(tl.sum(acc, axis=0) / N + eps))


@triton.jit
def scale_kernel(
    # pointers
    x_ptr, rstd_ptr, h_ptr,
    # sizes
    M, N,
    # strides (elements)
    stride_xm, stride_hm,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # -- 2-D tiles: h = x * rstd[row] into the (M, N) temporary
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0)
    r = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
    h = x.to(tl.float32) * r[:, None]
    tl.store(h_ptr + rows[:, None] * stride_hm + cols[None, :], h.to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def weight_kernel(
    # pointers
    h_ptr, w_ptr, y_ptr,
    # sizes
    M, N,
    # strides (elements)
    stride_hm, stride_ym,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # -- 2-D tiles: y = h * w, bf16
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    h = tl.load(h_ptr + rows[:, None] * stride_hm + cols[None, :], mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0)
    y = h.to(tl.float32) * w.to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(tl.bfloat16), mask=mask)
"""
    launcher = f"""\
{PROLOGUE}
    rstd = torch.empty((M,), dtype=torch.float32, device=x.device)
    h = torch.empty((M, N), dtype=torch.{v["tmp_dtype"]}, device=x.device)
    tiles = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    launch = dict(num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    rstd_kernel[(M,)](x, rstd, N, x.stride(0), eps, BLOCK_N=BLOCK_N, **launch)
    scale_kernel[tiles](x, rstd, h, M, N, x.stride(0), h.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **launch)
    weight_kernel[tiles](h, weight, y, M, N, h.stride(0), y.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **launch)
    return y
"""
    nbytes = 4 if v["tmp_dtype"] == "float32" else 2
    return rw.module(
        task=TASK,
        algorithm="unfused_multi_kernel",
        summary="rstd, scale and weight as three kernels through an (M, N) temporary",
        details=f"""No fusion: a looped per-row kernel writes rstd to an fp32 (M,) temporary, a
        2-D tiled kernel writes h = x * rstd to an (M, N) {v["tmp_dtype"]} temporary, and a
        third 2-D tiled kernel multiplies by the weight and writes bf16. Three launches and a
        round trip of the temporary through HBM.""",
        traffic=f"x read twice (2 + 2 B), temporary written and read ({nbytes} + {nbytes} B), y written (2 B) per element.",
        values=v,
        knob_docs=KNOB_DOCS,
        kernels=kernels,
        launcher=launcher,
    )


# -----------------------------------------------------------------------------
# torch_partial
# -----------------------------------------------------------------------------
def render_torch_partial(v: KnobValues) -> str:
    ev = rw.evict(v)
    if v["fallback"] == "normalise_in_torch":
        kernels = f"""\
@triton.jit
def rstd_kernel(
    # pointers
    x_ptr, rstd_ptr,
    # sizes
    N,
    # strides (elements)
    stride_xm,
    # scalars
    eps,
    # meta-parameters
    BLOCK_N: tl.constexpr,  # columns per loop step
):
    # -- one program per row: looped sum of squares -> rstd (fp32, one value per row)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < N, other=0.0{ev}).to(tl.float32)
        acc += x * x
    tl.store(rstd_ptr + row, tl.rsqrt(tl.sum(acc, axis=0) / N + eps))
"""
        body = """\
    rstd = torch.empty((M,), dtype=torch.float32, device=x.device)
    rstd_kernel[(M,)](
        x, rstd, N, x.stride(0), eps,
        BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    # -- PyTorch fallback for the elementwise half: an fp32 copy of x, scale, round, weight
    y.copy_(weight * (x.float() * rstd[:, None]).to(torch.bfloat16))
    return y
"""
        details = """The per-row rstd comes from a looped Triton kernel; the normalisation and
        weight multiply are left to PyTorch, which materialises fp32 and bf16 copies."""
        traffic = "Triton reads 2 B; PyTorch then moves ~24 B per element (upcast, scale, round, weight, copy)."
    else:
        kernels = f"""\
@triton.jit
def rms_norm_apply_kernel(
    # pointers
    x_ptr, w_ptr, rstd_ptr, y_ptr,
    # sizes
    N,
    # strides (elements)
    stride_xm, stride_ym,
    # meta-parameters
    BLOCK_N: tl.constexpr,  # columns per loop step
):
    # -- one program per row: y = x * rstd * w with rstd from PyTorch
    row = tl.program_id(0)
    rstd = tl.load(rstd_ptr + row)
    cols = tl.arange(0, BLOCK_N)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        mask = offs < N
        x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0{ev}).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        tl.store(y_ptr + row * stride_ym + offs, (x * rstd * w.to(tl.float32)).to(tl.bfloat16), mask=mask)
"""
        body = """\
    # -- PyTorch fallback for the statistics: an fp32 copy of x, its squares and their mean
    rstd = torch.rsqrt(x.float().pow(2).mean(dim=-1) + eps)
    rms_norm_apply_kernel[(M,)](
        x, weight, rstd, y, N, x.stride(0), y.stride(0),
        BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return y
"""
        details = """The per-row statistics come from PyTorch (fp32 copy of x, squares, mean,
        rsqrt); only the normalise-and-weight pass is a looped Triton kernel."""
        traffic = (
            "PyTorch moves ~18 B per element for the statistics; Triton reads 2 B and writes 2 B."
        )
    return rw.module(
        task=TASK,
        algorithm="torch_partial",
        summary="half Triton, half PyTorch fallback",
        details=details + f" fallback={v['fallback']}.",
        traffic=traffic,
        values=v,
        knob_docs=KNOB_DOCS,
        kernels=kernels,
        launcher=f"{PROLOGUE}\n{body}",
    )


# -----------------------------------------------------------------------------
# grid_capped_two_pass
# -----------------------------------------------------------------------------
FP32_EPILOGUE = {"epilogue": "fp32_weight"}  # x * rstd * w in fp32, one rounding


def render_grid_capped(v: KnobValues) -> str:
    body = f"""\
# -- pass 1: sum of squares of the row, BLOCK_N columns per step (fp32)
acc = tl.zeros([BLOCK_N], dtype=tl.float32)
for start in tl.range(0, N, BLOCK_N, num_stages=NUM_STAGES):
    offs = start + cols
    x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < N, other=0.0).to(tl.float32)
    acc += x * x
rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
# -- pass 2: re-read the row, normalise, scale by the weight, write bf16
for start in tl.range(0, N, BLOCK_N, num_stages=NUM_STAGES):
    offs = start + cols
    mask = offs < N
    x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + row * stride_ym + offs, {_epilogue(FP32_EPILOGUE, "x", "rstd", "w")}, mask=mask)
"""
    kernels = f"""\
@triton.jit
def rms_norm_kernel(
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
    rms_norm_kernel[grid](
        x, weight, y, M, N, x.stride(0), y.stride(0), eps,
        BLOCK_N=BLOCK_N, NUM_STAGES=NUM_STAGES,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return y
"""
    return rw.module(
        task=TASK,
        algorithm="grid_capped_two_pass",
        summary="looped two-pass RMSNorm on a capped grid of PROGRAMS programs",
        details=rw.CAPPED_DETAILS
        + """ Per row: a looped sum of squares, then a second read that normalises and
        multiplies by the weight (fp32, one rounding to bf16).""",
        traffic="2 x 2 B read + 2 B written per element, but at the bandwidth PROGRAMS programs reach.",
        values=v,
        knob_docs={**KNOB_DOCS, "PROGRAMS": rw.PROGRAMS_DOC},
        kernels=kernels,
        launcher=launcher,
    )


# -----------------------------------------------------------------------------
# The space
# -----------------------------------------------------------------------------
FAMILIES: tuple[Family, ...] = (
    rw.family(
        TASK,
        "row_in_registers",
        "fused single pass, whole row in registers, rows looped per program",
        (rw.ROWS_PER_PROGRAM, rw.NUM_WARPS_ROW, rw.NUM_STAGES, rw.EVICTION, EPILOGUE, rw.ROW_GUARD),
        render_row_in_registers,
    ),
    rw.family(
        TASK,
        "persistent_row_in_registers",
        "fused single pass over a persistent grid striding rows",
        (rw.GRID_SIZE, rw.NUM_WARPS_ROW, rw.NUM_STAGES, rw.EVICTION, EPILOGUE),
        render_persistent,
    ),
    rw.family(
        TASK,
        "two_pass_looped",
        "looped sum of squares, then a second read to normalise",
        (rw.BLOCK_N_LOOP, rw.NUM_WARPS, rw.NUM_STAGES, rw.EVICTION, EPILOGUE),
        render_two_pass,
        rw.looped_constraint,
    ),
    rw.family(
        TASK,
        "multi_row_tile",
        "looped 2-D tiles, several rows per program",
        (BLOCK_M_ROWS, rw.BLOCK_N_TILE, rw.NUM_WARPS, rw.NUM_STAGES, rw.EVICTION, EPILOGUE),
        render_multi_row,
        rw.tile_constraint,
    ),
    rw.family(
        TASK,
        "split_row_atomic",
        "rows split over SPLIT programs, partial sums via atomics",
        (SPLIT, rw.BLOCK_N_TILE, rw.NUM_WARPS, rw.NUM_STAGES, EPILOGUE),
        render_split,
        rw.looped_constraint,
    ),
    rw.family(
        TASK,
        "unfused_multi_kernel",
        "rstd, scale, weight as three kernels through an (M, N) temporary",
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
        "grid_capped_two_pass",
        "looped two-pass RMSNorm on a capped grid of PROGRAMS programs (under-occupancy)",
        (rw.PROGRAMS, rw.BLOCK_N_CAPPED, rw.NUM_WARPS_CAPPED, rw.NUM_STAGES),
        render_grid_capped,
        rw.looped_constraint,
    ),
)

SEED: tuple[str, dict] = (
    "two_pass_looped",
    {
        "BLOCK_N": 1024,
        "NUM_WARPS": 4,
        "NUM_STAGES": 2,
        "eviction": "none",
        "epilogue": "fp32_weight",
    },
)
