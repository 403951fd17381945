"""Kernel families of the softmax task: y = softmax(x.float(), -1).to(bf16), x (M, N) bf16.

From fastest to slowest in intent (the reference moves ~20 B/elt, a fused kernel 4 B/elt):
    row_in_registers             one read, one write; whole row in registers (tutorial 02)
    persistent_row_in_registers  same body, a fixed grid of programs striding over rows
    online_two_pass              looped: online max/sum in one read, a second read to write
    three_pass                   looped: max, sum, write -- three reads of x
    unfused_multi_kernel         four kernels through an (M, N) temporary of exp(x - max)
    torch_partial                half in Triton, half in PyTorch with fp32 copies
Tiny BLOCK_N values (16, 32) with many warps make the looped families honest severe slowdowns.
"""

from __future__ import annotations

import textwrap

from pipelines.generation.families import _rowwise as rw
from pipelines.generation.space import Family, Knob, KnobValues

TASK = "softmax"

KNOB_DOCS = {
    "BLOCK_N": "columns per block",
    "BLOCK_M": "rows per 2-D tile",
    "NUM_WARPS": "warps per program",
    "NUM_STAGES": "software-pipelining depth of loops",
    "ROWS_PER_PROGRAM": "rows per program, one after another",
    "GRID_SIZE": "programs of the persistent grid (capped at M)",
}

EXP_IMPL = Knob("exp_impl", ("exp", "exp2"), "tl.exp, or tl.exp2 of log2(e)-prescaled inputs")
ROW_GUARD = Knob(
    "row_guard", ("branch", "clamp"), "rows past M: skipped by an if, or clamped to M-1"
)
ONLINE_STATE = Knob("online_state", ("vector", "scalar"), "online max/sum kept per lane or per row")
TMP_DTYPE = Knob("tmp_dtype", ("float32", "bfloat16"), "dtype of the exp(x - max) temporary")
FALLBACK = Knob("fallback", ("normalise_in_torch", "stats_in_torch"), "which half runs in PyTorch")

LOG2E = "1.4426950408889634"

PROLOGUE = """\
def custom_kernel(data):
    (x,) = data
    assert x.ndim == 2 and x.dtype == torch.bfloat16, "softmax expects x: (M, N) bf16"
    if x.stride(1) != 1:
        x = x.contiguous()  # the kernels step through columns with unit stride
    M, N = x.shape
    y = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)"""

SIGNATURE_ROW = """\
    # pointers
    x_ptr, y_ptr,
    # sizes
    M, N,
    # strides (elements)
    stride_xm, stride_ym,"""


def _exp(values: KnobValues, arg: str) -> str:
    """exp of `arg` (an fp32 expression) in the variant's flavour."""
    if values.get("exp_impl") == "exp2":
        return f"tl.exp2(({arg}) * {LOG2E})"
    return f"tl.exp({arg})"


def _row_body(values: KnobValues, indent: str) -> str:
    """Load one whole row (row index `row`), normalise in fp32, store; BLOCK_N >= N."""
    body = f"""\
# -- load the row once (2 B/elt); padding is -inf so it vanishes from max and exp
x = tl.load(x_ptr + row * stride_xm + cols, mask=col_mask, other=float("-inf"){rw.evict(values)})
x = x.to(tl.float32)
# -- max-shifted exponentials and their sum, fp32 in registers
num = {_exp(values, "x - tl.max(x, axis=0)")}
den = tl.sum(num, axis=0)
# -- masked write-back (2 B/elt)
tl.store(y_ptr + row * stride_ym + cols, (num / den).to(tl.bfloat16), mask=col_mask)"""
    return textwrap.indent(body, indent)


