"""Kernel families of `causal_attention`: softmax(q k^T / sqrt(D), causal) v on (B, H, S, D) bf16.

From slowest to fastest, roughly: one program per query row with a scalar key loop (CUDA cores),
small blocked CUDA-core tiles, flash loops on fp32-upcast operands (tf32 / ieee), materialised
scores in global memory (three kernels), cuBLAS matmuls around one fused Triton softmax, flash
attention without causal block skipping, and flash attention with online softmax and causal
block skipping on bf16 tensor cores.
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

TASK = "causal_attention"
Values = Mapping[str, Any]
D_MAX = 128  # largest head dimension among the benchmark cases; resource estimates assume it
LOG2E = 1.4426950408889634

SIGNATURE = """    # pointers
    q_ptr, k_ptr, v_ptr, o_ptr,
    # sizes; qk_scale already folds 1/sqrt(D) (and log2(e) when exp2 is used)
    H, S, qk_scale,
    # strides, in elements: batch, head, sequence (the head dimension is contiguous)
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os,"""

LAUNCH_ARGS = """q, k, v, o,
        H, S, qk_scale,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),"""

CHECK_SHAPES = """    q, k, v = data
    B, H, S, D = q.shape
    assert k.shape == v.shape == q.shape, "q, k, v are (B, H, S, D)"
    assert D in (16, 32, 64, 128, 256), "head dimension must be a power of two >= 16"
    assert q.stride(3) == k.stride(3) == v.stride(3) == 1, "head dimension must be contiguous\""""

HEAD_BASES = """    pid_bh = tl.program_id(1)
    off_b = pid_bh // H
    off_h = pid_bh % H
    q_base = q_ptr + off_b * stride_qb + off_h * stride_qh
    k_base = k_ptr + off_b * stride_kb + off_h * stride_kh
    v_base = v_ptr + off_b * stride_vb + off_h * stride_vh
    o_base = o_ptr + off_b * stride_ob + off_h * stride_oh
"""


def _upcast_ok(v: Values) -> bool:
    """fp32 Q, K, V tiles sit in registers next to S and the accumulator: keep the sum <= 128 a
    thread (BLOCK_M=128 with ieee dots spills 1900-3300 registers on sm_90)."""
    tiles = v["BLOCK_M"] * v["BLOCK_N"] + (v["BLOCK_M"] + v["BLOCK_N"]) * D_MAX
    return _flash_ok(v) and acc_regs(tiles, v["NUM_WARPS"]) <= 128


def _flash_ok(v: Values) -> bool:
    """Q tile + pipelined K and V tiles fit shared memory; S and acc tiles fit registers (D=128)."""
    elem = 4 if "precision" in v else 2
    smem = (v["BLOCK_M"] * D_MAX + v["NUM_STAGES"] * 2 * v["BLOCK_N"] * D_MAX) * elem
    regs = acc_regs(v["BLOCK_M"] * v["BLOCK_N"] + v["BLOCK_M"] * D_MAX, v["NUM_WARPS"])
    return (
        smem <= SMEM_LIMIT
        and regs <= MAX_ACC_REGS
        and v["BLOCK_M"] * v["BLOCK_N"] >= 16 * 16 * v["NUM_WARPS"] // 2
    )


# ----------------------------------------------------------------------------------------------
# flash attention: one generator, three families (causal skipping, full scan, fp32 upcast)
# ----------------------------------------------------------------------------------------------


