"""Kernel families for `cross_entropy`: fused softmax cross entropy, forward loss + backward grad.

data = (logits (B, V) bf16, targets (B,) int64) -> (loss (B,) fp32, grad (B, V) bf16).

The families span the speedup range against the unfused PyTorch reference (~28 B moved per
logit):

    three_pass_fp32_temps   naive: fp32 upcast copy, per-row stats, elementwise grad (~22 B/logit,
                            one program per row, tiny blocks make it latency-bound)
    atomic_split            2D grid, per-block partial max / sum-exp combined by atomics, three
                            launches each re-reading the logits (6-8 B/logit + atomics)
    row_three_loop          one program per row: max loop, sum-exp loop, write loop (6 B read)
    row_online              one program per row: online max + sum-exp in one read, then the
                            grad write loop (4 B read + 2 B written: the fused optimum)
    split_row               split-K over the vocabulary: partial (max, sum) per chunk, then a
                            combine-and-write kernel; more programs per row for small B
    multi_row_tile          2D tiles of BLOCK_B rows x BLOCK_V columns, online over V
    torch_partial           half Triton, half PyTorch (the lse or the grad in PyTorch)

Every render(values) gives a standalone module (torch, triton, triton.language only) that defines
custom_kernel(data), with the family, algorithm and knob values in its docstring.
"""

from __future__ import annotations

from pipelines.generation.families._rowwise import PROGRAMS as rw_PROGRAMS
from pipelines.generation.space import Family, Knob, KnobValues

TASK = "cross_entropy"
LOG2E = 1.4426950408889634

# Register budget: fp32 values per thread held live by one BLOCK_V-wide vector.
_MAX_ELEMS_PER_THREAD = 64


def _per_thread(block: int, num_warps: int) -> float:
    return block / (32 * num_warps)


# ---------------------------------------------------------------------------------------------
# Source fragments shared by the families
# ---------------------------------------------------------------------------------------------

def _header(algorithm: str, summary: str, details: str, values: KnobValues) -> str:
    knob_lines = "\n".join(f"    {k} = {values[k]!r}" for k in values)
    return (
        f'"""cross_entropy kernel, family `{algorithm}`: {summary}\n\n'
        "Task: per-row loss (B,) fp32 = logsumexp(logits) - logits[target] and grad (B, V) bf16 =\n"
        "softmax(logits) - onehot(target), from logits (B, V) bf16 and targets (B,) int64.\n\n"
        f"{details.strip()}\n\n"
        f"Knobs:\n{knob_lines}\n"
        '"""\n\n'
        "import torch\n"
        "import triton\n"
        "import triton.language as tl\n"
    )


def _exp(arg: str, exp_fn: str) -> str:
    """exp(arg) in the chosen flavour: tl.exp, or tl.exp2 of a log2(e)-scaled argument."""
    if exp_fn == "exp2":
        return f"tl.exp2(({arg}) * {LOG2E})"
    return f"tl.exp({arg})"


def _onehot(p: str, offs: str, onehot: str) -> str:
    """grad = p - onehot(target), as a select or as a subtraction of the 0/1 mask."""
    if onehot == "subtract":
        return f"{p} - ({offs} == t).to(tl.float32)"
    return f"tl.where({offs} == t, {p} - 1.0, {p})"


_LAUNCH_PROLOGUE = '''\
    logits, targets = data
    assert logits.ndim == 2 and logits.dtype == torch.bfloat16, "logits must be (B, V) bf16"
    assert targets.shape == (logits.shape[0],), "targets must be (B,)"
    if logits.stride(1) != 1:
        logits = logits.contiguous()  # the kernels assume unit stride along V
    targets = targets.contiguous()
    B, V = logits.shape
    loss = torch.empty((B,), device=logits.device, dtype=torch.float32)
    grad = torch.empty((B, V), device=logits.device, dtype=torch.bfloat16)
'''


def _ruler(title: str, indent: str = "    ") -> str:
    return f"{indent}# -- {title} " + "-" * max(4, 88 - len(indent) - len(title) - 6) + "\n"


# ---------------------------------------------------------------------------------------------
# Family: three_pass_fp32_temps (naive, unfused)
# ---------------------------------------------------------------------------------------------

