"""Kernel families for `trimul`: the AlphaFold3 outgoing triangle multiplicative update.

data = (x (bs, N, N, dim) fp32, mask (bs, N, N), weights, config) -> (bs, N, N, dim) fp32.
Stages: LayerNorm_dim -> five projections (left/right proj and gate, out gate) -> gating and
mask -> triangle contraction out[b,i,j,h] = sum_k left[b,i,k,h] right[b,j,k,h] -> LayerNorm_h
-> out gate -> to_out projection. The reference runs all of it unfused in fp32 without TF32.

    unfused_cuda_core     naive: one kernel per stage, CUDA-core (no tensor core) linears with
                          tiny tiles, fp32 intermediates, outer-product contraction
    fused_outer_product   fused prologue/epilogue on tensor cores, but the contraction as
                          CUDA-core fp32 outer products over k
    torch_proj_dot        partial PyTorch fallback: projections, gating, LayerNorms and to_out
                          in PyTorch, the contraction as a batched tl.dot kernel
    fused_dot             three kernels: LayerNorm + projections + gates + mask fused (tl.dot),
                          the contraction as a grouped tl.dot matmul per (b, h), output
                          LayerNorm + gate + to_out fused (tl.dot)
    fused_dot_split_k     as fused_dot, the contraction split over k with fp32 atomics

Matmul precision knobs: "ieee" (fp32 FMA), "tf32" (fp32 storage, TF32 tensor cores), "bf16" and
"fp16" (half-width storage of the projections, fp32 accumulation); GPU MODE's 2e-2 tolerance
admits all of them. Every render(values) is a standalone module (torch, triton,
triton.language only) defining custom_kernel(data).
"""

from __future__ import annotations

from pipelines.generation.space import Family, Knob, KnobValues

TASK = "trimul"
SMEM_LIMIT = 232448  # bytes of shared memory per block on sm_90
_MAX_ACC_REGS = 128  # fp32 accumulator registers per thread we allow a tile to take

# precision -> (Triton storage dtype, torch storage dtype, tl.dot keyword arguments, bytes)
_PREC = {
    "ieee": ("tl.float32", "torch.float32", ', input_precision="ieee"', 4),
    "tf32": ("tl.float32", "torch.float32", ', input_precision="tf32"', 4),
    "bf16": ("tl.bfloat16", "torch.bfloat16", "", 2),
    "fp16": ("tl.float16", "torch.float16", "", 2),
}
_PREC_DOC = {
    "ieee": "fp32 storage, fp32 FMA dots (input_precision='ieee', no tensor cores)",
    "tf32": "fp32 storage, TF32 tensor-core dots with fp32 accumulation",
    "bf16": "bf16 storage of left/right/out gate and bf16 tensor-core contraction with fp32 "
    "accumulation; the projection and to_out dots in TF32",
    "fp16": "fp16 storage of projections, fp16 tensor-core dots with fp32 accumulation",
}
# The fused prologue/epilogue's dots (x @ W^T, y @ to_out^T) per precision. bf16 keeps them in
# TF32: rounding the weights and normalised x to bf16's 8-bit mantissa moves the output by up to
# ~1x GPU MODE's 2e-2 tolerance at small sizes, while fp16/TF32 (10 bits) stay well inside it;
# the contraction, where the FLOPs are, still runs on bf16 operands.
_EDGE_PREC = {"ieee": "ieee", "tf32": "tf32", "bf16": "tf32", "fp16": "fp16"}
LN_EPS = 1e-5  # torch.nn.LayerNorm's default, as the reference module uses


def _ruler(title: str, indent: str = "    ") -> str:
    return f"{indent}# -- {title} " + "-" * max(4, 88 - len(indent) - len(title) - 6) + "\n"


_SECTION = "# " + "=" * 93 + "\n"


def _section(title: str) -> str:
    return f"\n{_SECTION}# {title}\n{_SECTION}\n"


def _header(algorithm: str, summary: str, details: str, values: KnobValues) -> str:
    knob_lines = "\n".join(f"    {k} = {values[k]!r}" for k in values)
    return (
        f'"""trimul kernel, family `{algorithm}`: {summary}\n\n'
        "Task: AlphaFold3 outgoing triangle multiplicative update (GPU MODE bioml/trimul), forward;\n"
        "data = (x (bs, N, N, dim) fp32, mask (bs, N, N), weights, config) -> (bs, N, N, dim) fp32.\n\n"
        f"{details.strip()}\n\n"
        f"Knobs:\n{knob_lines}\n"
        '"""\n\n'
        "import torch\n"
        "import triton\n"
        "import triton.language as tl\n"
    )


_LAUNCH_PROLOGUE = '''\
    x, mask, weights, config = data
    assert x.ndim == 4 and x.shape[1] == x.shape[2], "x must be (bs, N, N, dim)"
    bs, N, _, D = x.shape
    H = config["hidden_dim"]
    assert D == config["dim"] and mask.shape == (bs, N, N)
    M = bs * N * N  # rows (b, i, k) of every per-pair projection
    x2 = x.reshape(M, D).contiguous()  # (M, D) fp32
    mask_f = mask.reshape(M).to(torch.float32).contiguous()  # (M,) 0/1; GPU MODE gives int64 or fp32
'''


# =============================================================================================
# Kernel sources shared by the families
# =============================================================================================

def _ln_stats(ln_stats: str) -> str:
    """LayerNorm mean / rstd over D for a block of rows, read in BLOCK_D chunks."""
    if ln_stats == "two_pass":
        return f'''{_ruler("LayerNorm statistics over dim: mean pass, then centred variance pass")}    acc_s = tl.zeros([BLOCK_M], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + ds
        xt = tl.load(x_rows + d[None, :], mask=row_ok[:, None] & (d[None, :] < D), other=0.0)
        acc_s += tl.sum(xt, axis=1)
    mean = acc_s / D
    acc_q = tl.zeros([BLOCK_M], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + ds
        d_ok = row_ok[:, None] & (d[None, :] < D)
        xt = tl.load(x_rows + d[None, :], mask=d_ok, other=0.0)
        xc = tl.where(d_ok, xt - mean[:, None], 0.0)
        acc_q += tl.sum(xc * xc, axis=1)
    rstd = 1.0 / tl.sqrt(acc_q / D + eps)
'''
    return f'''{_ruler("LayerNorm statistics over dim: one pass of sum and sum of squares")}    acc_s = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc_q = tl.zeros([BLOCK_M], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + ds
        xt = tl.load(x_rows + d[None, :], mask=row_ok[:, None] & (d[None, :] < D), other=0.0)
        acc_s += tl.sum(xt, axis=1)
        acc_q += tl.sum(xt * xt, axis=1)
    mean = acc_s / D
    rstd = 1.0 / tl.sqrt(tl.maximum(acc_q / D - mean * mean, 0.0) + eps)
'''