def _flash_source(v: Values, algorithm: str, summary: str) -> str:
    causal = v.get("mask", "full_scan")
    exp = "tl.exp2" if v.get("softmax_base", "exp2") == "exp2" else "tl.exp"
    scale_expr = f"D ** -0.5 * {LOG2E}" if exp == "tl.exp2" else "D ** -0.5"
    precision = v.get("precision")
    k_access = v.get("k_access", "transposed_load")
    if k_access == "transposed_load":
        k_load = (
            "        # K^T tile (D, BLOCK_N) loaded directly in transposed layout\n"
            "        k = tl.load(k_base + offs_n[None, :] * stride_ks + offs_d[:, None]"
            + (", mask=offs_n[None, :] < S, other=0.0)\n" if True else ")\n")
        )
        kt = "k"
    else:
        k_load = (
            "        # K tile (BLOCK_N, D) in row layout, transposed in registers\n"
            "        k = tl.load(k_base + offs_n[:, None] * stride_ks + offs_d[None, :], mask=offs_n[:, None] < S, other=0.0)\n"
        )
        kt = "tl.trans(k)"
    if precision is None:
        qk = f"        qk = tl.dot(q, {kt}) * qk_scale  # (BLOCK_M, BLOCK_N) fp32 on bf16 tensor cores\n"
        pv = "        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)  # bf16 P @ V, fp32 acc\n"
    else:
        qk = (
            f"        # fp32 operands: {precision} dot instead of bf16 tensor cores\n"
            f'        qk = tl.dot(q.to(tl.float32), {kt}.to(tl.float32), input_precision="{precision}") * qk_scale\n'
        )
        pv = f'        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="{precision}")\n'
    if v.get("schedule", "in_order") == "heavy_first":
        pid_m = "    # heavy-first: the last query blocks see the most keys, so they start first\n    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)\n"
    else:
        pid_m = "    pid_m = tl.program_id(0)\n"
    if causal == "split_diagonal":
        loops = """    # ---- off-diagonal key blocks: every key is visible to every row, no mask ----------------
    m0 = pid_m * BLOCK_M
    unmasked_end = ((m0 + 1) // BLOCK_N) * BLOCK_N  # blocks entirely at or below row m0
    acc, l_i, m_i = _attn_blocks(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d,
                                 0, unmasked_end, S, qk_scale, D=D, BLOCK_N=BLOCK_N, MASKED=False)
    # ---- diagonal key blocks: causal mask; blocks above the diagonal are skipped ------------
    hi = tl.minimum(m0 + BLOCK_M, S)
    acc, l_i, m_i = _attn_blocks(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d,
                                 unmasked_end, hi, S, qk_scale, D=D, BLOCK_N=BLOCK_N, MASKED=True)
"""
    elif causal == "mask_each_block":
        loops = """    # ---- key blocks up to the diagonal, each masked (simple, but masks off-diagonal blocks too) --
    hi = tl.minimum(pid_m * BLOCK_M + BLOCK_M, S)
    acc, l_i, m_i = _attn_blocks(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d,
                                 0, hi, S, qk_scale, D=D, BLOCK_N=BLOCK_N, MASKED=True)
"""
    else:
        loops = """    # ---- every key block, no causal skipping: blocks above the diagonal are computed and masked --
    acc, l_i, m_i = _attn_blocks(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d,
                                 0, S, S, qk_scale, D=D, BLOCK_N=BLOCK_N, MASKED=True)
"""
    body = f'''@triton.jit
def _attn_blocks(
    acc, l_i, m_i,  # running (BLOCK_M, D) output, row sums and row maxima, fp32
    q,  # (BLOCK_M, D) query tile, bf16
    k_base, v_base, stride_ks, stride_vs,  # this head's K and V
    offs_m, offs_d,  # query rows and head-dimension offsets
    lo, hi, S, qk_scale,  # key range [lo, hi), sequence length, folded scale
    D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
):
    """Online softmax over key blocks [lo, hi): rescale the running sums when the max grows."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
{k_load}{qk}        if MASKED:
            # causal mask (key <= query); also hides keys past the end of the sequence
            qk = tl.where(offs_m[:, None] >= offs_n[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = {exp}(qk - m_new[:, None])
        alpha = {exp}(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None] * stride_vs + offs_d[None, :], mask=offs_n[:, None] < S, other=0.0)
{pv}        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attention_fwd_kernel(
{SIGNATURE}
    # meta-parameters
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program computes BLOCK_M query rows of one (batch, head); scores never leave the chip."""
    # ---- map program to (query block, batch * head) ----------------------------------------
{pid_m}{HEAD_BASES}
    # ---- load the query tile once -----------------------------------------------------------
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(q_base + offs_m[:, None] * stride_qs + offs_d[None, :], mask=offs_m[:, None] < S, other=0.0)

    # ---- accumulate in fp32 with a running max and sum ---------------------------------------
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
{loops}
    # ---- normalise and masked write-back ----------------------------------------------------
    out = acc / l_i[:, None]
    tl.store(o_base + offs_m[:, None] * stride_os + offs_d[None, :], out.to(tl.bfloat16), mask=offs_m[:, None] < S)


def custom_kernel(data):
    """Causal attention in one launch: {v["BLOCK_M"]} query rows x {v["BLOCK_N"]} keys per step."""
{CHECK_SHAPES}
    o = torch.empty_like(q)
    BLOCK_M, BLOCK_N = {v["BLOCK_M"]}, {v["BLOCK_N"]}
    qk_scale = {scale_expr}
    grid = (triton.cdiv(S, BLOCK_M), B * H)
    attention_fwd_kernel[grid](
        {LAUNCH_ARGS}
        D=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        num_warps={v["NUM_WARPS"]}, num_stages={v["NUM_STAGES"]},
    )
    return o
'''
    parts = {
        "split_diagonal": "Causal block skipping: key blocks above the diagonal are never visited, and "
        "off-diagonal blocks run without a mask (the mask only touches the diagonal blocks).",
        "mask_each_block": "Causal block skipping, but every visited key block is masked (simpler loop, "
        "extra selects on the off-diagonal blocks).",
        "full_scan": "No causal block skipping: every program walks all key blocks and masks the upper "
        "triangle, doing about twice the useful work.",
    }
    changes = (
        "Flash-attention forward: scores stay in registers, softmax is computed online with a running "
        f"max and sum in fp32 ({exp} with a folded scale). " + parts[causal]
    )
    if precision is not None:
        changes += (
            f" Operands are upcast to fp32 and multiplied with input_precision={precision!r}."
        )
    if k_access != "transposed_load":
        changes += " K is loaded row-major and transposed in registers."
    if v.get("schedule") == "heavy_first":
        changes += " Query blocks are scheduled heaviest (last) first to balance the causal work."
    return module(TASK, algorithm, summary, changes, v, body)