def _render_three_pass(v: KnobValues) -> str:
    e = v["exp_fn"]
    doc = f"""
Algorithm: three separate kernels with an fp32 temporary, like an unfused framework:
  1. upcast: x32 (B, V) fp32 = logits, flat elementwise, BLOCK_E elements per program;
  2. row stats: one program per row walks x32 twice in BLOCK_V chunks (max, then sum of exp),
     writes lse (B,) and the loss;
  3. grad: a (B, cdiv(V, BLOCK_E)) grid recomputes exp(x32 - lse) and subtracts the one-hot.
Memory traffic per logit: 2 + 4 (upcast) + 8 (two stat passes) + 4 + 2 (grad) = 20 B, plus
an fp32 temporary of B*V*4 bytes. Small BLOCK_V makes the per-row loops latency-bound.
Exponential: {e}."""
    return (
        _header("three_pass_fp32_temps", "unfused three-kernel pipeline through an fp32 copy", doc, v)
        + f'''

# =============================================================================================
# Compute kernels
# =============================================================================================

@triton.jit
def upcast_kernel(
    # pointers
    src_ptr, dst_ptr,
    # sizes
    n_elements,
    # meta-parameters
    BLOCK_E: tl.constexpr,
):
{_ruler("map program to a flat block of elements")}    offs = tl.program_id(0).to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E)
    mask = offs < n_elements
{_ruler("bf16 -> fp32 copy: 2 B read, 4 B written per element")}    x = tl.load(src_ptr + offs, mask=mask, other=0.0)
    tl.store(dst_ptr + offs, x.to(tl.float32), mask=mask)


@triton.jit
def row_stats_kernel(
    # pointers
    x32_ptr, targets_ptr, lse_ptr, loss_ptr,
    # sizes
    V,
    # strides (elements)
    stride_xb,
    # meta-parameters
    BLOCK_V: tl.constexpr,
):
{_ruler("map program to one row")}    row = tl.program_id(0).to(tl.int64)
    row_ptr = x32_ptr + row * stride_xb
    cols = tl.arange(0, BLOCK_V)
{_ruler("pass 1: row max, chunk by chunk")}    m_vec = tl.full([BLOCK_V], -1e30, dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + cols
        x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf"))
        m_vec = tl.maximum(m_vec, x)
    m = tl.max(m_vec, axis=0)
{_ruler("pass 2: sum of exp(x - max), re-reading the fp32 copy")}    s_vec = tl.zeros([BLOCK_V], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + cols
        x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf"))
        s_vec += {_exp("x - m", e)}
    lse = m + tl.log(tl.sum(s_vec, axis=0))
{_ruler("write lse and loss = lse - x[target]")}    t = tl.load(targets_ptr + row)
    x_t = tl.load(row_ptr + t)
    tl.store(lse_ptr + row, lse)
    tl.store(loss_ptr + row, lse - x_t)


@triton.jit
def grad_kernel(
    # pointers
    x32_ptr, targets_ptr, lse_ptr, grad_ptr,
    # sizes
    V,
    # strides (elements)
    stride_xb, stride_gb,
    # meta-parameters
    BLOCK_E: tl.constexpr,
):
{_ruler("map program to (row, block of columns)")}    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    mask = offs < V
{_ruler("grad = exp(x - lse) - onehot(target), fp32 maths, bf16 store")}    t = tl.load(targets_ptr + row)
    lse = tl.load(lse_ptr + row)
    x = tl.load(x32_ptr + row * stride_xb + offs, mask=mask, other=0.0)
    p = {_exp("x - lse", e)}
    g = tl.where(offs == t, p - 1.0, p)
    tl.store(grad_ptr + row * stride_gb + offs, g.to(tl.bfloat16), mask=mask)


# =============================================================================================
# Launcher
# =============================================================================================

def custom_kernel(data):
    """(logits, targets) -> (loss, grad) through three launches and an fp32 temporary."""
{_LAUNCH_PROLOGUE}    BLOCK_V = {v["BLOCK_V"]}  # row-stats chunk (elements)
    BLOCK_E = {v["BLOCK_E"]}  # elementwise block (elements)
    NUM_WARPS = {v["NUM_WARPS"]}
    x32 = torch.empty((B, V), device=logits.device, dtype=torch.float32)
    lse = torch.empty((B,), device=logits.device, dtype=torch.float32)
    upcast_kernel[(triton.cdiv(B * V, BLOCK_E),)](
        logits, x32, B * V, BLOCK_E=BLOCK_E, num_warps=NUM_WARPS
    )
    row_stats_kernel[(B,)](
        x32, targets, lse, loss, V, x32.stride(0), BLOCK_V=BLOCK_V, num_warps=NUM_WARPS
    )
    grad_kernel[(B, triton.cdiv(V, BLOCK_E))](
        x32, targets, lse, grad, V, x32.stride(0), grad.stride(0), BLOCK_E=BLOCK_E, num_warps=NUM_WARPS
    )
    return loss, grad
'''
    )


# ---------------------------------------------------------------------------------------------
# Family: atomic_split
# ---------------------------------------------------------------------------------------------

def _render_atomic_split(v: KnobValues) -> str:
    e = v["exp_fn"]
    doc = f"""
Algorithm: a (B, cdiv(V, BLOCK_V)) grid, one program per block of one row, in three launches:
  1. block max -> tl.atomic_max into a per-row fp32 max;
  2. block sum of exp(x - max) -> tl.atomic_add into a per-row sum;
  3. grad = exp(x - lse) - onehot(target); the block holding the target writes the loss.
Each launch re-reads the bf16 logits (6 B read + 2 B written per logit) and every block
issues two same-address atomics per row, so small BLOCK_V serialises on the atomics.
Exponential: {e}."""
    return (
        _header("atomic_split", "2D grid with atomically combined row statistics", doc, v)
        + f'''

# =============================================================================================
# Compute kernels
# =============================================================================================

@triton.jit
def block_max_kernel(
    # pointers
    logits_ptr, max_ptr,
    # sizes
    V,
    # strides (elements)
    stride_lb,
    # meta-parameters
    BLOCK_V: tl.constexpr,
):
{_ruler("map program to (row, block of columns)")}    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
{_ruler("block max, folded into the row max with an atomic")}    x = tl.load(logits_ptr + row * stride_lb + offs, mask=offs < V, other=float("-inf"))
    tl.atomic_max(max_ptr + row, tl.max(x.to(tl.float32), axis=0))


@triton.jit
def block_sumexp_kernel(
    # pointers
    logits_ptr, max_ptr, sum_ptr,
    # sizes
    V,
    # strides (elements)
    stride_lb,
    # meta-parameters
    BLOCK_V: tl.constexpr,
):
{_ruler("map program to (row, block of columns)")}    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
{_ruler("block sum of exp(x - row max), added atomically")}    m = tl.load(max_ptr + row)
    x = tl.load(logits_ptr + row * stride_lb + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    tl.atomic_add(sum_ptr + row, tl.sum({_exp("x - m", e)}, axis=0))


@triton.jit
def block_grad_kernel(
    # pointers
    logits_ptr, targets_ptr, max_ptr, sum_ptr, loss_ptr, grad_ptr,
    # sizes
    V,
    # strides (elements)
    stride_lb, stride_gb,
    # meta-parameters
    BLOCK_V: tl.constexpr,
):
{_ruler("map program to (row, block of columns)")}    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * BLOCK_V
    offs = start + tl.arange(0, BLOCK_V)
    mask = offs < V
{_ruler("lse from the combined statistics")}    lse = tl.load(max_ptr + row) + tl.log(tl.load(sum_ptr + row))
    t = tl.load(targets_ptr + row)
{_ruler("grad block, fp32 maths, bf16 store")}    x = tl.load(logits_ptr + row * stride_lb + offs, mask=mask, other=0.0).to(tl.float32)
    p = {_exp("x - lse", e)}
    g = tl.where(offs == t, p - 1.0, p)
    tl.store(grad_ptr + row * stride_gb + offs, g.to(tl.bfloat16), mask=mask)
{_ruler("the block that holds the target writes the loss")}    if (t >= start) & (t < start + BLOCK_V):
        x_t = tl.load(logits_ptr + row * stride_lb + t).to(tl.float32)
        tl.store(loss_ptr + row, lse - x_t)


# =============================================================================================
# Launcher
# =============================================================================================

def custom_kernel(data):
    """(logits, targets) -> (loss, grad) with atomics combining per-block statistics."""
{_LAUNCH_PROLOGUE}    BLOCK_V = {v["BLOCK_V"]}  # columns per program
    NUM_WARPS = {v["NUM_WARPS"]}
    row_max = torch.full((B,), -1e30, device=logits.device, dtype=torch.float32)
    row_sum = torch.zeros((B,), device=logits.device, dtype=torch.float32)
    grid = (B, triton.cdiv(V, BLOCK_V))
    block_max_kernel[grid](logits, row_max, V, logits.stride(0), BLOCK_V=BLOCK_V, num_warps=NUM_WARPS)
    block_sumexp_kernel[grid](
        logits, row_max, row_sum, V, logits.stride(0), BLOCK_V=BLOCK_V, num_warps=NUM_WARPS
    )
    block_grad_kernel[grid](
        logits, targets, row_max, row_sum, loss, grad, V, logits.stride(0), grad.stride(0),
        BLOCK_V=BLOCK_V, num_warps=NUM_WARPS,
    )
    return loss, grad
'''
    )