def _ln_proj_kernel(prec: str, ln_stats: str) -> str:
    st = _PREC[prec][0]  # storage of the projections
    mt, _, dot, _ = _PREC[_EDGE_PREC[prec]]  # dtype and precision of the projection dots
    return f'''@triton.jit
def ln_proj_gate_kernel(
    # pointers
    x_ptr, mask_ptr, ln_w_ptr, ln_b_ptr, wp_ptr, wg_ptr, p_ptr,
    # sizes
    M, D, H, N, slot0,
    # strides (elements): x rows; stacked weights (slot, h, d); projections (slot, b, h, i, k)
    stride_xm, stride_ws, stride_wh,
    stride_ps, stride_pb, stride_ph, stride_pi, stride_pk,
    # LayerNorm epsilon
    eps,
    # meta-parameters
    GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
):
{_ruler("map program to (block of rows, slot, block of hidden channels)")}    n_h = tl.cdiv(H, BLOCK_H)
    slot = slot0 + tl.program_id(1) // n_h
    hs = (tl.program_id(1) % n_h) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = hs < H
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    ds = tl.arange(0, BLOCK_D)
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
{_ln_stats(ln_stats)}{_ruler("projections: normalised x (BLOCK_M, BLOCK_D) @ W^T (BLOCK_D, BLOCK_H)")}    w_off = slot.to(tl.int64) * stride_ws + hs[None, :] * stride_wh  # W is (slot, h, d)
    acc_p = tl.zeros([BLOCK_M, BLOCK_H], dtype=tl.float32)
    if GATED:
        acc_g = tl.zeros([BLOCK_M, BLOCK_H], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + ds
        d_ok = d < D
        xt = tl.load(x_rows + d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        gamma = tl.load(ln_w_ptr + d, mask=d_ok, other=0.0)
        beta = tl.load(ln_b_ptr + d, mask=d_ok, other=0.0)
        xn = ((xt - mean[:, None]) * rstd[:, None] * gamma[None, :] + beta[None, :]).to({mt})
        w_mask = d_ok[:, None] & h_ok[None, :]
        wp = tl.load(wp_ptr + w_off + d[:, None], mask=w_mask, other=0.0)
        acc_p = tl.dot(xn, wp, acc_p{dot})
        if GATED:
            wg = tl.load(wg_ptr + w_off + d[:, None], mask=w_mask, other=0.0)
            acc_g = tl.dot(xn, wg, acc_g{dot})
{_ruler("epilogue: proj * mask * sigmoid(gate), or sigmoid(out gate)")}    if GATED:
        m = tl.load(mask_ptr + rows, mask=row_ok, other=0.0)
        val = acc_p * m[:, None] * tl.sigmoid(acc_g)
    else:
        val = tl.sigmoid(acc_p)
{_ruler("scatter rows (b, i, k) into the projection layout")}    b = rows // (N * N)
    i = (rows // N) % N
    k = rows % N
    p_rows = slot.to(tl.int64) * stride_ps + b.to(tl.int64) * stride_pb + i * stride_pi + k * stride_pk
    p_ptrs = p_ptr + p_rows[:, None] + hs[None, :] * stride_ph
    tl.store(p_ptrs, val.to({st}), mask=row_ok[:, None] & h_ok[None, :])
'''


def _ln_proj_launch(v: KnobValues, prec: str) -> str:
    """Launch ln_proj_gate_kernel twice: gated left/right (slots 0, 1), then the out gate (slot 2)."""
    tdt = _PREC[_EDGE_PREC[prec]][1]
    return f'''{_ruler("stage 1: LayerNorm + projections + gates + mask, fused")}    PROJ_BLOCK_M = {v["PROJ_BLOCK_M"]}  # rows per program
    PROJ_BLOCK_D = {v["PROJ_BLOCK_D"]}  # dim chunk (the dot's K)
    PROJ_BLOCK_H = {v["PROJ_BLOCK_H"]}  # hidden channels per program
    # slot 0 = left, 1 = right, 2 = out gate; the out gate's "projection" weight is out_gate
    wp = torch.stack([weights["left_proj.weight"], weights["right_proj.weight"],
                      weights["out_gate.weight"]]).to({tdt}).contiguous()  # (3, H, D)
    wg = torch.stack([weights["left_gate.weight"], weights["right_gate.weight"],
                      weights["out_gate.weight"]]).to({tdt}).contiguous()  # (3, H, D)
    n_h = triton.cdiv(H, PROJ_BLOCK_H)
    for slot0, n_slots, gated in ((0, 2, True), (2, 1, False)):
        ln_proj_gate_kernel[(triton.cdiv(M, PROJ_BLOCK_M), n_slots * n_h)](
            x2, mask_f, weights["norm.weight"], weights["norm.bias"], wp, wg, proj,
            M, D, H, N, slot0,
            x2.stride(0), wp.stride(0), wp.stride(1), *proj_strides,
            {LN_EPS},
            GATED=gated, BLOCK_M=PROJ_BLOCK_M, BLOCK_D=PROJ_BLOCK_D, BLOCK_H=PROJ_BLOCK_H,
            num_warps=NUM_WARPS, num_stages=NUM_STAGES,
        )
'''


def _proj_buffer(layout: str, prec: str) -> str:
    """Allocate the (3, ...) projection buffer and its (slot, b, h, i, k) strides."""
    _, tdt, _, _ = _PREC[prec]
    if layout == "bhik":
        return f'''    # channel-first: each (b, h) slice is a contiguous N x N matrix for the contraction
    proj = torch.empty((3, bs, H, N, N), device=x.device, dtype={tdt})
    proj_strides = (proj.stride(0), proj.stride(1), proj.stride(2), proj.stride(3), proj.stride(4))
'''
    return f'''    # channel-last, as the reference: (b, i, k, h), the contraction reads with stride H
    proj = torch.empty((3, bs, N, N, H), device=x.device, dtype={tdt})
    proj_strides = (proj.stride(0), proj.stride(1), proj.stride(4), proj.stride(2), proj.stride(3))
'''