def render_flash_causal(v: Values) -> str:
    return _flash_source(v, "flash_causal", FLASH.summary)


def render_flash_full_scan(v: Values) -> str:
    return _flash_source(v, "flash_full_scan", FULL_SCAN.summary)


def render_flash_fp32_upcast(v: Values) -> str:
    return _flash_source(
        dict(v, mask="split_diagonal"), "flash_fp32_upcast", UPCAST.summary
    ).replace("    mask = 'split_diagonal'\n", "")


FLASH = family(
    TASK,
    "flash_causal",
    "flash attention, online softmax on bf16 tensor cores, causal block skipping",
    {
        "BLOCK_M": (16, 32, 64, 128, 256),
        "BLOCK_N": (16, 32, 64, 128),
        "NUM_WARPS": (2, 4, 8),
        "NUM_STAGES": (1, 2, 3, 4),
        "mask": ("split_diagonal", "mask_each_block"),
        "softmax_base": ("exp2", "exp"),
        "schedule": ("in_order", "heavy_first"),
        "k_access": ("transposed_load", "trans_in_register"),
    },
    render_flash_causal,
    _flash_ok,
)

FULL_SCAN = family(
    TASK,
    "flash_full_scan",
    "flash attention without causal block skipping (all key blocks, masked)",
    {
        "BLOCK_M": (16, 32, 64, 128),
        "BLOCK_N": (16, 32, 64, 128),
        "NUM_WARPS": (2, 4, 8),
        "NUM_STAGES": (1, 2, 3),
        "softmax_base": ("exp2", "exp"),
    },
    render_flash_full_scan,
    _flash_ok,
)

