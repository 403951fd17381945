"""Kernel families of `gdn_chunk_fwd_o`: Gated DeltaNet chunk output (chunk size 64).

For chunk n and head h, o = scale * (exp(g)[:, None] * (q @ h_n) + tril((q @ k^T) * exp(g_i - g_j)) @ v).
From slowest to fastest, roughly: one program per token with CUDA-core dot products, CUDA-core
sub-chunk tiles, torch for the inter-chunk matmul plus a Triton intra-chunk kernel, two kernels
through a materialised gated score matrix, and fused one-pass chunk kernels on tensor cores
(whole chunk, or 16/32-row sub-chunks that skip key sub-blocks above the diagonal).

Three bin-fill families aim between those (0.7x-2x of the reference, bins 4-6, empty after the
first H200 round): the fused kernel on a capped persistent grid (speedup ~ PROGRAMS), the intra-
chunk attention term left to PyTorch fp32, and both terms in PyTorch with only the gated epilogue
in Triton.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipelines.generation.families._matmul_common import (
    MAX_ACC_REGS,
    SMEM_LIMIT,
    acc_regs,
    family,
    module,
)

TASK = "gdn_chunk_fwd_o"
Values = Mapping[str, Any]
BT = 64  # the task's chunk size: h holds one state per 64 tokens
LOG2E = 1.4426950408889634

SIGNATURE = """    # pointers: q, k (B, T, H, K); v, o (B, T, H, V); h (B, NT, H, K, V); g (B, T, H) fp32
    q_ptr, k_ptr, v_ptr, h_ptr, g_ptr, o_ptr,
    # sizes and the softmax-free attention scale
    T, H, K, V, scale,
    # strides, in elements (the last dimension of every tensor is contiguous)
    stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh, stride_ob, stride_ot, stride_oh,
    stride_hb, stride_hn, stride_hh, stride_hk, stride_gb, stride_gt, stride_gh,"""

LAUNCH_STRIDES = """q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        h.stride(0), h.stride(1), h.stride(2), h.stride(3), g.stride(0), g.stride(1), g.stride(2),"""

CHECK_SHAPES = """    q, k, v, h, g, scale = data
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, 64)  # chunks of 64 tokens
    assert k.shape == q.shape and v.shape == (B, T, H, V), "q, k (B, T, H, K); v (B, T, H, V)"
    assert h.shape == (B, NT, H, K, V) and g.shape == (B, T, H), "h (B, NT, H, K, V); g (B, T, H)"
    assert q.stride(3) == k.stride(3) == v.stride(3) == h.stride(4) == 1, "last dims contiguous\""""

BASES = """    off_b = pid_bh // H
    off_h = pid_bh % H
    q_base = q_ptr + off_b * stride_qb + off_h * stride_qh
    k_base = k_ptr + off_b * stride_kb + off_h * stride_kh
    v_base = v_ptr + off_b * stride_vb + off_h * stride_vh
    o_base = o_ptr + off_b * stride_ob + off_h * stride_oh
    g_base = g_ptr + off_b * stride_gb + off_h * stride_gh
    h_base = h_ptr + off_b * stride_hb + pid_n * stride_hn + off_h * stride_hh  # state of chunk pid_n
"""


def _gate(v: Values) -> tuple[str, str]:
    """(exp function, expression turning a log-gate into its argument)."""
    if v.get("gate", "exp") == "exp2":
        return "tl.exp2", f" * {LOG2E}"
    return "tl.exp", ""


def _chunk_ok(v: Values) -> bool:
    """Pipelined q, k and h tiles fit shared memory; o and A tiles fit registers."""
    smem = (
        v["NUM_STAGES"] * (2 * BT * v["BLOCK_K"] + v["BLOCK_K"] * v["BLOCK_V"]) * 2
        + BT * v["BLOCK_V"] * 2
    )
    regs = acc_regs(BT * v["BLOCK_V"] + BT * BT, v["NUM_WARPS"])
    return smem <= SMEM_LIMIT and regs <= MAX_ACC_REGS


# ----------------------------------------------------------------------------------------------
# fused_chunk: one program per (V block, chunk, batch * head), everything on chip
# ----------------------------------------------------------------------------------------------


def render_fused_chunk(v: Values) -> str:
    exp, to_arg = _gate(v)
    if v["scale_at"] == "input":
        q_line = "        q = (q.to(tl.float32) * scale).to(tl.bfloat16)  # scale folded into q\n"
        out_scale = ""
    else:
        q_line = ""
        out_scale = " * scale"
    if v["a_dtype"] == "bf16":
        intra = "tl.dot(A.to(tl.bfloat16), vv)"
        intra_note = "    # gated scores rounded to bf16 for the tensor cores\n"
    else:
        intra = "tl.dot(A, vv.to(tl.float32))"
        intra_note = "    # gated scores stay fp32 (tf32 dot)\n"
    body = f'''@triton.jit
def gdn_chunk_o_kernel(
{SIGNATURE}
    # meta-parameters
    BT: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """One program: a (BT, BLOCK_V) output tile of one chunk of one (batch, head)."""
    # ---- map program to (V block, chunk, batch * head) ---------------------------------------
    pid_v = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_bh = tl.program_id(2)
{BASES}    offs_t = pid_n * BT + tl.arange(0, BT)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    t_mask = offs_t < T  # the last chunk may be partial
    v_mask = offs_v < V

    # ---- accumulate q @ h (BT, BLOCK_V) and q @ k^T (BT, BT) in fp32 over K ------------------
    acc = tl.zeros((BT, BLOCK_V), tl.float32)
    A = tl.zeros((BT, BT), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        q = tl.load(q_base + offs_t[:, None] * stride_qt + offs_k[None, :], mask=t_mask[:, None] & k_mask[None, :], other=0.0)
{q_line}        kt = tl.load(k_base + offs_t[None, :] * stride_kt + offs_k[:, None], mask=k_mask[:, None] & t_mask[None, :], other=0.0)
        hh = tl.load(h_base + offs_k[:, None] * stride_hk + offs_v[None, :], mask=k_mask[:, None] & v_mask[None, :], other=0.0)
        acc = tl.dot(q, hh, acc)
        A = tl.dot(q, kt, A)

    # ---- gates: exp(g_i) on the inter-chunk part, exp(g_i - g_j) on the causal scores ----------
    g = tl.load(g_base + offs_t * stride_gt, mask=t_mask, other=0.0){to_arg}
    acc = acc * {exp}(g)[:, None]
    causal = (offs_t[:, None] >= offs_t[None, :]) & t_mask[None, :]
    A = tl.where(causal, A * {exp}(g[:, None] - g[None, :]), 0.0)  # select: masked exp may overflow

    # ---- intra-chunk part and masked write-back ------------------------------------------------
    vv = tl.load(v_base + offs_t[:, None] * stride_vt + offs_v[None, :], mask=t_mask[:, None] & v_mask[None, :], other=0.0)
{intra_note}    out = (acc + {intra}){out_scale}
    tl.store(o_base + offs_t[:, None] * stride_ot + offs_v[None, :], out.to(tl.bfloat16), mask=t_mask[:, None] & v_mask[None, :])


def custom_kernel(data):
    """Fused chunk output: grid (V blocks, chunks, B*H), {v["BLOCK_K"]}-wide K steps."""
{CHECK_SHAPES}
    o = torch.empty_like(v)
    BLOCK_K, BLOCK_V = {v["BLOCK_K"]}, {v["BLOCK_V"]}
    grid = (triton.cdiv(V, BLOCK_V), NT, B * H)
    gdn_chunk_o_kernel[grid](
        q, k, v, h, g, o,
        T, H, K, V, scale,
        {LAUNCH_STRIDES}
        BT=64, BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V,
        num_warps={v["NUM_WARPS"]}, num_stages={v["NUM_STAGES"]},
    )
    return o
'''
    changes = (
        "Fused, one pass: each program streams q, k and the chunk state h over K, accumulating "
        "q @ h and the (64, 64) score block q @ k^T on bf16 tensor cores in fp32, applies the gates "
        f"({exp}) and the causal mask in registers, and adds the score block times v before a single "
        f"store. Scale applied at the {v['scale_at']}; gated scores enter the last dot as {v['a_dtype']}."
    )
    return module(TASK, "fused_chunk", FUSED.summary, changes, v, body)