def _contract_dot_kernel(prec: str, edge: str, split_k: bool) -> str:
    _, _, dot, _ = _PREC[prec]
    if edge == "wrap":
        idx = """    # wrap out-of-range rows/columns back into the matrix: loads need only the k mask
    offs_i = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % N
    offs_j = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
"""
        a_mask = "(k0 + ks[None, :]) < k_hi"
        b_mask = "(k0 + ks[:, None]) < k_hi"
        store_i = "pid_m * BLOCK_M + tl.arange(0, BLOCK_M)"
        store_j = "pid_n * BLOCK_N + tl.arange(0, BLOCK_N)"
    else:
        idx = """    offs_i = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_j = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
"""
        a_mask = "(offs_i[:, None] < N) & ((k0 + ks[None, :]) < k_hi)"
        b_mask = "((k0 + ks[:, None]) < k_hi) & (offs_j[None, :] < N)"
        store_i = "offs_i"
        store_j = "offs_j"
    if split_k:
        k_range = """    # this program's share of k: CHUNK_K columns (a multiple of BLOCK_K)
    k_lo = tl.program_id(2) * CHUNK_K
    k_hi = tl.minimum(k_lo + CHUNK_K, N)
"""
        store = "tl.atomic_add(o_ptrs, acc, mask=o_mask)  # fp32 partial sums from SPLIT_K programs"
        extra_size = ", CHUNK_K"
    else:
        k_range = """    k_lo = 0
    k_hi = N
"""
        store = "tl.store(o_ptrs, acc, mask=o_mask)"
        extra_size = ""
    return f'''@triton.jit
def tri_contract_kernel(
    # pointers
    l_ptr, r_ptr, o_ptr,
    # sizes
    N, H{extra_size},
    # strides (elements): left/right (b, h, i, k), output (b, h, i, j)
    stride_lb, stride_lh, stride_li, stride_lk,
    stride_rb, stride_rh, stride_ri, stride_rk,
    stride_ob, stride_oh, stride_oi, stride_oj,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
{_ruler("map program to (b, h) and an output tile, grouped for L2 reuse")}    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    pid = tl.program_id(0)
    num_m = tl.cdiv(N, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    group_size = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_size
    pid_n = (pid % in_group) // group_size
{idx}{k_range}    ks = tl.arange(0, BLOCK_K)
{_ruler("build pointers: A = left[b, h] tile (i, k), B = right[b, h]^T tile (k, j)")}    l_base = l_ptr + b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh
    r_base = r_ptr + b.to(tl.int64) * stride_rb + h.to(tl.int64) * stride_rh
    a_ptrs = l_base + offs_i[:, None] * stride_li + (k_lo + ks[None, :]) * stride_lk
    b_ptrs = r_base + (k_lo + ks[:, None]) * stride_rk + offs_j[None, :] * stride_ri
{_ruler("accumulate out[i, j] = sum_k left[i, k] * right[j, k] in fp32")}    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        a = tl.load(a_ptrs, mask={a_mask}, other=0.0)
        bt = tl.load(b_ptrs, mask={b_mask}, other=0.0)
        acc = tl.dot(a, bt, acc{dot})
        a_ptrs += BLOCK_K * stride_lk
        b_ptrs += BLOCK_K * stride_rk
{_ruler("masked write-back of the fp32 tile")}    si = {store_i}
    sj = {store_j}
    o_ptrs = (o_ptr + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
              + si[:, None] * stride_oi + sj[None, :] * stride_oj)
    o_mask = (si[:, None] < N) & (sj[None, :] < N)
    {store}
'''


def _contract_outer_kernel() -> str:
    return f'''@triton.jit
def tri_outer_kernel(
    # pointers
    l_ptr, r_ptr, o_ptr,
    # sizes
    N, H,
    # strides (elements): left/right (b, h, i, k), output (b, h, i, j)
    stride_lb, stride_lh, stride_li, stride_lk,
    stride_rb, stride_rh, stride_ri, stride_rk,
    stride_ob, stride_oh, stride_oi, stride_oj,
    # meta-parameters
    BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_H: tl.constexpr,
):
{_ruler("map program to (b, tile of i, tile of j, block of channels)")}    num_j = tl.cdiv(N, BLOCK_J)
    offs_i = (tl.program_id(0) // num_j) * BLOCK_I + tl.arange(0, BLOCK_I)
    offs_j = (tl.program_id(0) % num_j) * BLOCK_J + tl.arange(0, BLOCK_J)
    b = tl.program_id(1)
    hs = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
    i_ok = offs_i < N
    j_ok = offs_j < N
    h_ok = hs < H
    l_rows = (l_ptr + b.to(tl.int64) * stride_lb + offs_i[:, None] * stride_li
              + hs[None, :] * stride_lh)  # (BLOCK_I, BLOCK_H)
    r_rows = (r_ptr + b.to(tl.int64) * stride_rb + offs_j[:, None] * stride_ri
              + hs[None, :] * stride_rh)  # (BLOCK_J, BLOCK_H)
{_ruler("CUDA-core outer products over k: acc[i, j, h] += left[i, k, h] * right[j, k, h]")}    acc = tl.zeros([BLOCK_I, BLOCK_J, BLOCK_H], dtype=tl.float32)
    for k in range(0, N):
        a = tl.load(l_rows + k * stride_lk, mask=i_ok[:, None] & h_ok[None, :], other=0.0)
        r = tl.load(r_rows + k * stride_rk, mask=j_ok[:, None] & h_ok[None, :], other=0.0)
        acc += a.to(tl.float32)[:, None, :] * r.to(tl.float32)[None, :, :]
{_ruler("masked write-back, (BLOCK_I, BLOCK_J, BLOCK_H)")}    o_ptrs = (o_ptr + b.to(tl.int64) * stride_ob + offs_i[:, None, None] * stride_oi
              + offs_j[None, :, None] * stride_oj + hs[None, None, :] * stride_oh)
    o_mask = i_ok[:, None, None] & j_ok[None, :, None] & h_ok[None, None, :]
    tl.store(o_ptrs, acc, mask=o_mask)
'''