# ---------------------------------------------------------------------------------------------
# Family: row_three_loop
# ---------------------------------------------------------------------------------------------

def _render_row_three_loop(v: KnobValues) -> str:
    e, oh = v["exp_fn"], v["onehot"]
    doc = f"""
Algorithm: one program per row, reading bf16 logits directly, in three loops over BLOCK_V
chunks: the row max, the sum of exp(x - max), then grad = exp(x - lse) - onehot(target).
No temporaries; the row is read three times (6 B read + 2 B written per logit), the second
and third reads mostly from L2 when a row (V * 2 bytes) fits beside its neighbours.
Exponential: {e}; one-hot: {oh}."""
    return (
        _header("row_three_loop", "one program per row, max / sum-exp / write loops", doc, v)
        + f'''

# =============================================================================================
# Compute kernel
# =============================================================================================

@triton.jit
def ce_three_loop_kernel(
    # pointers
    logits_ptr, targets_ptr, loss_ptr, grad_ptr,
    # sizes
    V,
    # strides (elements)
    stride_lb, stride_gb,
    # meta-parameters
    BLOCK_V: tl.constexpr,
):
{_ruler("map program to one row")}    row = tl.program_id(0).to(tl.int64)
    row_logits = logits_ptr + row * stride_lb
    row_grad = grad_ptr + row * stride_gb
    cols = tl.arange(0, BLOCK_V)
{_ruler("loop 1: per-lane running max, reduced once at the end")}    m_vec = tl.full([BLOCK_V], -1e30, dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + cols
        x = tl.load(row_logits + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        m_vec = tl.maximum(m_vec, x)
    m = tl.max(m_vec, axis=0)
{_ruler("loop 2: sum of exp(x - max)")}    s_vec = tl.zeros([BLOCK_V], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + cols
        x = tl.load(row_logits + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        s_vec += {_exp("x - m", e)}
    lse = m + tl.log(tl.sum(s_vec, axis=0))
{_ruler("loop 3: grad = softmax - onehot, bf16 store")}    t = tl.load(targets_ptr + row)
    for start in range(0, V, BLOCK_V):
        offs = start + cols
        mask = offs < V
        x = tl.load(row_logits + offs, mask=mask, other=0.0).to(tl.float32)
        p = {_exp("x - lse", e)}
        g = {_onehot("p", "offs", oh)}
        tl.store(row_grad + offs, g.to(tl.bfloat16), mask=mask)
{_ruler("loss = lse - x[target]")}    x_t = tl.load(row_logits + t).to(tl.float32)
    tl.store(loss_ptr + row, lse - x_t)


# =============================================================================================
# Launcher
# =============================================================================================

def custom_kernel(data):
    """(logits, targets) -> (loss, grad), one program per row."""
{_LAUNCH_PROLOGUE}    BLOCK_V = {v["BLOCK_V"]}  # chunk of a row per loop iteration (elements)
    NUM_WARPS = {v["NUM_WARPS"]}
    NUM_STAGES = {v["NUM_STAGES"]}  # software-pipelining depth of the chunk loops
    ce_three_loop_kernel[(B,)](
        logits, targets, loss, grad, V, logits.stride(0), grad.stride(0),
        BLOCK_V=BLOCK_V, num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return loss, grad
'''
    )


# ---------------------------------------------------------------------------------------------
# Family: row_online (the fused optimum)
# ---------------------------------------------------------------------------------------------