FUSED = family(
    TASK,
    "fused_chunk",
    "one fused tensor-core pass per (V block, chunk, head)",
    {
        "BLOCK_K": (16, 32, 64, 128),
        "BLOCK_V": (16, 32, 64, 128),
        "NUM_WARPS": (2, 4, 8),
        "NUM_STAGES": (1, 2, 3, 4),
        "gate": ("exp", "exp2"),
        "a_dtype": ("bf16", "fp32"),
        "scale_at": ("output", "input"),
    },
    render_fused_chunk,
    _chunk_ok,
)


# ----------------------------------------------------------------------------------------------
# sub_chunk_fused: BLOCK_T query rows per program, key sub-blocks above the diagonal skipped
# ----------------------------------------------------------------------------------------------


def render_sub_chunk_fused(v: Values) -> str:
    exp, to_arg = _gate(v)
    body = f'''@triton.jit
def gdn_sub_chunk_o_kernel(
{SIGNATURE}
    # meta-parameters
    BT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """One program: BLOCK_T rows of a chunk; only key sub-blocks at or below them are visited."""
    # ---- map program to (V block, chunk and sub-block, batch * head) ---------------------------
    pid_v = tl.program_id(0)
    pid_n = tl.program_id(1) // (BT // BLOCK_T)
    sub = tl.program_id(1) % (BT // BLOCK_T)
    pid_bh = tl.program_id(2)
{BASES}    offs_t = pid_n * BT + sub * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    t_mask = offs_t < T
    v_mask = offs_v < V
    g_t = tl.load(g_base + offs_t * stride_gt, mask=t_mask, other=0.0){to_arg}

    # ---- inter-chunk part: (BLOCK_T, K) @ (K, BLOCK_V), fp32 accumulate -------------------------
    acc = tl.zeros((BLOCK_T, BLOCK_V), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        q = tl.load(q_base + offs_t[:, None] * stride_qt + offs_k[None, :], mask=t_mask[:, None] & (offs_k[None, :] < K), other=0.0)
        hh = tl.load(h_base + offs_k[:, None] * stride_hk + offs_v[None, :], mask=(offs_k[:, None] < K) & v_mask[None, :], other=0.0)
        acc = tl.dot(q, hh, acc)
    acc = acc * {exp}(g_t)[:, None]

    # ---- intra-chunk part: key sub-blocks 0..sub of this chunk ---------------------------------
    for j in range(0, sub + 1):
        offs_s = pid_n * BT + j * BLOCK_T + tl.arange(0, BLOCK_T)
        s_mask = offs_s < T
        A = tl.zeros((BLOCK_T, BLOCK_T), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            q = tl.load(q_base + offs_t[:, None] * stride_qt + offs_k[None, :], mask=t_mask[:, None] & (offs_k[None, :] < K), other=0.0)
            kt = tl.load(k_base + offs_s[None, :] * stride_kt + offs_k[:, None], mask=(offs_k[:, None] < K) & s_mask[None, :], other=0.0)
            A = tl.dot(q, kt, A)
        g_s = tl.load(g_base + offs_s * stride_gt, mask=s_mask, other=0.0){to_arg}
        causal = (offs_t[:, None] >= offs_s[None, :]) & s_mask[None, :]
        A = tl.where(causal, A * {exp}(g_t[:, None] - g_s[None, :]), 0.0)
        vv = tl.load(v_base + offs_s[:, None] * stride_vt + offs_v[None, :], mask=s_mask[:, None] & v_mask[None, :], other=0.0)
        acc = tl.dot(A.to(tl.bfloat16), vv, acc)

    # ---- masked write-back ------------------------------------------------------------------------
    out = acc * scale
    tl.store(o_base + offs_t[:, None] * stride_ot + offs_v[None, :], out.to(tl.bfloat16), mask=t_mask[:, None] & v_mask[None, :])


def custom_kernel(data):
    """Sub-chunk fused output: {v["BLOCK_T"]}-row programs, grid (V blocks, chunks * {64 // v["BLOCK_T"]}, B*H)."""
{CHECK_SHAPES}
    o = torch.empty_like(v)
    BLOCK_T, BLOCK_K, BLOCK_V = {v["BLOCK_T"]}, {v["BLOCK_K"]}, {v["BLOCK_V"]}
    grid = (triton.cdiv(V, BLOCK_V), NT * (64 // BLOCK_T), B * H)
    gdn_sub_chunk_o_kernel[grid](
        q, k, v, h, g, o,
        T, H, K, V, scale,
        {LAUNCH_STRIDES}
        BT=64, BLOCK_T=BLOCK_T, BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V,
        num_warps={v["NUM_WARPS"]}, num_stages={v["NUM_STAGES"]},
    )
    return o
'''
    changes = (
        f"Fused, with each chunk split into {64 // v['BLOCK_T']} sub-blocks of {v['BLOCK_T']} rows: more, "
        "smaller programs (more parallelism for small batches), and the intra-chunk loop visits only "
        "key sub-blocks at or below the diagonal (about half the score work), at the price of "
        f"re-reading q for every sub-block. Gates with {exp}."
    )
    return module(TASK, "sub_chunk_fused", SUB.summary, changes, v, body)


SUB = family(
    TASK,
    "sub_chunk_fused",
    "fused tensor-core kernel on 16/32-row sub-chunks with causal sub-block skipping",
    {
        "BLOCK_T": (16, 32),
        "BLOCK_K": (16, 32, 64, 128),
        "BLOCK_V": (16, 32, 64, 128),
        "NUM_WARPS": (2, 4, 8),
        "NUM_STAGES": (1, 2, 3),
        "gate": ("exp", "exp2"),
    },
    render_sub_chunk_fused,
    lambda v: (
        v["NUM_STAGES"] * (2 * v["BLOCK_T"] * v["BLOCK_K"] + v["BLOCK_K"] * v["BLOCK_V"]) * 2
        <= SMEM_LIMIT
        and acc_regs(v["BLOCK_T"] * v["BLOCK_V"], v["NUM_WARPS"]) >= 1
    ),
)