UPCAST = family(
    TASK,
    "flash_fp32_upcast",
    "flash attention on fp32-upcast operands (tf32, 3xtf32 or ieee dots)",
    {
        "BLOCK_M": (16, 32, 64, 128),
        "BLOCK_N": (16, 32, 64),
        "NUM_WARPS": (4, 8),
        "NUM_STAGES": (1, 2, 3),
        "precision": ("tf32", "tf32x3", "ieee"),
    },
    render_flash_fp32_upcast,
    _upcast_ok,
)


# ----------------------------------------------------------------------------------------------
# materialised_scores: QK^T to global memory, a row softmax kernel, then P @ V
# ----------------------------------------------------------------------------------------------


def render_materialised_scores(v: Values) -> str:
    sdt = "tl.float32" if v["scores_dtype"] == "fp32" else "tl.bfloat16"
    torch_sdt = "torch.float32" if v["scores_dtype"] == "fp32" else "torch.bfloat16"
    body = f'''@triton.jit
def qk_scores_kernel(
    # pointers: q, k (B, H, S, D); scores (B*H, S, S) scratch
    q_ptr, k_ptr, s_ptr,
    # sizes
    H, S, sm_scale,
    # strides, in elements
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
    # meta-parameters
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Pass 1: one (BLOCK_M, BLOCK_N) tile of scaled scores, only tiles on or below the diagonal."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_bh = tl.program_id(2)
    if pid_n * BLOCK_N <= pid_m * BLOCK_M + BLOCK_M - 1:
        off_b = pid_bh // H
        off_h = pid_bh % H
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, D)
        q = tl.load(q_ptr + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                    mask=offs_m[:, None] < S, other=0.0)
        k = tl.load(k_ptr + off_b * stride_kb + off_h * stride_kh + offs_n[None, :] * stride_ks + offs_d[:, None],
                    mask=offs_n[None, :] < S, other=0.0)
        scores = tl.dot(q, k) * sm_scale  # fp32
        s_ptrs = s_ptr + pid_bh * S * S + offs_m[:, None] * S + offs_n[None, :]
        tl.store(s_ptrs, scores.to({sdt}), mask=(offs_m[:, None] < S) & (offs_n[None, :] < S))


@triton.jit
def causal_softmax_kernel(
    s_ptr, p_ptr,  # pointers: scores (B*H, S, S) in, probabilities (B*H, S, S) bf16 out
    S,  # sequence length
    ROWS: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """Pass 2: ROWS full rows per program; keys after the query get probability 0."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_S)
    base = tl.program_id(1) * S * S + rows[:, None] * S + cols[None, :]
    visible = (cols[None, :] <= rows[:, None]) & (rows[:, None] < S)
    x = tl.load(s_ptr + base, mask=visible, other=float("-inf")).to(tl.float32)
    x = x - tl.max(x, 1)[:, None]
    num = tl.exp(x)
    p = num / tl.sum(num, 1)[:, None]
    tl.store(p_ptr + base, p.to(tl.bfloat16), mask=(rows[:, None] < S) & (cols[None, :] < S))


@triton.jit
def pv_kernel(
    # pointers: probabilities (B*H, S, S) bf16, v and o (B, H, S, D)
    p_ptr, v_ptr, o_ptr,
    # sizes
    H, S,
    # strides, in elements
    stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os,
    # meta-parameters
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Pass 3: O = P @ V for BLOCK_M rows, over key blocks up to the diagonal."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = pid_bh // H
    off_h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    for start_n in range(0, tl.minimum(pid_m * BLOCK_M + BLOCK_M, S), BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        p = tl.load(p_ptr + pid_bh * S * S + offs_m[:, None] * S + offs_n[None, :],
                    mask=(offs_m[:, None] < S) & (offs_n[None, :] < S), other=0.0)
        v = tl.load(v_ptr + off_b * stride_vb + off_h * stride_vh + offs_n[:, None] * stride_vs + offs_d[None, :],
                    mask=offs_n[:, None] < S, other=0.0)
        acc = tl.dot(p, v, acc)
    o_ptrs = o_ptr + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :]
    tl.store(o_ptrs, acc.to(tl.bfloat16), mask=offs_m[:, None] < S)


def custom_kernel(data):
    """Three passes through global memory: scores ({v["scores_dtype"]}), softmax, P @ V."""
{CHECK_SHAPES}
    scores = torch.empty((B * H, S, S), device=q.device, dtype={torch_sdt})  # O(S^2) scratch
    probs = torch.empty((B * H, S, S), device=q.device, dtype=torch.bfloat16)
    o = torch.empty_like(q)
    BLOCK_M, BLOCK_N, ROWS = {v["BLOCK_M"]}, {v["BLOCK_N"]}, {v["ROWS"]}
    qk_scores_kernel[(triton.cdiv(S, BLOCK_M), triton.cdiv(S, BLOCK_N), B * H)](
        q, k, scores, H, S, D ** -0.5,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        D=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps={v["NUM_WARPS"]}, num_stages={v["NUM_STAGES"]},
    )
    causal_softmax_kernel[(triton.cdiv(S, ROWS), B * H)](
        scores, probs, S, ROWS=ROWS, BLOCK_S=triton.next_power_of_2(S), num_warps={v["NUM_WARPS"]},
    )
    pv_kernel[(triton.cdiv(S, BLOCK_M), B * H)](
        probs, v, o, H, S,
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        D=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps={v["NUM_WARPS"]}, num_stages={v["NUM_STAGES"]},
    )
    return o
'''
    changes = (
        f"Materialised scores: pass 1 writes the scaled lower-triangle score tiles to a {v['scores_dtype']} "
        "(B*H, S, S) buffer, pass 2 runs a causal row softmax into a bf16 probability buffer, pass 3 "
        "multiplies P @ V with tensor cores. O(S^2) bytes go through global memory, but fewer passes "
        "than the reference and the upper triangle is skipped."
    )
    return module(TASK, "materialised_scores", MATERIALISED.summary, changes, v, body)