def _out_kernel(prec: str) -> str:
    mt, _, dot, _ = _PREC[_EDGE_PREC[prec]]  # dtype and precision of the to_out dot
    return f'''@triton.jit
def out_norm_gate_proj_kernel(
    # pointers
    o_ptr, g_ptr, ln_w_ptr, ln_b_ptr, w_ptr, y_ptr,
    # sizes
    M, N, H, D,
    # strides (elements): contraction (b, h, i, j), out gate (b, h, i, j), to_out (d, h), y rows
    stride_ob, stride_oh, stride_oi, stride_oj,
    stride_gb, stride_gh, stride_gi, stride_gj,
    stride_wd, stride_ym,
    # LayerNorm epsilon
    eps,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_HH: tl.constexpr, BLOCK_D: tl.constexpr,
):
{_ruler("map program to a block of output rows (b, i, j)")}    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    b = (rows // (N * N)).to(tl.int64)
    i = (rows // N) % N
    j = rows % N
    hs = tl.arange(0, BLOCK_HH)  # the whole hidden dimension in one tile
    h_ok = hs < H
    tile_ok = row_ok[:, None] & h_ok[None, :]
{_ruler("LayerNorm over hidden of the fp32 contraction")}    o = tl.load(o_ptr + (b * stride_ob + i * stride_oi + j * stride_oj)[:, None] + hs[None, :] * stride_oh,
                mask=tile_ok, other=0.0)
    mean = tl.sum(o, axis=1) / H
    oc = tl.where(tile_ok, o - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(oc * oc, axis=1) / H + eps)
    gamma = tl.load(ln_w_ptr + hs, mask=h_ok, other=0.0)
    beta = tl.load(ln_b_ptr + hs, mask=h_ok, other=0.0)
{_ruler("times the out gate, in the matmul input dtype")}    g = tl.load(g_ptr + (b * stride_gb + i * stride_gi + j * stride_gj)[:, None] + hs[None, :] * stride_gh,
                mask=tile_ok, other=0.0)
    yn = ((oc * rstd[:, None] * gamma[None, :] + beta[None, :]) * g.to(tl.float32)).to({mt})
{_ruler("to_out projection, BLOCK_D output columns at a time")}    for d0 in range(0, D, BLOCK_D):
        dd = d0 + tl.arange(0, BLOCK_D)
        d_ok = dd < D
        wt = tl.load(w_ptr + dd[None, :] * stride_wd + hs[:, None], mask=h_ok[:, None] & d_ok[None, :], other=0.0)
        y = tl.dot(yn, wt{dot})  # (BLOCK_M, BLOCK_D) fp32
        tl.store(y_ptr + rows.to(tl.int64)[:, None] * stride_ym + dd[None, :], y, mask=row_ok[:, None] & d_ok[None, :])
'''


def _out_launch(v: KnobValues, prec: str) -> str:
    tdt = _PREC[_EDGE_PREC[prec]][1]
    return f'''{_ruler("stage 3: LayerNorm over hidden + out gate + to_out, fused")}    w_out = weights["to_out.weight"].to({tdt}).contiguous()  # (D, H)
    y = torch.empty((M, D), device=x.device, dtype=torch.float32)
    out_norm_gate_proj_kernel[(triton.cdiv(M, PROJ_BLOCK_M),)](
        out, proj[2], weights["to_out_norm.weight"], weights["to_out_norm.bias"], w_out, y,
        M, N, H, D,
        *out_strides, *proj_strides[1:], w_out.stride(0), y.stride(0),
        {LN_EPS},
        BLOCK_M=PROJ_BLOCK_M, BLOCK_HH=triton.next_power_of_2(H), BLOCK_D=PROJ_BLOCK_D,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return y.view(bs, N, N, D)
'''


def _out_buffer(layout: str) -> str:
    if layout == "bhik":
        return '''    out = torch.empty((bs, H, N, N), device=x.device, dtype=torch.float32)  # (b, h, i, j)
    out_strides = (out.stride(0), out.stride(1), out.stride(2), out.stride(3))
'''
    return '''    out = torch.empty((bs, N, N, H), device=x.device, dtype=torch.float32)  # (b, i, j, h)
    out_strides = (out.stride(0), out.stride(3), out.stride(1), out.stride(2))
'''


def _contract_strides() -> str:
    # proj_strides = (slot, b, h, i, k); the contraction takes (b, h, i, k) per operand
    return "*proj_strides[1:], *proj_strides[1:], *out_strides"


# =============================================================================================
# Families
# =============================================================================================

def _render_fused_dot(v: KnobValues, shown: KnobValues, split_k: bool = False) -> str:
    prec, layout, edge = v["precision"], v["layout"], v["edge"]
    algorithm = "fused_dot_split_k" if split_k else "fused_dot"
    doc = f"""
Algorithm: three fused kernels.
  1. ln_proj_gate_kernel: LayerNorm over dim ({v["ln_stats"]} statistics) feeding tl.dot
     projections; proj * mask * sigmoid(gate) for left/right and sigmoid for the out gate are
     applied in the epilogue and stored once, {layout} layout.
  2. tri_contract_kernel: per (b, h), out = left @ right^T as a tiled tl.dot matmul with
     grouped tile order (GROUP_M), edges by {"wrapping indices (only k masked)" if edge == "wrap" else "masks"}{", split over k into SPLIT_K programs combined by fp32 atomic adds" if split_k else ""}.
  3. out_norm_gate_proj_kernel: LayerNorm over hidden, times the out gate, @ to_out^T (tl.dot).
Precision: {_PREC_DOC[prec]}.
x is read twice per projection launch (statistics + matmul); the intermediates are
3 * M * hidden projections and one fp32 M * hidden contraction output."""
    split_launch = ""
    if split_k:
        split_launch = f'''    SPLIT_K = {v["SPLIT_K"]}  # programs sharing one output tile
    CHUNK_K = triton.cdiv(triton.cdiv(N, SPLIT_K), BLOCK_K) * BLOCK_K
    out.zero_()  # the split-K programs accumulate with atomics
'''
    grid = "(triton.cdiv(N, BLOCK_M) * triton.cdiv(N, BLOCK_N), bs * H" + (", SPLIT_K)" if split_k else ")")
    chunk_arg = ", CHUNK_K" if split_k else ""
    return (
        _header(algorithm, "fused LayerNorm/projection/gating, tl.dot contraction, fused epilogue", doc, shown)
        + _section("Compute kernels")
        + "\n"
        + _ln_proj_kernel(prec, v["ln_stats"])
        + "\n\n"
        + _contract_dot_kernel(prec, edge, split_k)
        + "\n\n"
        + _out_kernel(prec)
        + _section("Launcher")
        + f'''
def custom_kernel(data):
    """(x, mask, weights, config) -> (bs, N, N, dim) through three fused kernels."""
{_LAUNCH_PROLOGUE}    NUM_WARPS = {v["NUM_WARPS"]}
    NUM_STAGES = {v["NUM_STAGES"]}
{_proj_buffer(layout, prec)}{_ln_proj_launch(v, prec)}{_ruler("stage 2: triangle contraction, one tl.dot matmul per (b, h)")}    BLOCK_M = {v["BLOCK_M"]}  # output rows i per tile
    BLOCK_N = {v["BLOCK_N"]}  # output columns j per tile
    BLOCK_K = {v["BLOCK_K"]}  # k per dot
    GROUP_M = {v["GROUP_M"]}  # row tiles per group (L2 reuse of right)
{_out_buffer(layout)}{split_launch}    tri_contract_kernel[{grid}](
        proj[0], proj[1], out, N, H{chunk_arg},
        {_contract_strides()},
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
{_out_launch(v, prec)}'''
    )