# ----------------------------------------------------------------------------------------------
# two_kernel_scores: gated score blocks through global memory, then the output kernel
# ----------------------------------------------------------------------------------------------


def render_two_kernel_scores(v: Values) -> str:
    exp, to_arg = _gate(v)
    adt = "tl.float32" if v["a_store"] == "fp32" else "tl.bfloat16"
    torch_adt = "torch.float32" if v["a_store"] == "fp32" else "torch.bfloat16"
    body = f'''@triton.jit
def gdn_scores_kernel(
{SIGNATURE}
    a_ptr,  # (B*H, NT, BT, BT) scratch for the gated, masked, scaled score blocks
    # meta-parameters
    BT: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Kernel 1: A = tril(q k^T * exp(g_i - g_j)) * scale for one chunk, written to global memory."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
{BASES}    offs_t = pid_n * BT + tl.arange(0, BT)
    t_mask = offs_t < T
    A = tl.zeros((BT, BT), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        q = tl.load(q_base + offs_t[:, None] * stride_qt + offs_k[None, :], mask=t_mask[:, None] & (offs_k[None, :] < K), other=0.0)
        kt = tl.load(k_base + offs_t[None, :] * stride_kt + offs_k[:, None], mask=(offs_k[:, None] < K) & t_mask[None, :], other=0.0)
        A = tl.dot(q, kt, A)
    g = tl.load(g_base + offs_t * stride_gt, mask=t_mask, other=0.0){to_arg}
    causal = (offs_t[:, None] >= offs_t[None, :]) & t_mask[None, :]
    A = tl.where(causal, A * {exp}(g[:, None] - g[None, :]), 0.0) * scale
    rows = tl.arange(0, BT)
    a_ptrs = a_ptr + (pid_bh * tl.cdiv(T, BT) + pid_n) * BT * BT + rows[:, None] * BT + rows[None, :]
    tl.store(a_ptrs, A.to({adt}))


@triton.jit
def gdn_output_kernel(
{SIGNATURE}
    a_ptr,  # the score blocks written by kernel 1
    # meta-parameters
    BT: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """Kernel 2: o = exp(g) * (q @ h) * scale + A @ v for a (BT, BLOCK_V) tile."""
    pid_v = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_bh = tl.program_id(2)
{BASES}    offs_t = pid_n * BT + tl.arange(0, BT)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    t_mask = offs_t < T
    v_mask = offs_v < V
    acc = tl.zeros((BT, BLOCK_V), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        q = tl.load(q_base + offs_t[:, None] * stride_qt + offs_k[None, :], mask=t_mask[:, None] & (offs_k[None, :] < K), other=0.0)
        hh = tl.load(h_base + offs_k[:, None] * stride_hk + offs_v[None, :], mask=(offs_k[:, None] < K) & v_mask[None, :], other=0.0)
        acc = tl.dot(q, hh, acc)
    g = tl.load(g_base + offs_t * stride_gt, mask=t_mask, other=0.0){to_arg}
    acc = acc * ({exp}(g) * scale)[:, None]
    rows = tl.arange(0, BT)
    A = tl.load(a_ptr + (pid_bh * tl.cdiv(T, BT) + pid_n) * BT * BT + rows[:, None] * BT + rows[None, :])
    vv = tl.load(v_base + offs_t[:, None] * stride_vt + offs_v[None, :], mask=t_mask[:, None] & v_mask[None, :], other=0.0)
    acc = tl.dot(A.to(tl.bfloat16), vv, acc)
    tl.store(o_base + offs_t[:, None] * stride_ot + offs_v[None, :], acc.to(tl.bfloat16), mask=t_mask[:, None] & v_mask[None, :])


def custom_kernel(data):
    """Two launches: gated score blocks ({v["a_store"]} scratch), then the chunk output."""
{CHECK_SHAPES}
    o = torch.empty_like(v)
    scores = torch.empty((B * H, NT, 64, 64), device=q.device, dtype={torch_adt})
    BLOCK_K, BLOCK_V = {v["BLOCK_K"]}, {v["BLOCK_V"]}
    gdn_scores_kernel[(NT, B * H)](
        q, k, v, h, g, o,
        T, H, K, V, scale,
        {LAUNCH_STRIDES}
        scores, BT=64, BLOCK_K=BLOCK_K, num_warps={v["NUM_WARPS"]}, num_stages={v["NUM_STAGES"]},
    )
    gdn_output_kernel[(triton.cdiv(V, BLOCK_V), NT, B * H)](
        q, k, v, h, g, o,
        T, H, K, V, scale,
        {LAUNCH_STRIDES}
        scores, BT=64, BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V, num_warps={v["NUM_WARPS"]}, num_stages={v["NUM_STAGES"]},
    )
    return o
'''
    changes = (
        "Two kernels: the first computes each chunk's gated, causally masked, scaled score block "
        f"and writes it to a {v['a_store']} scratch buffer (B*H*NT*64*64 elements); the second "
        f"computes the inter-chunk part and reads the scores back for the final dot. Gates with {exp}."
    )
    return module(TASK, "two_kernel_scores", TWO.summary, changes, v, body)


TWO = family(
    TASK,
    "two_kernel_scores",
    "gated score blocks materialised in global memory, then an output kernel",
    {
        "BLOCK_K": (16, 32, 64, 128),
        "BLOCK_V": (16, 32, 64, 128),
        "NUM_WARPS": (2, 4, 8),
        "NUM_STAGES": (1, 2, 3),
        "gate": ("exp", "exp2"),
        "a_store": ("fp32", "bf16"),
    },
    render_two_kernel_scores,
    _chunk_ok,
)


# ----------------------------------------------------------------------------------------------
# torch_inter_triton_intra: partial PyTorch fallback for the inter-chunk matmul
# ----------------------------------------------------------------------------------------------