def _render_row_online(v: KnobValues) -> str:
    e, oh, state, hint = v["exp_fn"], v["onehot"], v["online_state"], v["cache_hint"]
    keep = ', eviction_policy="evict_last"' if hint == "l2_keep" else ""
    stream = ', eviction_policy="evict_first"' if hint == "l2_keep" else ""
    if state == "lane":
        pass1 = f'''{_ruler("loop 1: online softmax statistics, one (max, sum) pair per lane")}    m_vec = tl.full([BLOCK_V], -1e30, dtype=tl.float32)
    s_vec = tl.zeros([BLOCK_V], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + cols
        x = tl.load(row_logits + offs, mask=offs < V, other=float("-inf"){keep}).to(tl.float32)
        m_new = tl.maximum(m_vec, x)
        # rescale the lane's running sum to the new max, then add this element
        s_vec = s_vec * {_exp("m_vec - m_new", e)} + {_exp("x - m_new", e)}
        m_vec = m_new
{_ruler("combine the lanes: lse = M + log(sum_l s_l * exp(m_l - M))")}    m = tl.max(m_vec, axis=0)
    lse = m + tl.log(tl.sum(s_vec * {_exp("m_vec - m", e)}, axis=0))
'''
        state_doc = (
            "per-lane running (max, sum) vectors, combined once after the loop\n"
            "(no reductions inside the loop, two exponentials per element)"
        )
    else:
        pass1 = f'''{_ruler("loop 1: online softmax statistics, reduced to scalars per chunk")}    m = tl.max(tl.full([BLOCK_V], -1e30, dtype=tl.float32), axis=0)
    s = tl.sum(tl.zeros([BLOCK_V], dtype=tl.float32), axis=0)
    for start in range(0, V, BLOCK_V):
        offs = start + cols
        x = tl.load(row_logits + offs, mask=offs < V, other=float("-inf"){keep}).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        # rescale the running sum to the new max, then add this chunk
        s = s * {_exp("m - m_new", e)} + tl.sum({_exp("x - m_new", e)}, axis=0)
        m = m_new
    lse = m + tl.log(s)
'''
        state_doc = "scalar running (max, sum), two block reductions per chunk, one exp per element"
    doc = f"""
Algorithm: one program per row, online softmax. Loop 1 reads the row once and keeps the
running max and the running sum of exp rescaled to it; loop 2 re-reads the row and writes grad = exp(x - lse) - onehot(target) in bf16. 4 B read + 2 B written per logit,
no temporaries, one launch.
Online state: {state_doc}.
Cache hints: {"loop 1 keeps the row in L2 (evict_last), loop 2 streams it (evict_first)" if hint == "l2_keep" else "none"}.
Exponential: {e}; one-hot: {oh}."""
    return (
        _header("row_online", "one program per row, online max/sum then one write pass", doc, v)
        + f'''

# =============================================================================================
# Compute kernel
# =============================================================================================

@triton.jit
def ce_online_kernel(
    # pointers
    logits_ptr, targets_ptr, loss_ptr, grad_ptr,
    # sizes
    V,
    # strides (elements)
    stride_lb, stride_gb,
    # meta-parameters
    BLOCK_V: tl.constexpr,
):
{_ruler("map program to one row")}    row = tl.program_id(0).to(tl.int64)
    row_logits = logits_ptr + row * stride_lb
    row_grad = grad_ptr + row * stride_gb
    cols = tl.arange(0, BLOCK_V)
{pass1}{_ruler("loop 2: grad = softmax - onehot, bf16 store")}    t = tl.load(targets_ptr + row)
    for start in range(0, V, BLOCK_V):
        offs = start + cols
        mask = offs < V
        x = tl.load(row_logits + offs, mask=mask, other=0.0{stream}).to(tl.float32)
        p = {_exp("x - lse", e)}
        g = {_onehot("p", "offs", oh)}
        tl.store(row_grad + offs, g.to(tl.bfloat16), mask=mask{stream})
{_ruler("loss = lse - x[target]")}    x_t = tl.load(row_logits + t).to(tl.float32)
    tl.store(loss_ptr + row, lse - x_t)


# =============================================================================================
# Launcher
# =============================================================================================

def custom_kernel(data):
    """(logits, targets) -> (loss, grad), one program per row, one launch."""
{_LAUNCH_PROLOGUE}    BLOCK_V = {v["BLOCK_V"]}  # chunk of a row per loop iteration (elements)
    NUM_WARPS = {v["NUM_WARPS"]}
    NUM_STAGES = {v["NUM_STAGES"]}  # software-pipelining depth of the chunk loops
    ce_online_kernel[(B,)](
        logits, targets, loss, grad, V, logits.stride(0), grad.stride(0),
        BLOCK_V=BLOCK_V, num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return loss, grad
'''
    )


# ---------------------------------------------------------------------------------------------
# Family: split_row (split-K over the vocabulary)
# ---------------------------------------------------------------------------------------------