MATERIALISED = family(
    TASK,
    "materialised_scores",
    "scores and probabilities materialised in global memory, three Triton kernels",
    {
        "BLOCK_M": (16, 32, 64, 128),
        "BLOCK_N": (16, 32, 64, 128),
        "NUM_WARPS": (2, 4, 8),
        "NUM_STAGES": (1, 2, 3),
        "ROWS": (1, 2, 4),
        "scores_dtype": ("fp32", "bf16"),
    },
    render_materialised_scores,
    lambda v: (
        acc_regs(v["BLOCK_M"] * v["BLOCK_N"] + v["BLOCK_M"] * D_MAX, v["NUM_WARPS"]) <= MAX_ACC_REGS
        and acc_regs(v["ROWS"] * 4096, v["NUM_WARPS"]) <= MAX_ACC_REGS
    ),
)


# ----------------------------------------------------------------------------------------------
# cublas_triton_softmax: partial PyTorch fallback around one fused Triton softmax
# ----------------------------------------------------------------------------------------------


def render_cublas_triton_softmax(v: Values) -> str:
    exp = "tl.exp2" if v["softmax_base"] == "exp2" else "tl.exp"
    scale = f"D ** -0.5 * {LOG2E}" if v["softmax_base"] == "exp2" else "D ** -0.5"
    dst = "scores" if v["output"] == "in_place" else "probs"
    alloc = (
        "probs = scores  # overwritten in place"
        if v["output"] == "in_place"
        else "probs = torch.empty_like(scores)"
    )
    body = f'''@triton.jit
def scale_mask_softmax_kernel(
    s_ptr, p_ptr,  # pointers: bf16 scores (B*H, S, S) from cuBLAS, bf16 probabilities out
    S, scale,  # sequence length; 1/sqrt(D){" * log2(e)" if exp == "tl.exp2" else ""}
    ROWS: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """Scale, causal mask and softmax fused in one pass over ROWS rows (fp32 math)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_S)
    base = tl.program_id(1) * S * S + rows[:, None] * S + cols[None, :]
    visible = (cols[None, :] <= rows[:, None]) & (rows[:, None] < S)
    x = tl.load(s_ptr + base, mask=visible, other=float("-inf")).to(tl.float32) * scale
    x = x - tl.max(x, 1)[:, None]
    num = {exp}(x)
    p = num / tl.sum(num, 1)[:, None]
    tl.store(p_ptr + base, p.to(tl.bfloat16), mask=(rows[:, None] < S) & (cols[None, :] < S))


def custom_kernel(data):
    """cuBLAS for both matmuls, one Triton pass for scale + mask + softmax."""
{CHECK_SHAPES}
    scores = torch.matmul(q, k.transpose(-2, -1)).view(B * H, S, S)  # bf16 (B*H, S, S)
    {alloc}
    ROWS = {v["ROWS"]}
    scale_mask_softmax_kernel[(triton.cdiv(S, ROWS), B * H)](
        scores, {dst}, S, {scale}, ROWS=ROWS, BLOCK_S=triton.next_power_of_2(S), num_warps={v["NUM_WARPS"]},
    )
    return torch.matmul(probs.view(B, H, S, S), v)
'''
    changes = (
        "Partial PyTorch fallback: cuBLAS computes q @ k^T and P @ v in bf16; one fused Triton "
        f"kernel replaces the reference's separate scale, mask, softmax and cast passes ({exp}, "
        f"{v['output'].replace('_', ' ')} output, {v['ROWS']} row(s) per program)."
    )
    return module(TASK, "cublas_triton_softmax", CUBLAS.summary, changes, v, body)