def render_torch_inter(v: Values) -> str:
    exp, to_arg = _gate(v)
    if v["inter_dtype"] == "fp32":
        inter = "torch.matmul(qc.float(), h.float())  # fp32 batched matmul (no tensor cores)"
    else:
        inter = "torch.matmul(qc, h)  # bf16 batched matmul (cuBLAS tensor cores)"
    body = f'''@triton.jit
def gdn_intra_kernel(
{SIGNATURE}
    x_ptr,  # (B, NT, H, BT, V) inter-chunk products q @ h from torch
    # meta-parameters
    BT: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """o = scale * (exp(g) * x + tril(q k^T * exp(g_i - g_j)) @ v) for a (BT, BLOCK_V) tile."""
    pid_v = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_bh = tl.program_id(2)
{BASES}    offs_t = pid_n * BT + tl.arange(0, BT)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    t_mask = offs_t < T
    v_mask = offs_v < V

    # ---- gated scores of this chunk, fp32 accumulate over K -----------------------------------
    A = tl.zeros((BT, BT), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        q = tl.load(q_base + offs_t[:, None] * stride_qt + offs_k[None, :], mask=t_mask[:, None] & (offs_k[None, :] < K), other=0.0)
        kt = tl.load(k_base + offs_t[None, :] * stride_kt + offs_k[:, None], mask=(offs_k[:, None] < K) & t_mask[None, :], other=0.0)
        A = tl.dot(q, kt, A)
    g = tl.load(g_base + offs_t * stride_gt, mask=t_mask, other=0.0){to_arg}
    causal = (offs_t[:, None] >= offs_t[None, :]) & t_mask[None, :]
    A = tl.where(causal, A * {exp}(g[:, None] - g[None, :]), 0.0)

    # ---- add the decayed inter-chunk product and write back ------------------------------------
    rows = tl.arange(0, BT)
    x_base = x_ptr + ((off_b * tl.cdiv(T, BT) + pid_n) * H + off_h) * BT * V
    x = tl.load(x_base + rows[:, None] * V + offs_v[None, :], mask=v_mask[None, :], other=0.0).to(tl.float32)
    vv = tl.load(v_base + offs_t[:, None] * stride_vt + offs_v[None, :], mask=t_mask[:, None] & v_mask[None, :], other=0.0)
    out = (x * {exp}(g)[:, None] + tl.dot(A.to(tl.bfloat16), vv)) * scale
    tl.store(o_base + offs_t[:, None] * stride_ot + offs_v[None, :], out.to(tl.bfloat16), mask=t_mask[:, None] & v_mask[None, :])


def custom_kernel(data):
    """torch computes q @ h per chunk ({v["inter_dtype"]}); Triton does the gated intra-chunk part."""
{CHECK_SHAPES}
    pad = NT * 64 - T
    qc = torch.nn.functional.pad(q, (0, 0, 0, 0, 0, pad)).view(B, NT, 64, H, K).permute(0, 1, 3, 2, 4)
    x = {inter}
    x = x.contiguous()  # (B, NT, H, 64, V)
    o = torch.empty_like(v)
    BLOCK_K, BLOCK_V = {v["BLOCK_K"]}, {v["BLOCK_V"]}
    gdn_intra_kernel[(triton.cdiv(V, BLOCK_V), NT, B * H)](
        q, k, v, h, g, o,
        T, H, K, V, scale,
        {LAUNCH_STRIDES}
        x, BT=64, BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V, num_warps={v["NUM_WARPS"]}, num_stages={v["NUM_STAGES"]},
    )
    return o
'''
    changes = (
        "Partial PyTorch fallback: the inter-chunk product q @ h runs as a torch batched matmul "
        f"({v['inter_dtype']}) into a temporary, and one Triton kernel computes the gated causal "
        f"score block, adds the decayed temporary and writes o. Gates with {exp}."
    )
    return module(TASK, "torch_inter_triton_intra", TORCH.summary, changes, v, body)


TORCH = family(
    TASK,
    "torch_inter_triton_intra",
    "torch batched matmul for q @ h, Triton kernel for the gated intra-chunk part",
    {
        "BLOCK_K": (16, 32, 64, 128),
        "BLOCK_V": (16, 32, 64, 128),
        "NUM_WARPS": (2, 4, 8),
        "NUM_STAGES": (1, 2, 3),
        "gate": ("exp", "exp2"),
        "inter_dtype": ("bf16", "fp32"),
    },
    render_torch_inter,
    _chunk_ok,
)


# ----------------------------------------------------------------------------------------------
# token_scalar: one program per token, CUDA-core dot products, state re-read per token
# ----------------------------------------------------------------------------------------------


def render_token_scalar(v: Values) -> str:
    exp, to_arg = _gate(v)
    body = f'''@triton.jit
def gdn_token_kernel(
{SIGNATURE}
    # meta-parameters
    BT: tl.constexpr, KD: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, KEYS: tl.constexpr,
):
    """One program per (token, V block, batch * head); every product is a tl.sum on CUDA cores."""
    # ---- map program to (token, V block, batch * head) -----------------------------------------
    t = tl.program_id(0)
    pid_v = tl.program_id(1)
    pid_bh = tl.program_id(2)
    pid_n = t // BT  # the token's chunk
{BASES}    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    v_mask = offs_v < V
    g_t = tl.load(g_base + t * stride_gt){to_arg}

    # ---- inter-chunk part: q_t (K,) against the chunk state (K, BLOCK_V) -------------------------
    acc = tl.zeros((BLOCK_V,), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        qk = tl.load(q_base + t * stride_qt + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
        hh = tl.load(h_base + offs_k[:, None] * stride_hk + offs_v[None, :], mask=(offs_k[:, None] < K) & v_mask[None, :], other=0.0)
        acc += tl.sum(qk[:, None] * hh.to(tl.float32), 0)
    acc = acc * {exp}(g_t)

    # ---- intra-chunk part: earlier tokens of the chunk, KEYS at a time -------------------------
    offs_kd = tl.arange(0, KD)
    q = tl.load(q_base + t * stride_qt + offs_kd, mask=offs_kd < K, other=0.0).to(tl.float32)
    for s0 in range(pid_n * BT, t + 1, KEYS):
        offs_s = s0 + tl.arange(0, KEYS)
        s_mask = offs_s <= t
        kk = tl.load(k_base + offs_s[:, None] * stride_kt + offs_kd[None, :], mask=s_mask[:, None] & (offs_kd[None, :] < K), other=0.0)
        a = tl.sum(q[None, :] * kk.to(tl.float32), 1)  # (KEYS,) q_t . k_s
        g_s = tl.load(g_base + offs_s * stride_gt, mask=s_mask, other=0.0){to_arg}
        a = tl.where(s_mask, a * {exp}(g_t - g_s), 0.0)
        vv = tl.load(v_base + offs_s[:, None] * stride_vt + offs_v[None, :], mask=s_mask[:, None] & v_mask[None, :], other=0.0)
        acc += tl.sum(a[:, None] * vv.to(tl.float32), 0)

    # ---- write the token's output -----------------------------------------------------------------
    tl.store(o_base + t * stride_ot + offs_v, (acc * scale).to(tl.bfloat16), mask=v_mask)


def custom_kernel(data):
    """Token-at-a-time chunk output ({v["KEYS"]} keys per step, {v["BLOCK_V"]}-wide V blocks)."""
{CHECK_SHAPES}
    o = torch.empty_like(v)
    BLOCK_K, BLOCK_V, KEYS = {v["BLOCK_K"]}, {v["BLOCK_V"]}, {v["KEYS"]}
    gdn_token_kernel[(T, triton.cdiv(V, BLOCK_V), B * H)](
        q, k, v, h, g, o,
        T, H, K, V, scale,
        {LAUNCH_STRIDES}
        BT=64, KD=triton.next_power_of_2(K), BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V, KEYS=KEYS,
        num_warps={v["NUM_WARPS"]},
    )
    return o
'''
    changes = (
        "Naive: one program per token re-reads its chunk's whole (K, V) state and all earlier keys "
        "and values of the chunk, with every product a broadcast + tl.sum in fp32 (no tensor cores, "
        f"about 64x the state traffic of a chunked kernel). Gates with {exp}."
    )
    return module(TASK, "token_scalar", TOKEN.summary, changes, v, body)