def _render_split_row(v: KnobValues) -> str:
    e = v["exp_fn"]
    doc = f"""
Algorithm: split-K over the vocabulary. Each row is cut into SPLITS chunks of
CHUNK = cdiv(cdiv(V, SPLITS), BLOCK_V) * BLOCK_V columns; kernel 1, on a (B, SPLITS) grid,
writes each chunk's online (max, sum of exp) to fp32 partial buffers (B, SPLITS); kernel 2,
on the same grid, combines the SPLITS partials of its row into the lse, writes its chunk of
grad = exp(x - lse) - onehot(target), and the chunk holding the target writes the loss.
4 B read + 2 B written per logit, B * SPLITS programs (more parallelism per row).
Exponential: {e}."""
    return (
        _header("split_row", "split-K: per-chunk partial statistics, then combine and write", doc, v)
        + f'''

# =============================================================================================
# Compute kernels
# =============================================================================================

@triton.jit
def partial_stats_kernel(
    # pointers
    logits_ptr, pmax_ptr, psum_ptr,
    # sizes
    V, CHUNK,
    # strides (elements)
    stride_lb,
    # meta-parameters
    SPLITS: tl.constexpr, BLOCK_V: tl.constexpr,
):
{_ruler("map program to (row, chunk)")}    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    lo = split * CHUNK
    row_logits = logits_ptr + row * stride_lb
    cols = tl.arange(0, BLOCK_V)
{_ruler("online (max, sum of exp) over the chunk, per lane")}    m_vec = tl.full([BLOCK_V], -1e30, dtype=tl.float32)
    s_vec = tl.zeros([BLOCK_V], dtype=tl.float32)
    for start in range(0, CHUNK, BLOCK_V):
        offs = lo + start + cols
        x = tl.load(row_logits + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m_vec, x)
        s_vec = s_vec * {_exp("m_vec - m_new", e)} + {_exp("x - m_new", e)}
        m_vec = m_new
    m = tl.max(m_vec, axis=0)
    s = tl.sum(s_vec * {_exp("m_vec - m", e)}, axis=0)
{_ruler("write this chunk's partials")}    tl.store(pmax_ptr + row * SPLITS + split, m)
    tl.store(psum_ptr + row * SPLITS + split, s)


@triton.jit
def combine_write_kernel(
    # pointers
    logits_ptr, targets_ptr, pmax_ptr, psum_ptr, loss_ptr, grad_ptr,
    # sizes
    V, CHUNK,
    # strides (elements)
    stride_lb, stride_gb,
    # meta-parameters
    SPLITS: tl.constexpr, BLOCK_V: tl.constexpr,
):
{_ruler("map program to (row, chunk)")}    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    lo = split * CHUNK
    row_logits = logits_ptr + row * stride_lb
    row_grad = grad_ptr + row * stride_gb
    cols = tl.arange(0, BLOCK_V)
{_ruler("combine the row's SPLITS partials into the lse")}    parts = tl.arange(0, SPLITS)
    pm = tl.load(pmax_ptr + row * SPLITS + parts)
    ps = tl.load(psum_ptr + row * SPLITS + parts)
    m = tl.max(pm, axis=0)
    lse = m + tl.log(tl.sum(ps * {_exp("pm - m", e)}, axis=0))
{_ruler("write this chunk of grad = softmax - onehot")}    t = tl.load(targets_ptr + row)
    for start in range(0, CHUNK, BLOCK_V):
        offs = lo + start + cols
        mask = offs < V
        x = tl.load(row_logits + offs, mask=mask, other=0.0).to(tl.float32)
        p = {_exp("x - lse", e)}
        g = tl.where(offs == t, p - 1.0, p)
        tl.store(row_grad + offs, g.to(tl.bfloat16), mask=mask)
{_ruler("the chunk holding the target writes the loss")}    if (t >= lo) & (t < lo + CHUNK):
        x_t = tl.load(row_logits + t).to(tl.float32)
        tl.store(loss_ptr + row, lse - x_t)


# =============================================================================================
# Launcher
# =============================================================================================

def custom_kernel(data):
    """(logits, targets) -> (loss, grad), split-K over V with a combine step."""
{_LAUNCH_PROLOGUE}    SPLITS = {v["SPLITS"]}  # chunks per row (programs per row)
    BLOCK_V = {v["BLOCK_V"]}  # columns per loop iteration
    NUM_WARPS = {v["NUM_WARPS"]}
    NUM_STAGES = {v["NUM_STAGES"]}
    CHUNK = triton.cdiv(triton.cdiv(V, SPLITS), BLOCK_V) * BLOCK_V  # columns per program
    pmax = torch.empty((B, SPLITS), device=logits.device, dtype=torch.float32)
    psum = torch.empty((B, SPLITS), device=logits.device, dtype=torch.float32)
    grid = (B, SPLITS)
    partial_stats_kernel[grid](
        logits, pmax, psum, V, CHUNK, logits.stride(0),
        SPLITS=SPLITS, BLOCK_V=BLOCK_V, num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    combine_write_kernel[grid](
        logits, targets, pmax, psum, loss, grad, V, CHUNK, logits.stride(0), grad.stride(0),
        SPLITS=SPLITS, BLOCK_V=BLOCK_V, num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return loss, grad
'''
    )


# ---------------------------------------------------------------------------------------------
# Family: multi_row_tile
# ---------------------------------------------------------------------------------------------

def _render_multi_row(v: KnobValues) -> str:
    e = v["exp_fn"]
    doc = f"""
Algorithm: each program owns BLOCK_B rows and walks V in (BLOCK_B, BLOCK_V) tiles: loop 1
keeps per-row online (max, sum of exp) with row-wise reductions of each tile, loop 2 writes
grad = exp(x - lse) - onehot(target). 4 B read + 2 B written per logit; B / BLOCK_B programs,
so fewer, fatter programs (each row segment is BLOCK_V * 2 bytes contiguous).
Exponential: {e}."""
    return (
        _header("multi_row_tile", "2D tiles of several rows, online over the vocabulary", doc, v)
        + f'''

# =============================================================================================
# Compute kernel
# =============================================================================================

@triton.jit
def ce_row_tile_kernel(
    # pointers
    logits_ptr, targets_ptr, loss_ptr, grad_ptr,
    # sizes
    B, V,
    # strides (elements)
    stride_lb, stride_gb,
    # meta-parameters
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
):
{_ruler("map program to a block of rows")}    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_V)
    base = logits_ptr + rows64[:, None] * stride_lb  # (BLOCK_B, 1) row starts
{_ruler("loop 1: per-row online (max, sum of exp) over (BLOCK_B, BLOCK_V) tiles")}    m = tl.full([BLOCK_B], -1e30, dtype=tl.float32)
    s = tl.zeros([BLOCK_B], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + cols
        mask = row_ok[:, None] & (offs[None, :] < V)
        x = tl.load(base + offs[None, :], mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=1))
        s = s * {_exp("m - m_new", e)} + tl.sum({_exp("x - m_new[:, None]", e)}, axis=1)
        m = m_new
    lse = m + tl.log(tl.where(row_ok, s, 1.0))  # padded rows: log(1), not log(0)
{_ruler("loop 2: grad tiles = softmax - onehot, bf16 store")}    t = tl.load(targets_ptr + rows, mask=row_ok, other=0)
    for start in range(0, V, BLOCK_V):
        offs = start + cols
        mask = row_ok[:, None] & (offs[None, :] < V)
        x = tl.load(base + offs[None, :], mask=mask, other=0.0).to(tl.float32)
        p = {_exp("x - lse[:, None]", e)}
        g = tl.where(offs[None, :] == t[:, None], p - 1.0, p)
        tl.store(grad_ptr + rows64[:, None] * stride_gb + offs[None, :], g.to(tl.bfloat16), mask=mask)
{_ruler("loss = lse - x[target], one gather per row")}    x_t = tl.load(logits_ptr + rows64 * stride_lb + t, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(loss_ptr + rows, lse - x_t, mask=row_ok)


# =============================================================================================
# Launcher
# =============================================================================================

def custom_kernel(data):
    """(logits, targets) -> (loss, grad), BLOCK_B rows per program."""
{_LAUNCH_PROLOGUE}    BLOCK_B = {v["BLOCK_B"]}  # rows per program
    BLOCK_V = {v["BLOCK_V"]}  # columns per tile
    NUM_WARPS = {v["NUM_WARPS"]}
    NUM_STAGES = {v["NUM_STAGES"]}
    ce_row_tile_kernel[(triton.cdiv(B, BLOCK_B),)](
        logits, targets, loss, grad, B, V, logits.stride(0), grad.stride(0),
        BLOCK_B=BLOCK_B, BLOCK_V=BLOCK_V, num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return loss, grad
'''
    )