# -----------------------------------------------------------------------------
# row_in_registers
# -----------------------------------------------------------------------------
def render_row_in_registers(v: KnobValues) -> str:
    if v["row_guard"] == "branch":
        rows = f"""\
    for r in tl.range(0, ROWS_PER_PROGRAM, num_stages=NUM_STAGES):
        row = pid * ROWS_PER_PROGRAM + r
        if row < M:
{_row_body(v, " " * 12)}"""
        guard = "rows past M are skipped by a branch"
    else:
        rows = f"""\
    for r in tl.range(0, ROWS_PER_PROGRAM, num_stages=NUM_STAGES):
        # rows past M are clamped to M - 1: a duplicate, identical write instead of a branch
        row = tl.minimum(pid * ROWS_PER_PROGRAM + r, M - 1)
{_row_body(v, " " * 8)}"""
        guard = "rows past M are clamped to the last row (duplicate identical writes, no branch)"
    kernels = f"""\
@triton.jit
def softmax_kernel(
{SIGNATURE_ROW}
    # meta-parameters
    BLOCK_N: tl.constexpr,  # next_pow2(N): one block holds a whole row
    ROWS_PER_PROGRAM: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    # -- map program to ROWS_PER_PROGRAM consecutive rows
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
{rows}
"""
    launcher = f"""\
{PROLOGUE}
    BLOCK_N = triton.next_power_of_2(N)
    grid = (triton.cdiv(M, ROWS_PER_PROGRAM),)
    softmax_kernel[grid](
        x, y, M, N, x.stride(0), y.stride(0),
        BLOCK_N=BLOCK_N, ROWS_PER_PROGRAM=ROWS_PER_PROGRAM, NUM_STAGES=NUM_STAGES,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return y
"""
    return rw.module(
        task=TASK,
        algorithm="row_in_registers",
        summary="fused single pass, the whole row held in registers",
        details=f"""Fused softmax as in Triton tutorial 02: each program loads whole rows
        (BLOCK_N = next_pow2(N)) into registers, takes max, exponentials and sum in fp32 and
        writes the row once. Each program handles ROWS_PER_PROGRAM rows in a loop; {guard}.
        exp_impl={v["exp_impl"]}.""",
        traffic="2 B read + 2 B written per element, one kernel.",
        values=v,
        knob_docs=KNOB_DOCS,
        kernels=kernels,
        launcher=launcher,
    )


# -----------------------------------------------------------------------------
# persistent_row_in_registers
# -----------------------------------------------------------------------------
def render_persistent(v: KnobValues) -> str:
    kernels = f"""\
@triton.jit
def softmax_kernel(
{SIGNATURE_ROW}
    # meta-parameters
    BLOCK_N: tl.constexpr,  # next_pow2(N): one block holds a whole row
    NUM_STAGES: tl.constexpr,
):
    # -- persistent schedule: program p handles rows p, p + P, p + 2P, ...
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    for row in tl.range(pid, M, nprog, num_stages=NUM_STAGES):
{_row_body(v, " " * 8)}
"""
    launcher = f"""\
{PROLOGUE}
    BLOCK_N = triton.next_power_of_2(N)
    grid = (min(GRID_SIZE, M),)
    softmax_kernel[grid](
        x, y, M, N, x.stride(0), y.stride(0),
        BLOCK_N=BLOCK_N, NUM_STAGES=NUM_STAGES,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return y
"""
    return rw.module(
        task=TASK,
        algorithm="persistent_row_in_registers",
        summary="fused single pass over a fixed, persistent grid of programs",
        details=f"""The newer tutorial-02 schedule: GRID_SIZE programs (capped at M) stride over
        the rows, each row loaded whole into registers (BLOCK_N = next_pow2(N)), normalised in
        fp32 and written once; the row loop is software-pipelined NUM_STAGES deep. A grid much
        smaller than the SM count leaves the GPU idle; a large one costs scheduling.
        exp_impl={v["exp_impl"]}.""",
        traffic="2 B read + 2 B written per element, one kernel.",
        values=v,
        knob_docs=KNOB_DOCS,
        kernels=kernels,
        launcher=launcher,
    )