TOKEN = family(
    TASK,
    "token_scalar",
    "one program per token, CUDA-core dot products, chunk state re-read per token",
    {
        "BLOCK_K": (16, 32, 64),
        "BLOCK_V": (16, 32, 64, 128),
        "KEYS": (2, 4, 8, 16),
        "NUM_WARPS": (1, 2, 4, 8),
        "gate": ("exp", "exp2"),
    },
    render_token_scalar,
    lambda v: (
        acc_regs(v["BLOCK_K"] * v["BLOCK_V"] + v["KEYS"] * (128 + v["BLOCK_V"]), v["NUM_WARPS"])
        <= MAX_ACC_REGS
    ),
)


# ----------------------------------------------------------------------------------------------
# cuda_core_sub_chunk: the sub-chunk algorithm with broadcast products instead of tl.dot
# ----------------------------------------------------------------------------------------------


def render_cuda_core_sub_chunk(v: Values) -> str:
    exp, to_arg = _gate(v)
    body = f'''@triton.jit
def gdn_fma_kernel(
{SIGNATURE}
    # meta-parameters
    BT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """BLOCK_T rows of a chunk per program; products are 3-D broadcasts reduced with tl.sum."""
    # ---- map program to (V block, chunk and sub-block, batch * head) ---------------------------
    pid_v = tl.program_id(0)
    pid_n = tl.program_id(1) // (BT // BLOCK_T)
    sub = tl.program_id(1) % (BT // BLOCK_T)
    pid_bh = tl.program_id(2)
{BASES}    offs_t = pid_n * BT + sub * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    t_mask = offs_t < T
    v_mask = offs_v < V
    g_t = tl.load(g_base + offs_t * stride_gt, mask=t_mask, other=0.0){to_arg}

    # ---- inter-chunk part on CUDA cores --------------------------------------------------------
    acc = tl.zeros((BLOCK_T, BLOCK_V), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        q = tl.load(q_base + offs_t[:, None] * stride_qt + offs_k[None, :], mask=t_mask[:, None] & (offs_k[None, :] < K), other=0.0).to(tl.float32)
        hh = tl.load(h_base + offs_k[:, None] * stride_hk + offs_v[None, :], mask=(offs_k[:, None] < K) & v_mask[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(q[:, :, None] * hh[None, :, :], 1)
    acc = acc * {exp}(g_t)[:, None]

    # ---- intra-chunk part: key sub-blocks 0..sub -------------------------------------------------
    for j in range(0, sub + 1):
        offs_s = pid_n * BT + j * BLOCK_T + tl.arange(0, BLOCK_T)
        s_mask = offs_s < T
        A = tl.zeros((BLOCK_T, BLOCK_T), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            q = tl.load(q_base + offs_t[:, None] * stride_qt + offs_k[None, :], mask=t_mask[:, None] & (offs_k[None, :] < K), other=0.0).to(tl.float32)
            kk = tl.load(k_base + offs_s[:, None] * stride_kt + offs_k[None, :], mask=s_mask[:, None] & (offs_k[None, :] < K), other=0.0).to(tl.float32)
            A += tl.sum(q[:, None, :] * kk[None, :, :], 2)
        g_s = tl.load(g_base + offs_s * stride_gt, mask=s_mask, other=0.0){to_arg}
        causal = (offs_t[:, None] >= offs_s[None, :]) & s_mask[None, :]
        A = tl.where(causal, A * {exp}(g_t[:, None] - g_s[None, :]), 0.0)
        vv = tl.load(v_base + offs_s[:, None] * stride_vt + offs_v[None, :], mask=s_mask[:, None] & v_mask[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(A[:, :, None] * vv[None, :, :], 1)

    # ---- masked write-back ------------------------------------------------------------------------
    tl.store(o_base + offs_t[:, None] * stride_ot + offs_v[None, :], (acc * scale).to(tl.bfloat16), mask=t_mask[:, None] & v_mask[None, :])


def custom_kernel(data):
    """Sub-chunk output on CUDA cores: {v["BLOCK_T"]}-row programs."""
{CHECK_SHAPES}
    o = torch.empty_like(v)
    BLOCK_T, BLOCK_K, BLOCK_V = {v["BLOCK_T"]}, {v["BLOCK_K"]}, {v["BLOCK_V"]}
    gdn_fma_kernel[(triton.cdiv(V, BLOCK_V), NT * (64 // BLOCK_T), B * H)](
        q, k, v, h, g, o,
        T, H, K, V, scale,
        {LAUNCH_STRIDES}
        BT=64, BLOCK_T=BLOCK_T, BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V, num_warps={v["NUM_WARPS"]},
    )
    return o
'''
    changes = (
        "The sub-chunk algorithm with every product written as a 3-D broadcast reduced by tl.sum "
        f"in fp32 on CUDA cores (no tensor cores), {v['BLOCK_T']}-row sub-blocks. Gates with {exp}."
    )
    return module(TASK, "cuda_core_sub_chunk", FMA.summary, changes, v, body)


FMA = family(
    TASK,
    "cuda_core_sub_chunk",
    "sub-chunk tiles with CUDA-core broadcast products, no tensor cores",
    {
        "BLOCK_T": (4, 8, 16),
        "BLOCK_K": (8, 16, 32),
        "BLOCK_V": (8, 16, 32, 64),
        "NUM_WARPS": (1, 2, 4, 8),
        "gate": ("exp", "exp2"),
    },
    render_cuda_core_sub_chunk,
    lambda v: (
        acc_regs(v["BLOCK_T"] * v["BLOCK_V"] * max(v["BLOCK_K"], v["BLOCK_T"]), v["NUM_WARPS"])
        <= MAX_ACC_REGS
        and v["BLOCK_T"] * v["BLOCK_V"] >= 32
    ),
)


# ----------------------------------------------------------------------------------------------
# grid_capped_fused: the fused chunk kernel on a capped persistent grid (bin fill, 2026-11-29)
# ----------------------------------------------------------------------------------------------
# The first H200 round left bins 4-6 (0.71x-2x of the reference) empty: tensor-core kernels run
# at 3-20x, CUDA-core ones at 0.06-0.7x. Reference: 2.36, 2.31, 4.49 ms on the three benchmark
# cases (the fused kernel: 0.12-0.15, 0.12-0.15, 0.23-0.29 ms). Capping the grid makes the fused
# kernel latency-bound: one program per SM walks its tiles one after another, each tile about
# two dependent HBM round trips (the q, k, h loop, then g and v) plus a store, ~1.5-4 us with
# 4-8 warps. Case 1 at BLOCK_V 64 has 8192 tiles, so t ~ 8192 * t_tile / PROGRAMS and the
# speedup ~ (0.07-0.19) x PROGRAMS (BLOCK_V 128: half the tiles, ~1.5x faster). PROGRAMS is
# log-spaced so that, whatever t_tile turns out to be, two to four values land in 0.71x-2x.
GRID_CAPPED_PROGRAMS = (3, 4, 6, 8, 12, 16, 24, 32)