# ---------------------------------------------------------------------------------------------
# Family: torch_partial
# ---------------------------------------------------------------------------------------------

def _render_torch_partial(v: KnobValues) -> str:
    e, split = v["exp_fn"], v["split"]
    if split == "lse_triton":
        doc = f"""
Algorithm: partial PyTorch fallback. A Triton kernel (one program per row, online softmax over
BLOCK_V chunks) computes lse (B,) fp32 in one read of the logits; PyTorch then builds the
gradient unfused: exp(logits.float() - lse) (fp32 temporary), an indexed subtract of the
one-hot, a cast to bf16, and the loss by gather. ~2 + 2 + 4 + 4 + 4 + 2 = 18 B per logit.
Exponential in the kernel: {e}."""
        kernel = f'''@triton.jit
def row_lse_kernel(
    # pointers
    logits_ptr, lse_ptr,
    # sizes
    V,
    # strides (elements)
    stride_lb,
    # meta-parameters
    BLOCK_V: tl.constexpr,
):
{_ruler("map program to one row")}    row = tl.program_id(0).to(tl.int64)
    row_logits = logits_ptr + row * stride_lb
    cols = tl.arange(0, BLOCK_V)
{_ruler("online (max, sum of exp) per lane, combined after the loop")}    m_vec = tl.full([BLOCK_V], -1e30, dtype=tl.float32)
    s_vec = tl.zeros([BLOCK_V], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + cols
        x = tl.load(row_logits + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m_vec, x)
        s_vec = s_vec * {_exp("m_vec - m_new", e)} + {_exp("x - m_new", e)}
        m_vec = m_new
    m = tl.max(m_vec, axis=0)
    tl.store(lse_ptr + row, m + tl.log(tl.sum(s_vec * {_exp("m_vec - m", e)}, axis=0)))
'''
        body = f'''    BLOCK_V = {v["BLOCK_V"]}  # chunk of a row per loop iteration
    NUM_WARPS = {v["NUM_WARPS"]}
    lse = torch.empty((B,), device=logits.device, dtype=torch.float32)
    row_lse_kernel[(B,)](logits, lse, V, logits.stride(0), BLOCK_V=BLOCK_V, num_warps=NUM_WARPS)
{_ruler("PyTorch half: unfused gradient and loss from the lse")}    rows = torch.arange(B, device=logits.device)
    probs = torch.exp(logits.float() - lse[:, None])  # (B, V) fp32 temporary
    probs[rows, targets] -= 1.0
    grad.copy_(probs)
    loss.copy_(lse - logits[rows, targets].float())
'''
    else:
        doc = f"""
Algorithm: partial PyTorch fallback. PyTorch computes lse = logsumexp(logits.float()) (an fp32
upcast copy plus its reduction, ~10 B per logit); a Triton kernel on a (B, cdiv(V, BLOCK_V))
grid then writes grad = exp(x - lse) - onehot(target) in bf16 and the loss (4 B per logit).
Exponential in the kernel: {e}."""
        kernel = f'''@triton.jit
def grad_from_lse_kernel(
    # pointers
    logits_ptr, targets_ptr, lse_ptr, loss_ptr, grad_ptr,
    # sizes
    V,
    # strides (elements)
    stride_lb, stride_gb,
    # meta-parameters
    BLOCK_V: tl.constexpr,
):
{_ruler("map program to (row, block of columns)")}    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * BLOCK_V
    offs = start + tl.arange(0, BLOCK_V)
    mask = offs < V
{_ruler("grad = exp(x - lse) - onehot(target)")}    lse = tl.load(lse_ptr + row)
    t = tl.load(targets_ptr + row)
    x = tl.load(logits_ptr + row * stride_lb + offs, mask=mask, other=0.0).to(tl.float32)
    p = {_exp("x - lse", e)}
    g = tl.where(offs == t, p - 1.0, p)
    tl.store(grad_ptr + row * stride_gb + offs, g.to(tl.bfloat16), mask=mask)
{_ruler("the block that holds the target writes the loss")}    if (t >= start) & (t < start + BLOCK_V):
        x_t = tl.load(logits_ptr + row * stride_lb + t).to(tl.float32)
        tl.store(loss_ptr + row, lse - x_t)
'''
        body = f'''    BLOCK_V = {v["BLOCK_V"]}  # columns per program
    NUM_WARPS = {v["NUM_WARPS"]}
{_ruler("PyTorch half: the row lse through an fp32 copy")}    lse = torch.logsumexp(logits.float(), dim=-1).contiguous()  # (B,) fp32
    grad_from_lse_kernel[(B, triton.cdiv(V, BLOCK_V))](
        logits, targets, lse, loss, grad, V, logits.stride(0), grad.stride(0),
        BLOCK_V=BLOCK_V, num_warps=NUM_WARPS,
    )
'''
    return (
        _header("torch_partial", f"half Triton, half PyTorch ({split})", doc, v)
        + f'''

# =============================================================================================
# Compute kernel
# =============================================================================================

{kernel}

# =============================================================================================
# Launcher
# =============================================================================================

def custom_kernel(data):
    """(logits, targets) -> (loss, grad), split between Triton and PyTorch ({split})."""
{_LAUNCH_PROLOGUE}{body}    return loss, grad
'''
    )