# -----------------------------------------------------------------------------
# online_two_pass
# -----------------------------------------------------------------------------
def render_online(v: KnobValues) -> str:
    ev = rw.evict(v)
    if v["online_state"] == "vector":
        stats = f"""\
    # -- pass 1 (one read of x): per-lane running max m_i and sum d_i rescaled to it
    m_i = tl.full([BLOCK_N], float("-inf"), tl.float32)
    d_i = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < N, other=float("-inf"){ev}).to(tl.float32)
        m_new = tl.maximum(m_i, x)
        # lanes that saw only padding keep m = -inf: shift them by 0 so no inf - inf appears
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        d_i = d_i * tl.exp(m_i - m_safe) + tl.exp(x - m_safe)
        m_i = m_new
    # -- combine the lanes once, at the end
    m = tl.max(m_i, axis=0)
    den = tl.sum(d_i * tl.exp(m_i - m), axis=0)"""
        what = "per-lane (vector) online state, combined across lanes once after the loop"
    else:
        stats = f"""\
    # -- pass 1 (one read of x): scalar running max m and sum den, rescaled at every block;
    #    the first block is peeled so m starts finite
    x = tl.load(x_row + cols, mask=cols < N, other=float("-inf"){ev}).to(tl.float32)
    m = tl.max(x, axis=0)
    den = tl.sum(tl.exp(x - m), axis=0)
    for start in range(BLOCK_N, N, BLOCK_N):
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < N, other=float("-inf"){ev}).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        den = den * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new"""
        what = "a scalar online state, reduced across the block at every step (two reductions per block)"
    kernels = f"""\
@triton.jit
def softmax_kernel(
{SIGNATURE_ROW}
    # meta-parameters
    BLOCK_N: tl.constexpr,  # columns per loop step
):
    # -- map program to row
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_xm
    y_row = y_ptr + row * stride_ym
    cols = tl.arange(0, BLOCK_N)
{stats}
    # -- pass 2 (second read of x): normalise and write bf16
    inv_den = 1.0 / den
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        mask = offs < N
        x = tl.load(x_row + offs, mask=mask, other=0.0{ev}).to(tl.float32)
        tl.store(y_row + offs, (tl.exp(x - m) * inv_den).to(tl.bfloat16), mask=mask)
"""
    launcher = f"""\
{PROLOGUE}
    softmax_kernel[(M,)](
        x, y, M, N, x.stride(0), y.stride(0),
        BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return y
"""
    return rw.module(
        task=TASK,
        algorithm="online_two_pass",
        summary="looped online softmax: max and sum in one read, normalise in a second",
        details=f"""One program per row loops over the columns BLOCK_N at a time, so any N
        works with a fixed register budget. Pass 1 keeps an online (running, rescaled) max and
        sum -- {what}; pass 2 reads x again (from L2 when the row fits) and writes
        exp(x - max) / sum.""",
        traffic="2 x 2 B read + 2 B written per element (the second read often hits L2).",
        values=v,
        knob_docs=KNOB_DOCS,
        kernels=kernels,
        launcher=launcher,
    )


# -----------------------------------------------------------------------------
# three_pass
# -----------------------------------------------------------------------------
def render_three_pass(v: KnobValues) -> str:
    ev = rw.evict(v)
    if v["exp_impl"] == "exp2":
        shift = f"""\
    # exp(x - m) = exp2(x * log2(e) - m * log2(e)): one FMA feeds exp2
    m_log2 = m * {LOG2E}"""
        ex = f"tl.exp2(x * {LOG2E} - m_log2)"
    else:
        shift = ""
        ex = "tl.exp(x - m)"
    kernels = f"""\
@triton.jit
def softmax_kernel(
{SIGNATURE_ROW}
    # meta-parameters
    BLOCK_N: tl.constexpr,  # columns per loop step
):
    # -- map program to row
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_xm
    y_row = y_ptr + row * stride_ym
    cols = tl.arange(0, BLOCK_N)
    # -- pass 1: row max
    m_i = tl.full([BLOCK_N], float("-inf"), tl.float32)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < N, other=float("-inf"){ev}).to(tl.float32)
        m_i = tl.maximum(m_i, x)
    m = tl.max(m_i, axis=0)
{shift}
    # -- pass 2: sum of exp(x - m), padding contributes exp(-inf) = 0
    d_i = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < N, other=float("-inf"){ev}).to(tl.float32)
        d_i += {ex}
    inv_den = 1.0 / tl.sum(d_i, axis=0)
    # -- pass 3: normalise and write bf16
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        mask = offs < N
        x = tl.load(x_row + offs, mask=mask, other=0.0{ev}).to(tl.float32)
        tl.store(y_row + offs, ({ex} * inv_den).to(tl.bfloat16), mask=mask)
"""
    launcher = f"""\
{PROLOGUE}
    softmax_kernel[(M,)](
        x, y, M, N, x.stride(0), y.stride(0),
        BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return y
"""
    return rw.module(
        task=TASK,
        algorithm="three_pass",
        summary="looped three-pass softmax: max, then sum, then normalise",
        details=f"""One program per row loops over the columns BLOCK_N at a time, three
        times: the row max, the sum of exponentials, then the normalised write. Simple and
        exact, but x is read three times and every pass ends in a block reduction.
        exp_impl={v["exp_impl"]}.""",
        traffic="3 x 2 B read + 2 B written per element (re-reads hit L2 only for short rows).",
        values=v,
        knob_docs=KNOB_DOCS,
        kernels=kernels,
        launcher=launcher,
    )