def render_grid_capped_fused(v: Values) -> str:
    exp, to_arg = _gate(v)
    bases = "\n".join("    " + line if line else line for line in BASES.splitlines()) + "\n"
    body = f'''@triton.jit
def gdn_capped_o_kernel(
{SIGNATURE}
    BH,  # batch * heads
    # meta-parameters
    BT: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """Few programs, each looping over (V block, chunk, batch * head) tiles of the fused kernel."""
    # ---- capped persistent schedule: program p takes tiles p, p + P, p + 2P, ... --------------
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    n_v = tl.cdiv(V, BLOCK_V)
    n_chunks = tl.cdiv(T, BT)
    for tile in range(pid, n_v * n_chunks * BH, nprog):
        # V blocks vary fastest: programs running side by side share one chunk's q and k in L2
        pid_v = tile % n_v
        pid_n = (tile // n_v) % n_chunks
        pid_bh = tile // (n_v * n_chunks)
{bases}        offs_t = pid_n * BT + tl.arange(0, BT)
        offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
        t_mask = offs_t < T  # the last chunk may be partial
        v_mask = offs_v < V

        # ---- q @ h (BT, BLOCK_V) and q @ k^T (BT, BT) on tensor cores, fp32 accumulate ---------
        acc = tl.zeros((BT, BLOCK_V), tl.float32)
        A = tl.zeros((BT, BT), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < K
            q = tl.load(q_base + offs_t[:, None] * stride_qt + offs_k[None, :], mask=t_mask[:, None] & k_mask[None, :], other=0.0)
            kt = tl.load(k_base + offs_t[None, :] * stride_kt + offs_k[:, None], mask=k_mask[:, None] & t_mask[None, :], other=0.0)
            hh = tl.load(h_base + offs_k[:, None] * stride_hk + offs_v[None, :], mask=k_mask[:, None] & v_mask[None, :], other=0.0)
            acc = tl.dot(q, hh, acc)
            A = tl.dot(q, kt, A)

        # ---- gates and causal mask in registers ------------------------------------------------
        g = tl.load(g_base + offs_t * stride_gt, mask=t_mask, other=0.0){to_arg}
        acc = acc * {exp}(g)[:, None]
        causal = (offs_t[:, None] >= offs_t[None, :]) & t_mask[None, :]
        A = tl.where(causal, A * {exp}(g[:, None] - g[None, :]), 0.0)  # select: masked exp may overflow

        # ---- intra-chunk part and masked write-back --------------------------------------------
        vv = tl.load(v_base + offs_t[:, None] * stride_vt + offs_v[None, :], mask=t_mask[:, None] & v_mask[None, :], other=0.0)
        out = (acc + tl.dot(A.to(tl.bfloat16), vv)) * scale
        tl.store(o_base + offs_t[:, None] * stride_ot + offs_v[None, :], out.to(tl.bfloat16), mask=t_mask[:, None] & v_mask[None, :])


def custom_kernel(data):
    """Fused chunk output on min({v["PROGRAMS"]}, tiles) persistent programs."""
{CHECK_SHAPES}
    o = torch.empty_like(v)
    PROGRAMS, BLOCK_K, BLOCK_V = {v["PROGRAMS"]}, {v["BLOCK_K"]}, {v["BLOCK_V"]}
    n_tiles = triton.cdiv(V, BLOCK_V) * NT * B * H
    grid = (min(PROGRAMS, n_tiles),)  # deliberately few programs: each walks n_tiles / PROGRAMS tiles
    gdn_capped_o_kernel[grid](
        q, k, v, h, g, o,
        T, H, K, V, scale,
        {LAUNCH_STRIDES}
        B * H, BT=64, BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V,
        num_warps={v["NUM_WARPS"]}, num_stages={v["NUM_STAGES"]},
    )
    return o
'''
    changes = (
        f"The fused chunk kernel (q @ h and the gated causal score block on bf16 tensor cores, one "
        f"store) on a capped grid: only min({v['PROGRAMS']}, tiles) programs are launched and "
        "program p handles tiles p, p + P, p + 2P, ... one after another. An H100/H200 has 132 "
        "SMs, so with PROGRAMS < 132 most of the GPU idles and every tile pays its HBM latency "
        "in sequence: time falls roughly as 1 / PROGRAMS until the SMs fill up. Gates with "
        f"{exp}; scale applied at the output."
    )
    return module(TASK, "grid_capped_fused", CAPPED.summary, changes, v, body)


CAPPED = family(
    TASK,
    "grid_capped_fused",
    "fused tensor-core chunk kernel on a capped grid of PROGRAMS persistent programs",
    {
        "PROGRAMS": GRID_CAPPED_PROGRAMS,
        "BLOCK_K": (32, 64, 128),
        "BLOCK_V": (64, 128),
        "NUM_WARPS": (4, 8),
        "NUM_STAGES": (1, 2, 3),
        "gate": ("exp", "exp2"),
    },
    render_grid_capped_fused,
    _chunk_ok,
    docs={"PROGRAMS": "programs of the capped grid (min(PROGRAMS, tiles) are launched)"},
)


# ----------------------------------------------------------------------------------------------
# Torch fallbacks for the intra-chunk term (bin fill, 2026-11-29)
# ----------------------------------------------------------------------------------------------
# The reference spends most of its 2.36 ms (case 1) on fp32 copies and the materialised
# (B, NT, H, 64, 64) gated score matrix of the intra-chunk term; its inter-chunk term is ~0.8 ms
# (torch_inter_triton_intra with an fp32 torch matmul measured 0.84-0.98 ms in all, 2.4-2.8x).