CUBLAS = family(
    TASK,
    "cublas_triton_softmax",
    "torch.matmul for both products, one fused scale+mask+softmax Triton kernel",
    {
        "ROWS": (1, 2, 4, 8),
        "NUM_WARPS": (1, 2, 4, 8, 16),
        "softmax_base": ("exp2", "exp"),
        "output": ("new_buffer", "in_place"),
    },
    render_cublas_triton_softmax,
    lambda v: acc_regs(v["ROWS"] * 4096, v["NUM_WARPS"]) <= MAX_ACC_REGS,
)


# ----------------------------------------------------------------------------------------------
# row_scalar_loop: one program per query row, keys in small groups, CUDA cores only
# ----------------------------------------------------------------------------------------------


def render_row_scalar_loop(v: Values) -> str:
    hi = "row + 1  # causal: only keys 0..row" if v["causal"] == "skip" else "S  # all keys, masked"
    score = """            kk = tl.load(k_base + offs_n[:, None] * stride_ks + offs_d[None, :], mask=offs_n[:, None] < S, other=0.0)
            s = tl.sum(q[None, :] * kk.to(tl.float32), 1) * qk_scale  # (KEYS,) dot products on CUDA cores
            s = tl.where((offs_n <= row) & (offs_n < S), s, float("-inf"))
"""
    if v["softmax"] == "online":
        loop = f"""    # ---- one pass: online softmax over groups of KEYS keys --------------------------------
    for start_n in range(0, hi, KEYS):
        if True:
            offs_n = start_n + tl.arange(0, KEYS)
{score}            m_new = tl.maximum(m_i, tl.max(s, 0))
            p = tl.exp(s - m_new)
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 0)
            vv = tl.load(v_base + offs_n[:, None] * stride_vs + offs_d[None, :], mask=offs_n[:, None] < S, other=0.0)
            acc = acc * alpha + tl.sum(p[:, None] * vv.to(tl.float32), 0)
            m_i = m_new
"""
    else:
        loop = f"""    # ---- pass 1: row max and normaliser ---------------------------------------------------
    for start_n in range(0, hi, KEYS):
        if True:
            offs_n = start_n + tl.arange(0, KEYS)
{score}            m_new = tl.maximum(m_i, tl.max(s, 0))
            l_i = l_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(s - m_new), 0)
            m_i = m_new
    # ---- pass 2: recompute the scores, accumulate normalised probabilities times V ----------
    for start_n in range(0, hi, KEYS):
        if True:
            offs_n = start_n + tl.arange(0, KEYS)
{score}            p = tl.exp(s - m_i)
            vv = tl.load(v_base + offs_n[:, None] * stride_vs + offs_d[None, :], mask=offs_n[:, None] < S, other=0.0)
            acc = acc + tl.sum(p[:, None] * vv.to(tl.float32), 0)
"""
    loop = loop.replace("        if True:\n", "").replace("\n            ", "\n        ")
    body = f'''@triton.jit
def attention_row_kernel(
{SIGNATURE}
    # meta-parameters
    D: tl.constexpr, KEYS: tl.constexpr,
):
    """One program per (query row, batch * head); KEYS keys per loop step, fp32 CUDA-core math."""
    # ---- map program to (row, batch * head) ------------------------------------------------
    row = tl.program_id(0)
{HEAD_BASES}    offs_d = tl.arange(0, D)
    q = tl.load(q_base + row * stride_qs + offs_d).to(tl.float32)  # (D,)

    # ---- running max / sum as 0-d fp32 tensors, accumulator (D,) -----------------------------
    m_i = tl.max(tl.full((KEYS,), float("-inf"), tl.float32), 0)
    l_i = tl.sum(tl.zeros((KEYS,), tl.float32), 0)
    acc = tl.zeros((D,), tl.float32)
    hi = {hi}
{loop}
    # ---- normalise and write the row -----------------------------------------------------------
    tl.store(o_base + row * stride_os + offs_d, (acc / l_i).to(tl.bfloat16))


def custom_kernel(data):
    """Row-at-a-time causal attention, {v["KEYS"]} keys per step."""
{CHECK_SHAPES}
    o = torch.empty_like(q)
    KEYS = {v["KEYS"]}
    qk_scale = D ** -0.5
    attention_row_kernel[(S, B * H)](
        {LAUNCH_ARGS}
        D=D, KEYS=KEYS, num_warps={v["NUM_WARPS"]},
    )
    return o
'''
    changes = (
        "Naive: one program per query row, looping over keys KEYS at a time with dot products "
        "reduced by tl.sum on CUDA cores (no tensor cores, no reuse of K/V across rows). "
        + (
            "Keys after the row are skipped. "
            if v["causal"] == "skip"
            else "All S keys are visited and masked. "
        )
        + (
            "Online softmax in one pass."
            if v["softmax"] == "online"
            else "Two passes: statistics, then recomputed scores times V."
        )
    )
    return module(TASK, "row_scalar_loop", ROW.summary, changes, v, body)