# -----------------------------------------------------------------------------
# unfused_multi_kernel
# -----------------------------------------------------------------------------
def render_unfused(v: KnobValues) -> str:
    kernels = """\
@triton.jit
def row_max_kernel(
    # pointers
    x_ptr, max_ptr,
    # sizes
    N,
    # strides (elements)
    stride_xm,
    # meta-parameters
    BLOCK_N: tl.constexpr,
):
    # -- one program per row: looped max, written to an fp32 (M,) temporary
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_N], float("-inf"), tl.float32)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < N, other=float("-inf"))
        m_i = tl.maximum(m_i, x.to(tl.float32))
    tl.store(max_ptr + row, tl.max(m_i, axis=0))


@triton.jit
def exp_kernel(
    # pointers
    x_ptr, max_ptr, e_ptr,
    # sizes
    M, N,
    # strides (elements)
    stride_xm, stride_em,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # -- 2-D tiles: e = exp(x - max[row]) into the (M, N) temporary
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0)
    m = tl.load(max_ptr + rows, mask=rows < M, other=0.0)
    e = tl.exp(x.to(tl.float32) - m[:, None])
    tl.store(e_ptr + rows[:, None] * stride_em + cols[None, :], e.to(e_ptr.dtype.element_ty), mask=mask)


@triton.jit
def row_sum_kernel(
    # pointers
    e_ptr, sum_ptr,
    # sizes
    N,
    # strides (elements)
    stride_em,
    # meta-parameters
    BLOCK_N: tl.constexpr,
):
    # -- one program per row: looped sum of the temporary, fp32
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        acc += tl.load(e_ptr + row * stride_em + offs, mask=offs < N, other=0.0).to(tl.float32)
    tl.store(sum_ptr + row, tl.sum(acc, axis=0))


@triton.jit
def normalise_kernel(
    # pointers
    e_ptr, sum_ptr, y_ptr,
    # sizes
    M, N,
    # strides (elements)
    stride_em, stride_ym,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # -- 2-D tiles: y = e / sum[row], bf16
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    e = tl.load(e_ptr + rows[:, None] * stride_em + cols[None, :], mask=mask, other=0.0)
    s = tl.load(sum_ptr + rows, mask=rows < M, other=1.0)
    y = e.to(tl.float32) / s[:, None]
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(tl.bfloat16), mask=mask)
"""
    launcher = f"""\
{PROLOGUE}
    # fp32 per-row temporaries and the (M, N) temporary of exp(x - max)
    row_max = torch.empty((M,), dtype=torch.float32, device=x.device)
    row_sum = torch.empty((M,), dtype=torch.float32, device=x.device)
    e = torch.empty((M, N), dtype=torch.{v["tmp_dtype"]}, device=x.device)
    tiles = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    launch = dict(num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    row_max_kernel[(M,)](x, row_max, N, x.stride(0), BLOCK_N=BLOCK_N, **launch)
    exp_kernel[tiles](x, row_max, e, M, N, x.stride(0), e.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **launch)
    row_sum_kernel[(M,)](e, row_sum, N, e.stride(0), BLOCK_N=BLOCK_N, **launch)
    normalise_kernel[tiles](e, row_sum, y, M, N, e.stride(0), y.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **launch)
    return y
"""
    nbytes = 4 if v["tmp_dtype"] == "float32" else 2
    return rw.module(
        task=TASK,
        algorithm="unfused_multi_kernel",
        summary="four kernels (max, exp, sum, divide) through an (M, N) temporary",
        details=f"""The textbook decomposition without fusion: a looped row-max kernel, a
        2-D tiled kernel writing exp(x - max) to an (M, N) {v["tmp_dtype"]} temporary, a
        looped row-sum kernel over that temporary, and a 2-D tiled divide. Four launches and
        an extra round trip through HBM.""",
        traffic=f"x read twice (2 + 2 B), temporary written once and read twice ({nbytes} + 2 x {nbytes} B), y written (2 B) per element.",
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
def softmax_stats_kernel(
    # pointers
    x_ptr, max_ptr, sum_ptr,
    # sizes
    N,
    # strides (elements)
    stride_xm,
    # meta-parameters
    BLOCK_N: tl.constexpr,  # columns per loop step
):
    # -- one program per row: online max and rescaled sum, one read of x
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_N], float("-inf"), tl.float32)
    d_i = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < N, other=float("-inf"){ev}).to(tl.float32)
        m_new = tl.maximum(m_i, x)
        # lanes that saw only padding keep m = -inf: shift them by 0 so no inf - inf appears
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        d_i = d_i * tl.exp(m_i - m_safe) + tl.exp(x - m_safe)
        m_i = m_new
    m = tl.max(m_i, axis=0)
    tl.store(max_ptr + row, m)
    tl.store(sum_ptr + row, tl.sum(d_i * tl.exp(m_i - m), axis=0))