def _render_fused_dot_split_k(v: KnobValues, shown: KnobValues) -> str:
    return _render_fused_dot(v, shown, split_k=True)


def _render_fused_outer(v: KnobValues, shown: KnobValues) -> str:
    prec, layout = v["precision"], v["layout"]
    doc = f"""
Algorithm: the fused prologue and epilogue of fused_dot (LayerNorm + projections + gates on
tensor cores; LayerNorm over hidden + out gate + to_out), but the triangle contraction runs on
CUDA cores: each program owns a (BLOCK_I, BLOCK_J, BLOCK_H) fp32 accumulator and walks k one
step at a time, adding the outer product of left[i, k, h-block] and right[j, k, h-block].
No tensor cores in the N^3 * hidden contraction: FMA-bound. Projections stored {layout}.
Precision of the fused stages: {_PREC_DOC[prec]}; LayerNorm statistics: {v["ln_stats"]}."""
    return (
        _header("fused_outer_product", "fused prologue/epilogue, CUDA-core outer-product contraction", doc, shown)
        + _section("Compute kernels")
        + "\n"
        + _ln_proj_kernel(prec, v["ln_stats"])
        + "\n\n"
        + _contract_outer_kernel()
        + "\n\n"
        + _out_kernel(prec)
        + _section("Launcher")
        + f'''
def custom_kernel(data):
    """(x, mask, weights, config) -> (bs, N, N, dim); CUDA-core contraction."""
{_LAUNCH_PROLOGUE}    NUM_WARPS = {v["NUM_WARPS"]}
    NUM_STAGES = {v["NUM_STAGES"]}
{_proj_buffer(layout, prec)}{_ln_proj_launch(v, prec)}{_ruler("stage 2: triangle contraction as outer products over k")}    TRI_BLOCK = {v["TRI_BLOCK"]}  # i and j per tile
    TRI_BLOCK_H = {v["TRI_BLOCK_H"]}  # channels per program
{_out_buffer(layout)}    tri_outer_kernel[(triton.cdiv(N, TRI_BLOCK) ** 2, bs, triton.cdiv(H, TRI_BLOCK_H))](
        proj[0], proj[1], out, N, H,
        {_contract_strides()},
        BLOCK_I=TRI_BLOCK, BLOCK_J=TRI_BLOCK, BLOCK_H=TRI_BLOCK_H, num_warps=NUM_WARPS,
    )
{_out_launch(v, prec)}'''
    )


def _render_torch_proj_dot(v: KnobValues) -> str:
    prec, layout, edge = v["precision"], v["layout"], v["edge"]
    _, tdt, _, _ = _PREC[prec]
    doc = f"""
Algorithm: partial PyTorch fallback. PyTorch runs LayerNorm, the five fp32 projections, the
gating and mask (as the reference does, fp32 intermediates); the operands are cast to
{tdt} and {"permuted to channel-first (b, h, i, k), contiguous" if layout == "bhik" else "kept channel-last (b, i, k, h), read with stride hidden"}.
The triangle contraction is a Triton tiled tl.dot matmul per (b, h) with grouped tile order,
edges by {"wrapping indices (only k masked)" if edge == "wrap" else "masks"}, writing fp32 (b, i, j, h) in place for PyTorch's
output LayerNorm, out gate and to_out projection.
Precision of the contraction: {_PREC_DOC[prec]}."""
    perm = ".permute(0, 3, 1, 2)" if layout == "bhik" else ""
    strides = (
        "l.stride(0), l.stride(1), l.stride(2), l.stride(3)"
        if layout == "bhik"
        else "l.stride(0), l.stride(3), l.stride(1), l.stride(2)"
    )
    rstrides = strides.replace("l.", "r.")
    return (
        _header("torch_proj_dot", "PyTorch projections and epilogue, Triton tl.dot contraction", doc, v)
        + _section("Compute kernel")
        + "\n"
        + _contract_dot_kernel(prec, edge, split_k=False)
        + _section("Launcher")
        + f'''
def custom_kernel(data):
    """(x, mask, weights, config) -> (bs, N, N, dim); only the contraction in Triton."""
    x, mask, weights, config = data
    assert x.ndim == 4 and x.shape[1] == x.shape[2], "x must be (bs, N, N, dim)"
    bs, N, _, D = x.shape
    H = config["hidden_dim"]
    assert D == config["dim"] and mask.shape == (bs, N, N)
    BLOCK_M = {v["BLOCK_M"]}  # output rows i per tile
    BLOCK_N = {v["BLOCK_N"]}  # output columns j per tile
    BLOCK_K = {v["BLOCK_K"]}  # k per dot
    GROUP_M = {v["GROUP_M"]}  # row tiles per group (L2 reuse of right)
    NUM_WARPS = {v["NUM_WARPS"]}
    NUM_STAGES = {v["NUM_STAGES"]}
{_ruler("PyTorch: LayerNorm, projections, gating (fp32)")}    xn = torch.nn.functional.layer_norm(x, (D,), weights["norm.weight"], weights["norm.bias"])
    m = mask.unsqueeze(-1).to(torch.float32)
    lin = torch.nn.functional.linear
    left = lin(xn, weights["left_proj.weight"]) * m * torch.sigmoid(lin(xn, weights["left_gate.weight"]))
    right = lin(xn, weights["right_proj.weight"]) * m * torch.sigmoid(lin(xn, weights["right_gate.weight"]))
    out_gate = torch.sigmoid(lin(xn, weights["out_gate.weight"]))
    l = left{perm}.to({tdt}).contiguous()
    r = right{perm}.to({tdt}).contiguous()
{_ruler("Triton: out[b, i, j, h] = sum_k left[b, i, k, h] * right[b, j, k, h]")}    out = torch.empty((bs, N, N, H), device=x.device, dtype=torch.float32)
    tri_contract_kernel[(triton.cdiv(N, BLOCK_M) * triton.cdiv(N, BLOCK_N), bs * H)](
        l, r, out, N, H,
        {strides},
        {rstrides},
        out.stride(0), out.stride(3), out.stride(1), out.stride(2),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
{_ruler("PyTorch: output LayerNorm, out gate, to_out")}    out = torch.nn.functional.layer_norm(out, (H,), weights["to_out_norm.weight"], weights["to_out_norm.bias"])
    return lin(out * out_gate, weights["to_out.weight"])
'''
    )