def _torch_chunks(form: str) -> str:
    """Launcher lines: padded fp32 chunks qc, kc, vc, the gates gc and the causal decay matrix.

    "einsum": (B, NT, 64, H, D) views of padded fp32 copies, as the reference; "bmm": contiguous
    (B, NT, H, 64, D) fp32 copies, batch dimensions first for torch.matmul.
    """
    if form == "einsum":
        chunks = (
            "    # (B, T, H, D) -> (B, NT, 64, H, D) fp32, padded to whole chunks (the reference's layout)\n"
            "    qc, kc, vc = (\n"
            "        torch.nn.functional.pad(x.float(), (0, 0, 0, 0, 0, pad)).view(B, NT, 64, H, x.shape[-1])\n"
            "        for x in (q, k, v)\n"
            "    )\n"
        )
    else:
        chunks = (
            "    # (B, T, H, D) -> (B, NT, H, 64, D) fp32, one contiguous copy each (batched-matmul layout)\n"
            "    qc, kc, vc = (\n"
            "        torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)).view(B, NT, 64, H, x.shape[-1])\n"
            "        .transpose(2, 3).to(torch.float32, memory_format=torch.contiguous_format)\n"
            "        for x in (q, k, v)\n"
            "    )\n"
        )
    return (
        "    pad = NT * 64 - T\n"
        + chunks
        + "    gc = torch.nn.functional.pad(g, (0, 0, 0, pad)).view(B, NT, 64, H).permute(0, 1, 3, 2)  # (B, NT, H, 64)\n"
        "    causal = torch.ones(64, 64, dtype=torch.bool, device=q.device).tril()\n"
        "    # (B, NT, H, 64, 64) fp32 decay exp(g_i - g_j), masked before exp can overflow\n"
        '    decay = torch.exp(torch.where(causal, gc[..., :, None] - gc[..., None, :], float("-inf")))\n'
    )


def _torch_intra(form: str) -> str:
    """Launcher lines: `intra` (B, NT, 64, H, V) fp32, the unscaled intra-chunk term."""
    if form == "einsum":
        return (
            '    scores = torch.einsum("bnihk,bnjhk->bnhij", qc, kc) * decay  # (B, NT, H, 64, 64) fp32\n'
            '    intra = torch.einsum("bnhij,bnjhv->bnihv", scores, vc)  # (B, NT, 64, H, V) fp32\n'
        )
    return (
        "    scores = torch.matmul(qc, kc.transpose(-1, -2)) * decay  # (B, NT, H, 64, 64) fp32\n"
        "    intra = torch.matmul(scores, vc).transpose(2, 3)  # (B, NT, 64, H, V) view, fp32\n"
    )


def _torch_inter(form: str) -> str:
    """Launcher lines: `inter` (B, NT, 64, H, V) fp32, q @ h per chunk before its gate."""
    if form == "einsum":
        return '    inter = torch.einsum("bnchk,bnhkv->bnchv", qc, h.float())  # (B, NT, 64, H, V) fp32\n'
    return (
        "    inter = torch.matmul(qc, h.float()).transpose(2, 3)  # (B, NT, 64, H, V) view, fp32\n"
    )


TORCH_FORMS = ("einsum", "bmm")
TORCH_FORM_NOTES = {
    "einsum": "fp32 einsums on padded (B, NT, 64, H, D) copies, as the reference",
    "bmm": "fp32 torch.matmul on contiguous (B, NT, H, 64, D) copies",
}


# ----------------------------------------------------------------------------------------------
# torch_intra_triton_inter: PyTorch for the masked attention term, Triton for q @ h and the sum
# ----------------------------------------------------------------------------------------------
# Expected (unmeasured): the torch intra term costs about the reference's share for it, ~1.0-1.4 ms
# on case 1 (fp32 copies ~0.6 GB+, two fp32 batched matmuls of 4.3 GFLOP each, the 64 MB score and
# decay matrices), the Triton kernel ~0.1 ms (reads q, h and the 128 MB fp32 term): ~1.6-2.3x.


def render_torch_intra(v: Values) -> str:
    exp, to_arg = _gate(v)
    form = v["intra_form"]
    body = f'''@triton.jit
def gdn_inter_kernel(
{SIGNATURE}
    x_ptr,  # (B, NT, 64, H, V) fp32 intra-chunk term from torch (any strides)
    stride_xb, stride_xn, stride_xi, stride_xh, stride_xv,
    # meta-parameters
    BT: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """o = scale * (exp(g) * (q @ h) + x) for a (BT, BLOCK_V) tile; x is the torch intra term."""
    # ---- map program to (V block, chunk, batch * head) ---------------------------------------
    pid_v = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_bh = tl.program_id(2)
{BASES}    offs_t = pid_n * BT + tl.arange(0, BT)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    t_mask = offs_t < T
    v_mask = offs_v < V

    # ---- inter-chunk part q @ h on tensor cores, fp32 accumulate over K ------------------------
    acc = tl.zeros((BT, BLOCK_V), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        q = tl.load(q_base + offs_t[:, None] * stride_qt + offs_k[None, :], mask=t_mask[:, None] & (offs_k[None, :] < K), other=0.0)
        hh = tl.load(h_base + offs_k[:, None] * stride_hk + offs_v[None, :], mask=(offs_k[:, None] < K) & v_mask[None, :], other=0.0)
        acc = tl.dot(q, hh, acc)
    g = tl.load(g_base + offs_t * stride_gt, mask=t_mask, other=0.0){to_arg}

    # ---- add the torch intra-chunk term (padded to whole chunks) and write back ----------------
    rows = tl.arange(0, BT)
    x_base = x_ptr + off_b * stride_xb + pid_n * stride_xn + off_h * stride_xh
    x = tl.load(x_base + rows[:, None] * stride_xi + offs_v[None, :] * stride_xv, mask=v_mask[None, :], other=0.0)
    out = (acc * {exp}(g)[:, None] + x) * scale
    tl.store(o_base + offs_t[:, None] * stride_ot + offs_v[None, :], out.to(tl.bfloat16), mask=t_mask[:, None] & v_mask[None, :])


def custom_kernel(data):
    """torch computes the gated causal intra-chunk term ({form}, fp32); Triton adds q @ h."""
{CHECK_SHAPES}
    # ---- intra-chunk term in PyTorch: materialised (B, NT, H, 64, 64) gated scores -------------
{_torch_chunks(form)}{_torch_intra(form)}
    # ---- inter-chunk term, gate, sum and scale in one Triton kernel ------------------------------
    o = torch.empty_like(v)
    BLOCK_K, BLOCK_V = {v["BLOCK_K"]}, {v["BLOCK_V"]}
    gdn_inter_kernel[(triton.cdiv(V, BLOCK_V), NT, B * H)](
        q, k, v, h, g, o,
        T, H, K, V, scale,
        {LAUNCH_STRIDES}
        intra, intra.stride(0), intra.stride(1), intra.stride(2), intra.stride(3), intra.stride(4),
        BT=64, BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V, num_warps={v["NUM_WARPS"]}, num_stages={v["NUM_STAGES"]},
    )
    return o
'''
    changes = (
        "Partial PyTorch fallback, the mirror image of torch_inter_triton_intra: the intra-chunk "
        "masked attention term (scores q k^T, decay exp(g_i - g_j) under the causal mask, times v) "
        f"runs in torch ({TORCH_FORM_NOTES[form]}) through an fp32 (B, NT, H, 64, 64) score matrix "
        "and an fp32 (B, NT, 64, H, V) temporary; one Triton kernel computes q @ h on tensor "
        f"cores, applies exp(g) ({exp}), adds the temporary, scales and writes o."
    )
    return module(TASK, "torch_intra_triton_inter", TORCH_INTRA.summary, changes, v, body)