"""
        body = """\
    row_max = torch.empty((M,), dtype=torch.float32, device=x.device)
    row_sum = torch.empty((M,), dtype=torch.float32, device=x.device)
    softmax_stats_kernel[(M,)](
        x, row_max, row_sum, N, x.stride(0),
        BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    # -- PyTorch fallback for the elementwise half: fp32 copies of x, exp and divide
    y.copy_(torch.exp(x.float() - row_max[:, None]) / row_sum[:, None])
    return y
"""
        details = """Row statistics (online max and rescaled sum) in a looped Triton kernel;
        the normalisation exp(x - max) / sum is left to PyTorch, which materialises fp32 copies
        of x and of every intermediate."""
        traffic = "Triton reads 2 B; PyTorch then moves ~34 B per element (upcast, subtract, exp, divide, downcast)."
    else:
        kernels = f"""\
@triton.jit
def softmax_normalise_kernel(
    # pointers
    x_ptr, max_ptr, sum_ptr, y_ptr,
    # sizes
    N,
    # strides (elements)
    stride_xm, stride_ym,
    # meta-parameters
    BLOCK_N: tl.constexpr,  # columns per loop step
):
    # -- one program per row: y = exp(x - max) / sum with statistics from PyTorch
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    m = tl.load(max_ptr + row)
    inv_den = 1.0 / tl.load(sum_ptr + row)
    for start in range(0, N, BLOCK_N):
        offs = start + cols
        mask = offs < N
        x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0{ev}).to(tl.float32)
        tl.store(y_ptr + row * stride_ym + offs, (tl.exp(x - m) * inv_den).to(tl.bfloat16), mask=mask)
"""
        body = """\
    # -- PyTorch fallback for the statistics: an fp32 copy of x, its max, exp and sum
    xf = x.float()
    row_max = xf.amax(dim=-1)
    row_sum = torch.exp(xf - row_max[:, None]).sum(dim=-1)
    softmax_normalise_kernel[(M,)](
        x, row_max, row_sum, y, N, x.stride(0), y.stride(0),
        BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return y
"""
        details = """Row statistics in PyTorch (an fp32 copy of x, amax, exp of the shifted
        copy, sum); only the final normalise-and-write is a looped Triton kernel."""
        traffic = (
            "PyTorch moves ~26 B per element for the statistics; Triton reads 2 B and writes 2 B."
        )
    launcher = f"{PROLOGUE}\n{body}"
    return rw.module(
        task=TASK,
        algorithm="torch_partial",
        summary="half Triton, half PyTorch fallback with fp32 copies",
        details=details + f" fallback={v['fallback']}.",
        traffic=traffic,
        values=v,
        knob_docs=KNOB_DOCS,
        kernels=kernels,
        launcher=launcher,
    )


# -----------------------------------------------------------------------------
# grid_capped_online
# -----------------------------------------------------------------------------
def render_grid_capped(v: KnobValues) -> str:
    body = """\
x_row = x_ptr + row * stride_xm
y_row = y_ptr + row * stride_ym
# -- pass 1 (one read of the row): per-lane running max m_i and sum d_i rescaled to it
m_i = tl.full([BLOCK_N], float("-inf"), tl.float32)
d_i = tl.zeros([BLOCK_N], dtype=tl.float32)
for start in tl.range(0, N, BLOCK_N, num_stages=NUM_STAGES):
    offs = start + cols
    x = tl.load(x_row + offs, mask=offs < N, other=float("-inf")).to(tl.float32)
    m_new = tl.maximum(m_i, x)
    # lanes that saw only padding keep m = -inf: shift them by 0 so no inf - inf appears
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    d_i = d_i * tl.exp(m_i - m_safe) + tl.exp(x - m_safe)
    m_i = m_new
m = tl.max(m_i, axis=0)
inv_den = 1.0 / tl.sum(d_i * tl.exp(m_i - m), axis=0)
# -- pass 2 (second read of the row): normalise and write bf16
for start in tl.range(0, N, BLOCK_N, num_stages=NUM_STAGES):
    offs = start + cols
    mask = offs < N
    x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_row + offs, (tl.exp(x - m) * inv_den).to(tl.bfloat16), mask=mask)