# -- the naive, unfused family -----------------------------------------------------------------

_NAIVE_KERNELS = f'''@triton.jit
def layernorm_kernel(
    # pointers
    x_ptr, w_ptr, b_ptr, g_ptr, y_ptr,
    # sizes
    R, C,
    # strides (elements)
    stride_x, stride_g, stride_y,
    # LayerNorm epsilon
    eps,
    # meta-parameters
    HAS_GATE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
{_ruler("map program to BLOCK_R whole rows of C channels")}    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cs = tl.arange(0, BLOCK_C)
    ok = (rows[:, None] < R) & (cs[None, :] < C)
{_ruler("two-pass LayerNorm statistics over each row")}    xr = tl.load(x_ptr + rows[:, None] * stride_x + cs[None, :], mask=ok, other=0.0)
    mean = tl.sum(xr, axis=1) / C
    xc = tl.where(ok, xr - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / C + eps)
    gamma = tl.load(w_ptr + cs, mask=cs < C, other=0.0)
    beta = tl.load(b_ptr + cs, mask=cs < C, other=0.0)
    y = xc * rstd[:, None] * gamma[None, :] + beta[None, :]
    if HAS_GATE:
        y = y * tl.load(g_ptr + rows[:, None] * stride_g + cs[None, :], mask=ok, other=0.0)
    tl.store(y_ptr + rows[:, None] * stride_y + cs[None, :], y, mask=ok)


@triton.jit
def linear_kernel(
    # pointers
    a_ptr, w_ptr, c_ptr,
    # sizes: C (M, NO) = A (M, K) @ W (NO, K)^T
    M, NO, K,
    # strides (elements)
    stride_am, stride_wn, stride_cm,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
{_ruler("map program to an output tile")}    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
{_ruler("CUDA-core product: (BLOCK_M, BLOCK_K, 1) * (1, BLOCK_K, BLOCK_N) summed over k")}    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        a = tl.load(a_ptr + rows.to(tl.int64)[:, None] * stride_am + kk[None, :],
                    mask=(rows[:, None] < M) & (kk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + cols[None, :] * stride_wn + kk[:, None],
                    mask=(kk[:, None] < K) & (cols[None, :] < NO), other=0.0)
        acc += tl.sum(a[:, :, None] * w[None, :, :], axis=1)
{_ruler("masked write-back")}    tl.store(c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols[None, :], acc,
             mask=(rows[:, None] < M) & (cols[None, :] < NO))


@triton.jit
def gate_kernel(
    # pointers
    p_ptr, g_ptr, mask_ptr, y_ptr,
    # sizes
    n_elements, H,
    # meta-parameters
    HAS_PROJ: tl.constexpr, BLOCK: tl.constexpr,
):
{_ruler("map program to a flat block of (row, h) elements")}    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n_elements
{_ruler("proj * mask[row] * sigmoid(gate), or sigmoid(gate) alone")}    g = tl.sigmoid(tl.load(g_ptr + offs, mask=ok, other=0.0))
    if HAS_PROJ:
        p = tl.load(p_ptr + offs, mask=ok, other=0.0)
        m = tl.load(mask_ptr + offs // H, mask=ok, other=0.0)
        g = p * m * g
    tl.store(y_ptr + offs, g, mask=ok)
'''