ROW = family(
    TASK,
    "row_scalar_loop",
    "one program per query row, scalar-ish key loop on CUDA cores",
    {
        "KEYS": (2, 4, 8, 16, 32, 64),
        "NUM_WARPS": (1, 2, 4, 8),
        "causal": ("skip", "full_scan"),
        "softmax": ("online", "two_pass"),
    },
    render_row_scalar_loop,
    lambda v: acc_regs(v["KEYS"] * D_MAX, v["NUM_WARPS"]) <= MAX_ACC_REGS,
)


# ----------------------------------------------------------------------------------------------
# cuda_core_blocked: flash-style blocks with broadcast products instead of tl.dot
# ----------------------------------------------------------------------------------------------


def render_cuda_core_blocked(v: Values) -> str:
    exp = "tl.exp2" if v["softmax_base"] == "exp2" else "tl.exp"
    scale = f"D ** -0.5 * {LOG2E}" if exp == "tl.exp2" else "D ** -0.5"
    hi = (
        "tl.minimum(pid_m * BLOCK_M + BLOCK_M, S)  # causal block skipping"
        if v["causal"] == "skip"
        else "S  # every key block"
    )
    body = f'''@triton.jit
def attention_fma_kernel(
{SIGNATURE}
    # meta-parameters
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Flash-style blocks whose products are (BLOCK_M, BLOCK_N, D) broadcasts reduced by tl.sum."""
    # ---- map program to (query block, batch * head) ----------------------------------------
    pid_m = tl.program_id(0)
{HEAD_BASES}
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(q_base + offs_m[:, None] * stride_qs + offs_d[None, :], mask=offs_m[:, None] < S, other=0.0).to(tl.float32)

    # ---- accumulate in fp32 on CUDA cores with an online softmax ------------------------------
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    hi = {hi}
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kk = tl.load(k_base + offs_n[:, None] * stride_ks + offs_d[None, :], mask=offs_n[:, None] < S, other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * kk[None, :, :], 2) * qk_scale  # (BLOCK_M, BLOCK_N)
        s = tl.where(offs_m[:, None] >= offs_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = {exp}(s - m_new[:, None])
        alpha = {exp}(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        vv = tl.load(v_base + offs_n[:, None] * stride_vs + offs_d[None, :], mask=offs_n[:, None] < S, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * vv[None, :, :], 1)
        m_i = m_new

    # ---- normalise and masked write-back ----------------------------------------------------
    out = acc / l_i[:, None]
    tl.store(o_base + offs_m[:, None] * stride_os + offs_d[None, :], out.to(tl.bfloat16), mask=offs_m[:, None] < S)


def custom_kernel(data):
    """Blocked causal attention on CUDA cores ({v["BLOCK_M"]}x{v["BLOCK_N"]} blocks)."""
{CHECK_SHAPES}
    o = torch.empty_like(q)
    BLOCK_M, BLOCK_N = {v["BLOCK_M"]}, {v["BLOCK_N"]}
    qk_scale = {scale}
    attention_fma_kernel[(triton.cdiv(S, BLOCK_M), B * H)](
        {LAUNCH_ARGS}
        D=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps={v["NUM_WARPS"]},
    )
    return o
'''
    changes = (
        "Flash-style online softmax over key blocks, but both products are 3-D broadcasts reduced "
        "with tl.sum in fp32 (CUDA cores, large register tiles) instead of tensor-core dots. "
        + (
            "Key blocks above the diagonal are skipped."
            if v["causal"] == "skip"
            else "All key blocks are visited and masked."
        )
    )
    return module(TASK, "cuda_core_blocked", BLOCKED.summary, changes, v, body)


BLOCKED = family(
    TASK,
    "cuda_core_blocked",
    "flash-style blocks with CUDA-core broadcast products, no tensor cores",
    {
        "BLOCK_M": (4, 8, 16, 32),
        "BLOCK_N": (4, 8, 16, 32),
        "NUM_WARPS": (1, 2, 4, 8),
        "causal": ("skip", "full_scan"),
        "softmax_base": ("exp2", "exp"),
    },
    render_cuda_core_blocked,
    lambda v: (
        acc_regs(v["BLOCK_M"] * v["BLOCK_N"] * D_MAX, v["NUM_WARPS"]) <= MAX_ACC_REGS
        and v["BLOCK_M"] * v["BLOCK_N"] >= 16
    ),
)


FAMILIES = (FLASH, FULL_SCAN, UPCAST, MATERIALISED, CUBLAS, ROW, BLOCKED)

# The seed kernel: a conventional flash-attention configuration.
SEED = (
    "flash_causal",
    {
        "BLOCK_M": 64,
        "BLOCK_N": 64,
        "NUM_WARPS": 4,
        "NUM_STAGES": 2,
        "mask": "split_diagonal",
        "softmax_base": "exp2",
        "schedule": "in_order",
        "k_access": "transposed_load",
    },
)