"""
    kernels = f"""\
@triton.jit
def softmax_kernel(
{SIGNATURE_ROW}
    # meta-parameters
    BLOCK_N: tl.constexpr,  # columns per loop step
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the column loops
):
    cols = tl.arange(0, BLOCK_N)
{rw.capped_rows_loop(body)}"""
    launcher = f"""\
{PROLOGUE}
    grid = (min(PROGRAMS, M),)  # deliberately few programs: each walks M / PROGRAMS rows
    softmax_kernel[grid](
        x, y, M, N, x.stride(0), y.stride(0),
        BLOCK_N=BLOCK_N, NUM_STAGES=NUM_STAGES,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return y
"""
    return rw.module(
        task=TASK,
        algorithm="grid_capped_online",
        summary="looped online softmax on a capped grid of PROGRAMS programs",
        details=rw.CAPPED_DETAILS
        + """ Per row: pass 1 keeps per-lane online max and sum in one read, pass 2 reads the
        row again and writes exp(x - max) / sum.""",
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
        (rw.ROWS_PER_PROGRAM, rw.NUM_WARPS_ROW, rw.NUM_STAGES, rw.EVICTION, EXP_IMPL, ROW_GUARD),
        render_row_in_registers,
    ),
    rw.family(
        TASK,
        "persistent_row_in_registers",
        "fused single pass over a persistent grid striding rows",
        (rw.GRID_SIZE, rw.NUM_WARPS_ROW, rw.NUM_STAGES, rw.EVICTION, EXP_IMPL),
        render_persistent,
    ),
    rw.family(
        TASK,
        "online_two_pass",
        "looped online max/sum in one read, normalise in a second read",
        (rw.BLOCK_N_LOOP, rw.NUM_WARPS, rw.NUM_STAGES, rw.EVICTION, ONLINE_STATE),
        render_online,
        rw.looped_constraint,
    ),
    rw.family(
        TASK,
        "three_pass",
        "looped max, sum and normalise passes, three reads of x",
        (rw.BLOCK_N_LOOP, rw.NUM_WARPS, rw.NUM_STAGES, rw.EVICTION, EXP_IMPL),
        render_three_pass,
        rw.looped_constraint,
    ),
    rw.family(
        TASK,
        "unfused_multi_kernel",
        "max, exp, sum, divide as four kernels through an (M, N) temporary",
        (rw.BLOCK_M_TILE, rw.BLOCK_N_TILE, rw.NUM_WARPS, rw.NUM_STAGES, TMP_DTYPE),
        render_unfused,
        rw.tile_constraint,
    ),
    rw.family(
        TASK,
        "torch_partial",
        "statistics or normalisation left to PyTorch with fp32 copies",
        (FALLBACK, rw.BLOCK_N_TILE, rw.NUM_WARPS, rw.NUM_STAGES, rw.EVICTION),
        render_torch_partial,
        rw.looped_constraint,
    ),
    rw.family(
        TASK,
        "grid_capped_online",
        "looped online softmax on a capped grid of PROGRAMS programs (under-occupancy)",
        (rw.PROGRAMS, rw.BLOCK_N_CAPPED, rw.NUM_WARPS_CAPPED, rw.NUM_STAGES),
        render_grid_capped,
        rw.looped_constraint,
    ),
)

SEED: tuple[str, dict] = (
    "online_two_pass",
    {
        "BLOCK_N": 1024,
        "NUM_WARPS": 4,
        "NUM_STAGES": 2,
        "eviction": "none",
        "online_state": "vector",
    },
)