def _render_unfused(v: KnobValues) -> str:
    doc = """
Algorithm: one kernel per stage, fp32 everywhere, no tensor cores, as a first port would be:
  LayerNorm over dim (LN_ROWS whole rows per program) -> five CUDA-core linear kernels (a broadcast
  multiply and sum over (LIN_BLOCK_M, LIN_BLOCK_K, LIN_BLOCK_N) tiles, no tl.dot) -> gating
  kernels -> the contraction as CUDA-core outer products over k on (TRI_BLOCK, TRI_BLOCK,
  TRI_BLOCK_H) tiles in the channel-last layout -> LayerNorm over hidden times the out gate
  -> a last CUDA-core linear for to_out.
Every intermediate is an fp32 tensor in global memory (about 10 of M * hidden or M * dim)."""
    return (
        _header("unfused_cuda_core", "one fp32 CUDA-core kernel per stage, no fusion", doc, v)
        + _section("Compute kernels")
        + "\n"
        + _NAIVE_KERNELS
        + "\n\n"
        + _contract_outer_kernel()
        + _section("Launcher")
        + f'''
def custom_kernel(data):
    """(x, mask, weights, config) -> (bs, N, N, dim), one naive kernel per stage."""
{_LAUNCH_PROLOGUE}    LIN_BLOCK_M = {v["LIN_BLOCK_M"]}  # rows per linear tile
    LIN_BLOCK_N = {v["LIN_BLOCK_N"]}  # output features per linear tile
    LIN_BLOCK_K = {v["LIN_BLOCK_K"]}  # reduction step of the linear
    TRI_BLOCK = {v["TRI_BLOCK"]}  # i and j per contraction tile
    TRI_BLOCK_H = {v["TRI_BLOCK_H"]}  # channels per contraction program
    LN_ROWS = {v["LN_ROWS"]}  # rows per LayerNorm program
    NUM_WARPS = {v["NUM_WARPS"]}
    EW_BLOCK = 1024  # elementwise gate kernel block
    f32 = dict(device=x.device, dtype=torch.float32)

    def linear(a, w):
        c = torch.empty((a.shape[0], w.shape[0]), **f32)
        grid = (triton.cdiv(a.shape[0], LIN_BLOCK_M), triton.cdiv(w.shape[0], LIN_BLOCK_N))
        linear_kernel[grid](
            a, w, c, a.shape[0], w.shape[0], a.shape[1], a.stride(0), w.stride(0), c.stride(0),
            BLOCK_M=LIN_BLOCK_M, BLOCK_N=LIN_BLOCK_N, BLOCK_K=LIN_BLOCK_K, num_warps=NUM_WARPS,
        )
        return c

{_ruler("LayerNorm over dim")}    xn = torch.empty((M, D), **f32)
    layernorm_kernel[(triton.cdiv(M, LN_ROWS),)](
        x2, weights["norm.weight"], weights["norm.bias"], x2, xn, M, D, x2.stride(0), 0, xn.stride(0),
        {LN_EPS}, HAS_GATE=False, BLOCK_R=LN_ROWS, BLOCK_C=triton.next_power_of_2(D), num_warps=NUM_WARPS,
    )
{_ruler("five projections, each its own launch and fp32 output (M, H)")}    lp = linear(xn, weights["left_proj.weight"])
    rp = linear(xn, weights["right_proj.weight"])
    lg = linear(xn, weights["left_gate.weight"])
    rg = linear(xn, weights["right_gate.weight"])
    og = linear(xn, weights["out_gate.weight"])
{_ruler("gating: left/right = proj * mask * sigmoid(gate); og = sigmoid(og) in place")}    left = torch.empty((M, H), **f32)
    right = torch.empty((M, H), **f32)
    grid = (triton.cdiv(M * H, EW_BLOCK),)
    gate_kernel[grid](lp, lg, mask_f, left, M * H, H, HAS_PROJ=True, BLOCK=EW_BLOCK, num_warps=NUM_WARPS)
    gate_kernel[grid](rp, rg, mask_f, right, M * H, H, HAS_PROJ=True, BLOCK=EW_BLOCK, num_warps=NUM_WARPS)
    gate_kernel[grid](og, og, mask_f, og, M * H, H, HAS_PROJ=False, BLOCK=EW_BLOCK, num_warps=NUM_WARPS)
{_ruler("contraction on CUDA cores, channel-last (b, i, k, h) operands")}    out = torch.empty((M, H), **f32)
    s_b, s_i, s_k = N * N * H, N * H, H  # (b, i, k, h) strides of left, right and out
    tri_outer_kernel[(triton.cdiv(N, TRI_BLOCK) ** 2, bs, triton.cdiv(H, TRI_BLOCK_H))](
        left, right, out, N, H,
        s_b, 1, s_i, s_k, s_b, 1, s_i, s_k, s_b, 1, s_i, s_k,
        BLOCK_I=TRI_BLOCK, BLOCK_J=TRI_BLOCK, BLOCK_H=TRI_BLOCK_H, num_warps=NUM_WARPS,
    )
{_ruler("LayerNorm over hidden times the out gate, then to_out")}    gated = torch.empty((M, H), **f32)
    layernorm_kernel[(triton.cdiv(M, LN_ROWS),)](
        out, weights["to_out_norm.weight"], weights["to_out_norm.bias"], og, gated,
        M, H, out.stride(0), og.stride(0), gated.stride(0),
        {LN_EPS}, HAS_GATE=True, BLOCK_R=LN_ROWS, BLOCK_C=triton.next_power_of_2(H), num_warps=NUM_WARPS,
    )
    return linear(gated, weights["to_out.weight"]).view(bs, N, N, D)
'''
    )


# =============================================================================================
# Knob domains and constraints
# =============================================================================================

def _threads(v: KnobValues) -> int:
    return 32 * v["NUM_WARPS"]


def _dot_smem(bm: int, bn: int, bk: int, nbytes: int, stages: int) -> int:
    """Shared memory of a pipelined tl.dot loop: `stages` copies of the A and B tiles."""
    return max(stages, 1) * (bm * bk + bk * bn) * nbytes


def _proj_ok(v: KnobValues, prec: str) -> bool:
    """Fused prologue (two accumulators) and epilogue fit registers and shared memory."""
    nbytes = _PREC[_EDGE_PREC[prec]][3]
    bm, bd, bh = v["PROJ_BLOCK_M"], v["PROJ_BLOCK_D"], v["PROJ_BLOCK_H"]
    if 2 * bm * bh / _threads(v) > _MAX_ACC_REGS:
        return False
    # the epilogue holds (BLOCK_M, hidden <= 128) fp32 plus a (BLOCK_M, BLOCK_D) result
    if (bm * 128 + bm * bd) / _threads(v) > _MAX_ACC_REGS:
        return False
    # prologue: x tile staged in fp32 plus two weight tiles per stage
    smem = v["NUM_STAGES"] * (bm * bd * 4 + 2 * bd * bh * nbytes)
    # epilogue: (hidden <= 128, BLOCK_D) to_out tiles per stage, the (BLOCK_M, hidden) dot
    # operand and the (BLOCK_M, BLOCK_D) fp32 result staged for the store
    smem_out = v["NUM_STAGES"] * 128 * bd * nbytes + bm * 128 * nbytes + bm * bd * 4
    return max(smem, smem_out) <= SMEM_LIMIT


def _contract_ok(v: KnobValues, prec: str) -> bool:
    nbytes = _PREC[prec][3]
    bm, bn, bk = v["BLOCK_M"], v["BLOCK_N"], v["BLOCK_K"]
    if bm * bn / _threads(v) > _MAX_ACC_REGS:
        return False
    return _dot_smem(bm, bn, bk, nbytes, v["NUM_STAGES"]) <= SMEM_LIMIT


def _fused_dot_ok(v: KnobValues) -> bool:
    return _proj_ok(v, v["precision"]) and _contract_ok(v, v["precision"])


def _fused_outer_ok(v: KnobValues) -> bool:
    acc = v["TRI_BLOCK"] ** 2 * v["TRI_BLOCK_H"]
    return _proj_ok(v, v["precision"]) and 4 <= acc / _threads(v) <= _MAX_ACC_REGS


def _unfused_ok(v: KnobValues) -> bool:
    lin = v["LIN_BLOCK_M"] * v["LIN_BLOCK_N"] * v["LIN_BLOCK_K"] / _threads(v)
    tri = v["TRI_BLOCK"] ** 2 * v["TRI_BLOCK_H"] / _threads(v)
    ln = v["LN_ROWS"] * 1024 / _threads(v)  # a row block of dim <= 768 padded to 1024
    return lin <= _MAX_ACC_REGS and tri <= _MAX_ACC_REGS and ln <= _MAX_ACC_REGS