# ---------------------------------------------------------------------------------------------
# Knob domains and constraints
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# Family: grid_capped_online (deliberate under-occupancy)
# ---------------------------------------------------------------------------------------------

def _render_grid_capped(v: KnobValues) -> str:
    e, oh = v["exp_fn"], v["onehot"]
    doc = f"""
Algorithm: the row_online body (online max/sum-exp in one read of the row, then a grad write
loop re-reading it) on a capped persistent grid: only min(PROGRAMS, B) programs are launched,
whatever B is, and program p handles rows p, p + P, p + 2P, ... one after another. An
H100/H200 has 132 SMs, so with PROGRAMS < 132 most of the GPU idles and the kernel is bound by
the memory latency one program can hide; time falls roughly as 1 / PROGRAMS until the SMs fill.
4 B read + 2 B written per logit, at the bandwidth PROGRAMS programs reach.
Exponential: {e}; one-hot: {oh}."""
    return (
        _header("grid_capped_online", "a capped grid of PROGRAMS programs, each looping over rows", doc, v)
        + f'''

# =============================================================================================
# Compute kernel
# =============================================================================================

@triton.jit
def ce_capped_kernel(
    # pointers
    logits_ptr, targets_ptr, loss_ptr, grad_ptr,
    # sizes
    B, V,
    # strides (elements)
    stride_lb, stride_gb,
    # meta-parameters
    BLOCK_V: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
{_ruler("capped persistent schedule: program p handles rows p, p + P, p + 2P, ...")}    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_V)
    for row in range(pid, B, nprog):
        row_logits = logits_ptr + tl.cast(row, tl.int64) * stride_lb
        row_grad = grad_ptr + tl.cast(row, tl.int64) * stride_gb
        # -- loop 1: per-lane running (max, sum of exp), combined once after the loop
        m_vec = tl.full([BLOCK_V], -1e30, dtype=tl.float32)
        s_vec = tl.zeros([BLOCK_V], dtype=tl.float32)
        for start in tl.range(0, V, BLOCK_V, num_stages=NUM_STAGES):
            offs = start + cols
            x = tl.load(row_logits + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m_vec, x)
            s_vec = s_vec * {_exp("m_vec - m_new", e)} + {_exp("x - m_new", e)}
            m_vec = m_new
        m = tl.max(m_vec, axis=0)
        lse = m + tl.log(tl.sum(s_vec * {_exp("m_vec - m", e)}, axis=0))
        # -- loop 2: grad = softmax - onehot, bf16 store
        t = tl.load(targets_ptr + row)
        for start in tl.range(0, V, BLOCK_V, num_stages=NUM_STAGES):
            offs = start + cols
            mask = offs < V
            x = tl.load(row_logits + offs, mask=mask, other=0.0).to(tl.float32)
            p = {_exp("x - lse", e)}
            g = {_onehot("p", "offs", oh)}
            tl.store(row_grad + offs, g.to(tl.bfloat16), mask=mask)
        # -- loss = lse - x[target]
        x_t = tl.load(row_logits + t).to(tl.float32)
        tl.store(loss_ptr + row, lse - x_t)


# =============================================================================================
# Launcher
# =============================================================================================

def custom_kernel(data):
    """(logits, targets) -> (loss, grad) on a capped grid of PROGRAMS programs, one launch."""
{_LAUNCH_PROLOGUE}    PROGRAMS = {v["PROGRAMS"]}  # programs of the capped grid (min(PROGRAMS, B) launched)
    BLOCK_V = {v["BLOCK_V"]}  # chunk of a row per loop iteration (elements)
    NUM_WARPS = {v["NUM_WARPS"]}
    NUM_STAGES = {v["NUM_STAGES"]}  # software-pipelining depth of the chunk loops
    ce_capped_kernel[(min(PROGRAMS, B),)](
        logits, targets, loss, grad, B, V, logits.stride(0), grad.stride(0),
        BLOCK_V=BLOCK_V, NUM_STAGES=NUM_STAGES, num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return loss, grad
'''
    )


_EXP = Knob("exp_fn", ("exp", "exp2"), "tl.exp, or tl.exp2 of a log2(e)-scaled argument")
_ONEHOT = Knob("onehot", ("where", "subtract"), "one-hot as a select or as a 0/1 subtraction")
_WARPS = Knob("NUM_WARPS", (1, 2, 4, 8, 16), "warps per program")
_STAGES = Knob("NUM_STAGES", (1, 2, 3, 4), "software-pipelining depth of the chunk loops")


def _fits_vector(block_key: str, live_vectors: int = 1, rows_key: str | None = None):
    """Constraint: the live fp32 vectors of a program stay within the per-thread register budget."""

    def check(v: KnobValues) -> bool:
        elems = v[block_key] * (v[rows_key] if rows_key else 1) * live_vectors
        per_thread = _per_thread(elems, v["NUM_WARPS"])
        # under 1/4 element per thread, most of the warps would idle on replicated data
        return 0.25 <= per_thread / live_vectors and per_thread <= _MAX_ELEMS_PER_THREAD

    return check