TORCH_INTRA = family(
    TASK,
    "torch_intra_triton_inter",
    "torch fp32 for the gated intra-chunk attention term, Triton kernel for q @ h and the sum",
    {
        "BLOCK_K": (16, 32, 64, 128),
        "BLOCK_V": (16, 32, 64, 128),
        "NUM_WARPS": (2, 4, 8),
        "NUM_STAGES": (1, 2, 3),
        "gate": ("exp", "exp2"),
        "intra_form": TORCH_FORMS,
    },
    render_torch_intra,
    lambda v: (
        v["NUM_STAGES"] * (BT * v["BLOCK_K"] + v["BLOCK_K"] * v["BLOCK_V"]) * 2 <= SMEM_LIMIT
        # the q @ h accumulator and the loaded torch term: 256 per thread spilled on sm_90
        and acc_regs(2 * BT * v["BLOCK_V"], v["NUM_WARPS"]) <= MAX_ACC_REGS // 2
    ),
)


# ----------------------------------------------------------------------------------------------
# torch_terms_triton_gate: both terms in PyTorch fp32, Triton fuses only the gated epilogue
# ----------------------------------------------------------------------------------------------
# Expected (unmeasured): the reference minus its fp32 scale pass, final add, reshape and cast
# (~0.3-0.5 GB of its ~5 GB of traffic), plus a Triton epilogue reading two 128 MB fp32 terms
# (~0.07 ms on case 1): ~1.6-2.2 ms against 2.36 ms, ~1.05-1.5x.


def render_torch_terms(v: Values) -> str:
    exp, to_arg = _gate(v)
    form = v["torch_form"]
    body = f'''@triton.jit
def gdn_gate_kernel(
    # pointers: the two fp32 terms from torch, indexed (b, n, i, h, v); g (B, T, H) fp32; o (B, T, H, V)
    inter_ptr, intra_ptr, g_ptr, o_ptr,
    # sizes and the attention scale
    T, H, V, scale,
    # strides, in elements
    stride_ib, stride_in, stride_ii, stride_ih, stride_iv,
    stride_ab, stride_an, stride_ai, stride_ah, stride_av,
    stride_gb, stride_gt, stride_gh, stride_ob, stride_ot, stride_oh,
    # meta-parameters
    BT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """o = scale * (exp(g) * inter + intra) for BLOCK_T rows and BLOCK_V columns of one chunk."""
    # ---- map program to (V block, chunk and row block, batch * head) ---------------------------
    pid_v = tl.program_id(0)
    pid_n = tl.program_id(1) // (BT // BLOCK_T)
    sub = tl.program_id(1) % (BT // BLOCK_T)
    pid_bh = tl.program_id(2)
    off_b = pid_bh // H
    off_h = pid_bh % H
    rows = sub * BLOCK_T + tl.arange(0, BLOCK_T)  # rows inside the chunk
    offs_t = pid_n * BT + rows
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    t_mask = offs_t < T
    mask = t_mask[:, None] & (offs_v[None, :] < V)

    # ---- load both terms and the gate, combine in fp32, write bf16 ------------------------------
    inter = tl.load(inter_ptr + off_b * stride_ib + pid_n * stride_in + off_h * stride_ih + rows[:, None] * stride_ii + offs_v[None, :] * stride_iv, mask=mask, other=0.0)
    intra = tl.load(intra_ptr + off_b * stride_ab + pid_n * stride_an + off_h * stride_ah + rows[:, None] * stride_ai + offs_v[None, :] * stride_av, mask=mask, other=0.0)
    g = tl.load(g_ptr + off_b * stride_gb + offs_t * stride_gt + off_h * stride_gh, mask=t_mask, other=0.0){to_arg}
    out = (inter * {exp}(g)[:, None] + intra) * scale
    tl.store(o_ptr + off_b * stride_ob + offs_t[:, None] * stride_ot + off_h * stride_oh + offs_v[None, :], out.to(tl.bfloat16), mask=mask)


def custom_kernel(data):
    """torch computes both terms in fp32 ({form}); one Triton kernel gates, sums, scales, casts."""
{CHECK_SHAPES}
    # ---- both terms in PyTorch fp32 ---------------------------------------------------------------
{_torch_chunks(form)}{_torch_inter(form)}{_torch_intra(form)}
    # ---- fused epilogue: gate the inter-chunk term, add, scale, cast -----------------------------
    o = torch.empty_like(v)
    BLOCK_T, BLOCK_V = {v["BLOCK_T"]}, {v["BLOCK_V"]}
    gdn_gate_kernel[(triton.cdiv(V, BLOCK_V), NT * (64 // BLOCK_T), B * H)](
        inter, intra, g, o,
        T, H, V, scale,
        inter.stride(0), inter.stride(1), inter.stride(2), inter.stride(3), inter.stride(4),
        intra.stride(0), intra.stride(1), intra.stride(2), intra.stride(3), intra.stride(4),
        g.stride(0), g.stride(1), g.stride(2), o.stride(0), o.stride(1), o.stride(2),
        BT=64, BLOCK_T=BLOCK_T, BLOCK_V=BLOCK_V, num_warps={v["NUM_WARPS"]},
    )
    return o
'''
    changes = (
        "Mostly PyTorch: both the inter-chunk product q @ h and the gated causal intra-chunk term "
        f"run in torch fp32 ({TORCH_FORM_NOTES[form]}), each into an fp32 (B, NT, 64, H, V) "
        "temporary; only the epilogue is a Triton kernel, which applies exp(g) to the inter-chunk "
        f"term ({exp}), adds the intra-chunk term, scales and casts to bf16 in one pass (the "
        "reference spends three passes and a reshape copy on that)."
    )
    return module(TASK, "torch_terms_triton_gate", TORCH_TERMS.summary, changes, v, body)


TORCH_TERMS = family(
    TASK,
    "torch_terms_triton_gate",
    "both terms in torch fp32, a Triton kernel for the gate, sum, scale and cast",
    {
        "BLOCK_T": (16, 32, 64),
        "BLOCK_V": (32, 64, 128),
        "NUM_WARPS": (2, 4, 8),
        "gate": ("exp", "exp2"),
        "torch_form": TORCH_FORMS,
    },
    render_torch_terms,
    # two fp32 tiles per thread; 256 spilled on sm_90
    lambda v: acc_regs(2 * v["BLOCK_T"] * v["BLOCK_V"], v["NUM_WARPS"]) <= MAX_ACC_REGS // 2,
)


FAMILIES = (FUSED, SUB, TWO, TORCH, TOKEN, FMA, CAPPED, TORCH_INTRA, TORCH_TERMS)

# The seed kernel: the fused chunk kernel with fla's mid-sized tiles.
SEED = (
    "fused_chunk",
    {
        "BLOCK_K": 64,
        "BLOCK_V": 64,
        "NUM_WARPS": 4,
        "NUM_STAGES": 2,
        "gate": "exp",
        "a_dtype": "bf16",
        "scale_at": "output",
    },
)