_WARPS = Knob("NUM_WARPS", (4, 8), "warps per program")
_STAGES = Knob("NUM_STAGES", (2, 3, 4), "software-pipelining depth")
_LAYOUT = Knob("layout", ("bikh", "bhik"), "projection layout: channel-last, or channel-first")
_LN = Knob("ln_stats", ("sumsq", "two_pass"), "LayerNorm statistics: sum + sum of squares, or two passes")
_EDGE = Knob("edge", ("mask", "wrap"), "ragged tiles: masked loads, or wrapped indices")
_GROUP = Knob("GROUP_M", (1, 8), "row tiles per group in the contraction's tile order")


def _fixed(render, fixed: dict):
    """A render that also sees values this family pins (they appear in the code, not as knobs)."""

    def with_fixed(v: KnobValues) -> str:
        return render({**fixed, **v}, shown=v)

    return with_fixed


def _constrained(check, fixed: dict):
    return lambda v: check({**fixed, **v})


_OUTER_FIXED = {"PROJ_BLOCK_D": 32, "PROJ_BLOCK_H": 64, "NUM_STAGES": 2}
_DOT_FIXED = {"PROJ_BLOCK_H": 64}
_SPLIT_FIXED = {"PROJ_BLOCK_H": 64, "PROJ_BLOCK_M": 64, "PROJ_BLOCK_D": 32, "ln_stats": "two_pass"}

FAMILIES: tuple[Family, ...] = (
    Family(
        task=TASK,
        algorithm="unfused_cuda_core",
        summary="naive: one fp32 CUDA-core kernel per stage, outer-product contraction",
        knobs=(
            Knob("LIN_BLOCK_M", (8, 16, 32, 64), "rows per linear tile"),
            Knob("LIN_BLOCK_N", (8, 16, 32), "output features per linear tile"),
            Knob("LIN_BLOCK_K", (2, 4, 8, 16), "reduction step of the linear"),
            Knob("TRI_BLOCK", (4, 8, 16), "i and j per contraction tile"),
            Knob("TRI_BLOCK_H", (8, 16, 32), "channels per contraction program"),
            Knob("LN_ROWS", (1, 4, 16), "rows per LayerNorm program"),
            Knob("NUM_WARPS", (1, 2, 4), "warps per program"),
        ),
        render=_render_unfused,
        constraint=_unfused_ok,
    ),
    Family(
        task=TASK,
        algorithm="fused_outer_product",
        summary="fused tl.dot prologue/epilogue, CUDA-core outer-product contraction",
        knobs=(
            Knob("precision", ("ieee", "tf32", "bf16"), "matmul/storage precision of the fused stages"),
            _LAYOUT,
            _LN,
            Knob("PROJ_BLOCK_M", (32, 64), "rows per program in the fused prologue/epilogue"),
            Knob("TRI_BLOCK", (8, 16, 32), "i and j per contraction tile"),
            Knob("TRI_BLOCK_H", (8, 16, 32), "channels per contraction program"),
            Knob("NUM_WARPS", (2, 4, 8), "warps per program"),
        ),
        render=_fixed(_render_fused_outer, _OUTER_FIXED),
        constraint=_constrained(_fused_outer_ok, _OUTER_FIXED),
    ),
    Family(
        task=TASK,
        algorithm="torch_proj_dot",
        summary="partial fallback: PyTorch projections/epilogue, Triton tl.dot contraction",
        knobs=(
            Knob("precision", ("ieee", "tf32", "bf16", "fp16"), "contraction operand precision"),
            _LAYOUT,
            Knob("BLOCK_M", (32, 64, 128), "contraction rows i per tile"),
            Knob("BLOCK_N", (32, 64, 128), "contraction columns j per tile"),
            Knob("BLOCK_K", (16, 32, 64), "contraction k per dot"),
            _GROUP,
            _EDGE,
            _WARPS,
            _STAGES,
        ),
        render=_render_torch_proj_dot,
        constraint=lambda v: _contract_ok(v, v["precision"]),
    ),
    Family(
        task=TASK,
        algorithm="fused_dot",
        summary="three fused kernels: LN+proj+gate (tl.dot), tl.dot contraction, LN+gate+to_out",
        knobs=(
            Knob("precision", ("tf32", "bf16", "fp16"), "matmul/storage precision"),
            _LAYOUT,
            _LN,
            _EDGE,
            Knob("PROJ_BLOCK_M", (32, 64, 128), "rows per program in the fused prologue/epilogue"),
            Knob("PROJ_BLOCK_D", (32, 64), "dim chunk of the projection dots / to_out columns"),
            Knob("BLOCK_M", (64, 128), "contraction rows i per tile"),
            Knob("BLOCK_N", (64, 128), "contraction columns j per tile"),
            Knob("BLOCK_K", (32, 64), "contraction k per dot"),
            _GROUP,
            _WARPS,
            _STAGES,
        ),
        render=_fixed(_render_fused_dot, _DOT_FIXED),
        constraint=_constrained(_fused_dot_ok, _DOT_FIXED),
    ),
    Family(
        task=TASK,
        algorithm="fused_dot_split_k",
        summary="fused_dot with the contraction split over k and combined by fp32 atomics",
        knobs=(
            Knob("precision", ("bf16", "fp16"), "matmul/storage precision"),
            _LAYOUT,
            Knob("SPLIT_K", (2, 4, 8), "programs sharing one output tile"),
            _EDGE,
            Knob("BLOCK_M", (64, 128), "contraction rows i per tile"),
            Knob("BLOCK_N", (64, 128), "contraction columns j per tile"),
            Knob("BLOCK_K", (32, 64), "contraction k per dot"),
            _GROUP,
            _WARPS,
            _STAGES,
        ),
        render=_fixed(_render_fused_dot_split_k, _SPLIT_FIXED),
        constraint=_constrained(_fused_dot_ok, _SPLIT_FIXED),
    ),
)

# The seed kernel: the fused three-kernel pipeline in bf16, mid-sized tiles.
SEED: tuple[str, dict] = (
    "fused_dot",
    {
        "precision": "bf16",
        "layout": "bhik",
        "ln_stats": "two_pass",
        "edge": "mask",
        "PROJ_BLOCK_M": 64,
        "PROJ_BLOCK_D": 32,
        "BLOCK_M": 64,
        "BLOCK_N": 64,
        "BLOCK_K": 32,
        "GROUP_M": 8,
        "NUM_WARPS": 4,
        "NUM_STAGES": 3,
    },
)