FAMILIES: tuple[Family, ...] = (
    Family(
        task=TASK,
        algorithm="three_pass_fp32_temps",
        summary="unfused: fp32 upcast copy, per-row max and sum-exp loops, elementwise grad kernel",
        knobs=(
            Knob("BLOCK_V", (16, 32, 64, 128, 256, 512, 1024, 2048), "row-stats chunk"),
            Knob("BLOCK_E", (256, 1024, 4096), "elementwise block"),
            Knob("NUM_WARPS", (1, 2, 4, 8), "warps per program"),
            _EXP,
        ),
        render=_render_three_pass,
        constraint=lambda v: _per_thread(v["BLOCK_V"], v["NUM_WARPS"]) <= _MAX_ELEMS_PER_THREAD
        and _per_thread(v["BLOCK_E"], v["NUM_WARPS"]) <= _MAX_ELEMS_PER_THREAD,
    ),
    Family(
        task=TASK,
        algorithm="atomic_split",
        summary="2D grid of row blocks; row max and sum combined with atomics; three launches",
        knobs=(
            Knob("BLOCK_V", (32, 64, 128, 256, 512, 1024, 2048, 4096), "columns per program"),
            Knob("NUM_WARPS", (1, 2, 4, 8), "warps per program"),
            _EXP,
        ),
        render=_render_atomic_split,
        constraint=lambda v: _per_thread(v["BLOCK_V"], v["NUM_WARPS"]) <= _MAX_ELEMS_PER_THREAD,
    ),
    Family(
        task=TASK,
        algorithm="row_three_loop",
        summary="one program per row: max loop, sum-exp loop, grad write loop (reads the row 3x)",
        knobs=(
            Knob("BLOCK_V", (64, 128, 256, 512, 1024, 2048, 4096, 8192), "chunk per iteration"),
            _WARPS,
            _STAGES,
            _EXP,
            _ONEHOT,
        ),
        render=_render_row_three_loop,
        constraint=_fits_vector("BLOCK_V", live_vectors=2),
    ),
    Family(
        task=TASK,
        algorithm="row_online",
        summary="one program per row: online max/sum-exp in one read, then the grad write loop",
        knobs=(
            Knob("BLOCK_V", (128, 256, 512, 1024, 2048, 4096, 8192, 16384), "chunk per iteration"),
            _WARPS,
            _STAGES,
            Knob("online_state", ("scalar", "lane"), "running max/sum as scalars or per lane"),
            Knob("cache_hint", ("none", "l2_keep"), "evict_last on the first read, evict_first on the second"),
            _EXP,
            _ONEHOT,
        ),
        render=_render_row_online,
        constraint=lambda v: _fits_vector(
            "BLOCK_V", live_vectors=3 if v["online_state"] == "lane" else 2
        )(v),
    ),
    Family(
        task=TASK,
        algorithm="split_row",
        summary="split-K over V: per-chunk online partials, then a combine-and-write kernel",
        knobs=(
            Knob("SPLITS", (2, 4, 8, 16, 32), "chunks (programs) per row"),
            Knob("BLOCK_V", (256, 512, 1024, 2048, 4096), "columns per loop iteration"),
            Knob("NUM_WARPS", (2, 4, 8), "warps per program"),
            Knob("NUM_STAGES", (1, 2, 3), "software-pipelining depth"),
            _EXP,
        ),
        render=_render_split_row,
        constraint=_fits_vector("BLOCK_V", live_vectors=3),
    ),
    Family(
        task=TASK,
        algorithm="multi_row_tile",
        summary="BLOCK_B rows per program, online over (BLOCK_B, BLOCK_V) tiles",
        knobs=(
            Knob("BLOCK_B", (2, 4, 8, 16), "rows per program"),
            Knob("BLOCK_V", (64, 128, 256, 512, 1024, 2048), "columns per tile"),
            Knob("NUM_WARPS", (2, 4, 8), "warps per program"),
            Knob("NUM_STAGES", (1, 2, 3), "software-pipelining depth"),
            _EXP,
        ),
        render=_render_multi_row,
        constraint=_fits_vector("BLOCK_V", live_vectors=2, rows_key="BLOCK_B"),
    ),
    Family(
        task=TASK,
        algorithm="torch_partial",
        summary="partial PyTorch fallback: Triton lse + PyTorch grad, or PyTorch lse + Triton grad",
        knobs=(
            Knob("split", ("lse_triton", "grad_triton"), "which half runs in Triton"),
            Knob("BLOCK_V", (256, 512, 1024, 2048, 4096, 8192), "columns per chunk/program"),
            Knob("NUM_WARPS", (2, 4, 8), "warps per program"),
            _EXP,
        ),
        render=_render_torch_partial,
        constraint=lambda v: _per_thread(v["BLOCK_V"], v["NUM_WARPS"]) * 3 <= _MAX_ELEMS_PER_THREAD,
    ),
    Family(
        task=TASK,
        algorithm="grid_capped_online",
        summary="row_online body on a capped grid of PROGRAMS programs looping over rows",
        knobs=(
            Knob("PROGRAMS", rw_PROGRAMS.values, "programs of the capped grid"),
            Knob("BLOCK_V", (512, 1024, 2048, 4096), "chunk per iteration"),
            Knob("NUM_WARPS", (2, 4, 8), "warps per program"),
            _STAGES,
            _EXP,
            _ONEHOT,
        ),
        render=_render_grid_capped,
        constraint=_fits_vector("BLOCK_V", live_vectors=3),
    ),
)

# The seed kernel: the fused optimum's plain form (search starts here and mutates).
SEED: tuple[str, dict] = (
    "row_online",
    {
        "BLOCK_V": 2048,
        "NUM_WARPS": 8,
        "NUM_STAGES": 2,
        "online_state": "scalar",
        "cache_hint": "none",
        "exp_fn": "exp",
        "onehot": "where",
    },
)
