"""trimul as GPU MODE submissions and kernel libraries write it: AlphaFold3's outgoing triangle
multiplicative update, x (bs, N, N, dim) fp32 -> (bs, N, N, dim) fp32.

    fused_three      three kernels: LayerNorm + the five projections + gates + mask (one
                     program per token block and projection group, tl.dot over dim), the
                     triangle contraction as a batched tl.dot matmul per (batch, channel), and
                     LayerNorm over the channels + out gate + the output projection
    torch_hybrid     LayerNorm and the projections in PyTorch (one concatenated matmul), a
                     Triton gating kernel writing channel-first operands, the Triton
                     contraction, and PyTorch's LayerNorm and linear for the output
    unfused          a Triton kernel per step: row LayerNorm, a generic linear kernel called for
                     each projection, an elementwise gate kernel, the contraction, LayerNorm,
                     gate multiply and the output linear, intermediates in fp32

The contraction out[b, i, j, h] = sum_k left[b, i, k, h] right[b, j, k, h] runs on channel-first
operands (bs, hidden, N, N) in bf16, fp16 or fp32 (TF32 or IEEE dots), with tiles in grouped or
row-major order, on a grid of tiles or a persistent SM-sized grid, or (slowest) as fp32 outer
products on CUDA cores.
"""

from __future__ import annotations

from pipelines.generation.styles.library_kernels import glue
from pipelines.generation.styles.library_kernels.glue import (
    Choices,
    Structure,
    TaskSpace,
    dedent,
    indent,
)

TASK = "trimul"
SMEM_LIMIT = 232448

# contraction operand precision -> (Triton dtype, torch dtype, tl.dot keyword)
PRECISION = {
    "bf16": ("tl.bfloat16", "torch.bfloat16", ""),
    "fp16": ("tl.float16", "torch.float16", ""),
    "tf32": ("tl.float32", "torch.float32", ', input_precision="tf32"'),
    "ieee": ("tl.float32", "torch.float32", ', input_precision="ieee"'),
}
# the projections' and output linear's dots: bf16 there moves the output by about the
# tolerance, so the edges use fp16 or TF32
EDGE = {"fp16": ("tl.float16", ""), "tf32": ("tl.float32", ', input_precision="tf32"')}

# contraction tiles (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
TILES = ((128, 128, 32, 8, 3), (128, 64, 32, 4, 3), (64, 128, 32, 4, 3), (64, 64, 32, 4, 4),
         (64, 64, 64, 4, 2), (32, 64, 32, 2, 3), (32, 32, 32, 2, 2), (16, 16, 16, 1, 2))
CONFIG_SET = ((128, 128, 32, 8, 3), (128, 64, 32, 4, 3), (64, 64, 32, 4, 4), (64, 64, 64, 4, 2))


def fits(tile: tuple, elem_bytes: int) -> bool:
    bm, bn, bk, warps, stages = tile
    return stages * (bm * bk + bk * bn) * elem_bytes <= SMEM_LIMIT * 0.9 and bm * bn // (32 * warps) <= 128


def _doc(title: str, text: str, c: Choices) -> str:
    return (f"Triangle multiplicative update (outgoing), fp32 in and out: {title}.\n\n{glue.wrap_doc(text)}")


# =============================================================================================
# The contraction: left/right channel-first (bs * hidden, N, N) -> out
# =============================================================================================


def contraction_kernel(c: Choices, for_check: bool) -> str:
    """The batched contraction kernel; grid (tiles, bs * hidden) or persistent over both."""
    e_tl, _, dot_kw = PRECISION[c["mm"]]
    if c.get("out_layout", "token_major") == "token_major":
        store = dedent("""\
        b = bh // HID
        h = bh % HID
        o_ptrs = o_ptr + ((b * N + offs_i[:, None]) * N + offs_j[None, :]) * HID + h""")
    else:
        store = "o_ptrs = o_ptr + bh * N * N + offs_i[:, None] * N + offs_j[None, :]"
    if c["contraction"] == "fma":
        k_loop = dedent("""\
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, N, BLOCK_K):
            ks = k0 + offs_k
            a = tl.load(l_ptr + base + offs_i[:, None] * N + ks[None, :], mask=(offs_i[:, None] < N) & (ks[None, :] < N), other=0.0).to(tl.float32)
            bt = tl.load(r_ptr + base + offs_j[None, :] * N + ks[:, None], mask=(ks[:, None] < N) & (offs_j[None, :] < N), other=0.0).to(tl.float32)
            acc += tl.sum(a[:, :, None] * bt[None, :, :], axis=1)""")
    else:
        k_loop = dedent(f"""\
        a_ptrs = l_ptr + base + offs_i[:, None] * N + offs_k[None, :]
        b_ptrs = r_ptr + base + offs_j[None, :] * N + offs_k[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, N, BLOCK_K):
            a = tl.load(a_ptrs, mask=(offs_i[:, None] < N) & (offs_k[None, :] < N - k0), other=0.0)
            bt = tl.load(b_ptrs, mask=(offs_k[:, None] < N - k0) & (offs_j[None, :] < N), other=0.0)
            acc = tl.dot(a, bt, acc{dot_kw})
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K""")
    if c.get("order") == "grouped":
        coords = dedent("""\
        num_pid_in_group = GROUP_M * num_pid_n
        group_id = tile // num_pid_in_group
        first_pid_m = group_id * GROUP_M
        group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + (tile % num_pid_in_group) % group_size_m
        pid_n = (tile % num_pid_in_group) // group_size_m""")
    else:
        coords = "pid_m = tile // num_pid_n\npid_n = tile % num_pid_n"
    tile_body = coords + "\n" + dedent("""\
    base = bh.to(tl.int64) * N * N
    offs_i = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_j = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)""") + "\n" + k_loop + "\n" + store + "\n" + (
        "tl.store(o_ptrs, acc, mask=(offs_i[:, None] < N) & (offs_j[None, :] < N))")
    head = "num_pid_m = tl.cdiv(N, BLOCK_M)\nnum_pid_n = tl.cdiv(N, BLOCK_N)\n"
    if c.get("grid") == "persistent":
        body = head + dedent("""\
        tiles = num_pid_m * num_pid_n
        for item in range(tl.program_id(0), tiles * BH, tl.num_programs(0)):
            bh = item // tiles
            tile = item % tiles
        """) + "\n" + indent(tile_body, 4)
    else:
        body = head + "tile = tl.program_id(0)\nbh = tl.program_id(1)\n" + tile_body
    meta = ["HID", "BLOCK_M", "BLOCK_N", "BLOCK_K"] + (["GROUP_M"] if c.get("order") == "grouped" else [])
    decorators = ""
    if c.get("tuning") == "autotune":
        configs = []
        for bm, bn, bk, w, s in CONFIG_SET:
            if not fits((bm, bn, bk, w, s), 2 if c["mm"] in ("bf16", "fp16") else 4):
                continue
            meta_vals = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
            if c.get("order") == "grouped":
                meta_vals["GROUP_M"] = c["group_m"]
            configs.append(glue.config(meta_vals, w, s))
        decorators = glue.autotune(configs, ["N", "HID"], for_check, c.get("check_config", 0)) + "\n"
    doc = (f"    \"\"\"out[b, i, j, h] = sum_k left[b, h, i, k] * right[b, h, j, k] (operands {c['mm']}, "
           "fp32 accumulation).\"\"\"")
    sig = "\n".join(f"    {m}: tl.constexpr," for m in meta)
    return (f"{decorators}@triton.jit\ndef _triangle_contraction_kernel(\n    l_ptr, r_ptr, o_ptr,\n    N, BH,\n"
            f"{sig}\n):\n{doc}\n" + indent(glue.ruler("the tile of one (batch, channel) product") + "\n" + body, 4))


def contraction_launch(c: Choices, for_check: bool, left: str, right: str, out: str) -> tuple[str, str, tuple]:
    """(module part for the SM count or '', launcher lines, imports) of the contraction."""
    tuned = c.get("tuning") == "autotune"
    group = f", GROUP_M={c['group_m']}" if c.get("order") == "grouped" else ""
    args = f"{left}, {right}, {out}, N, bs * hid, HID=hid"
    part, imports = "", ()
    if c.get("grid") == "persistent":
        part, sms = glue.sm_count_part(c["sms"], for_check)
        imports = ("functools",) if c["sms"] == "torch_props" and not for_check else ()
        if tuned:
            grid = (f"lambda META: (min({c['per_sm']} * {sms}, bs * hid * triton.cdiv(N, META[\"BLOCK_M\"]) "
                    "* triton.cdiv(N, META[\"BLOCK_N\"])),)")
        else:
            bm, bn = c["tile"][:2]
            grid = f"(min({c['per_sm']} * {sms}, bs * hid * triton.cdiv(N, {bm}) * triton.cdiv(N, {bn})),)"
    else:
        if tuned:
            grid = 'lambda META: (triton.cdiv(N, META["BLOCK_M"]) * triton.cdiv(N, META["BLOCK_N"]), bs * hid)'
        else:
            bm, bn = c["tile"][:2]
            grid = f"(triton.cdiv(N, {bm}) * triton.cdiv(N, {bn}), bs * hid)"
    if tuned:
        launch = f"grid = {grid}\n_triangle_contraction_kernel[grid]({args})"
    else:
        bm, bn, bk, w, s = c["tile"]
        launch = (f"grid = {grid}\n_triangle_contraction_kernel[grid]({args}, BLOCK_M={bm}, BLOCK_N={bn}, "
                  f"BLOCK_K={bk}{group}, num_warps={w}, num_stages={s})")
    return part, launch, imports


# =============================================================================================
# fused_three
# =============================================================================================


def _ln_stats(c: Choices) -> str:
    """Row statistics of a (BLOCK_T, dim) block of x, looped over dim in BLOCK_D chunks."""
    if c.get("ln_stats") == "two_pass":
        return dedent("""\
        acc = tl.zeros([BLOCK_T], dtype=tl.float32)
        for d0 in range(0, DIM, BLOCK_D):
            cols = d0 + offs_d
            xx = tl.load(x_ptr + toks[:, None] * DIM + cols[None, :], mask=t_mask[:, None] & (cols[None, :] < DIM), other=0.0)
            acc += tl.sum(xx, axis=1)
        mean = acc / DIM
        acc = tl.zeros([BLOCK_T], dtype=tl.float32)
        for d0 in range(0, DIM, BLOCK_D):
            cols = d0 + offs_d
            xm = t_mask[:, None] & (cols[None, :] < DIM)
            xx = tl.load(x_ptr + toks[:, None] * DIM + cols[None, :], mask=xm, other=0.0)
            xc = tl.where(xm, xx - mean[:, None], 0.0)
            acc += tl.sum(xc * xc, axis=1)
        rstd = 1.0 / tl.sqrt(acc / DIM + eps)""")
    return dedent("""\
    s1 = tl.zeros([BLOCK_T], dtype=tl.float32)
    s2 = tl.zeros([BLOCK_T], dtype=tl.float32)
    for d0 in range(0, DIM, BLOCK_D):
        cols = d0 + offs_d
        xx = tl.load(x_ptr + toks[:, None] * DIM + cols[None, :], mask=t_mask[:, None] & (cols[None, :] < DIM), other=0.0)
        s1 += tl.sum(xx, axis=1)
        s2 += tl.sum(xx * xx, axis=1)
    mean = s1 / DIM
    rstd = 1.0 / tl.sqrt(tl.maximum(s2 / DIM - mean * mean, 0.0) + eps)""")


def ln_proj_kernel(c: Choices) -> str:
    e_tl, _, _ = PRECISION[c["mm"]]
    edge_tl, edge_kw = EDGE[c["edge"]]
    return f'''\
@triton.jit
def _ln_proj_gate_kernel(
    x_ptr, mask_ptr, ln_w_ptr, ln_b_ptr, w_ptr, left_ptr, right_ptr, og_ptr,
    n_tok, NN, DIM, eps,
    HID: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """LayerNorm over dim, then one projection group of a token block: left (proj, gate), right
    (proj, gate) or the out gate; gated and masked operands are stored channel-first."""
    {glue.ruler("token block, projection group")}
    toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    group = tl.program_id(1)
    t_mask = toks < n_tok
    offs_d = tl.arange(0, BLOCK_D)
    offs_h = tl.arange(0, HID)
    {glue.ruler("LayerNorm statistics over dim, fp32")}
{indent(_ln_stats(c), 4)}
    {glue.ruler("normalised x times the group's weights (rows of the stacked (5 hid, dim) matrix)")}
    # groups 0 and 1: rows [2 g hid, 2 g hid + hid) project, the next hid rows gate; group 2 (the
    # out gate) uses rows [4 hid, 5 hid) for both accumulators
    p_rows = tl.where(group < 2, group * 2 * HID, 4 * HID) + offs_h
    g_rows = tl.where(group < 2, group * 2 * HID + HID, 4 * HID) + offs_h
    acc_p = tl.zeros([BLOCK_T, HID], dtype=tl.float32)
    acc_g = tl.zeros([BLOCK_T, HID], dtype=tl.float32)
    for d0 in range(0, DIM, BLOCK_D):
        cols = d0 + offs_d
        c_mask = cols < DIM
        xm = t_mask[:, None] & c_mask[None, :]
        xx = tl.load(x_ptr + toks[:, None] * DIM + cols[None, :], mask=xm, other=0.0)
        lw = tl.load(ln_w_ptr + cols, mask=c_mask, other=0.0)
        lb = tl.load(ln_b_ptr + cols, mask=c_mask, other=0.0)
        xn = tl.where(xm, (xx - mean[:, None]) * rstd[:, None] * lw[None, :] + lb[None, :], 0.0).to({edge_tl})
        wp = tl.load(w_ptr + p_rows[None, :] * DIM + cols[:, None], mask=c_mask[:, None], other=0.0).to({edge_tl})
        wg = tl.load(w_ptr + g_rows[None, :] * DIM + cols[:, None], mask=c_mask[:, None], other=0.0).to({edge_tl})
        acc_p = tl.dot(xn, wp, acc_p{edge_kw})
        acc_g = tl.dot(xn, wg, acc_g{edge_kw})
    {glue.ruler("gates and mask; left/right channel-first for the contraction")}
    b = toks // NN
    r = toks % NN
    if group == 2:
        tl.store(og_ptr + toks[:, None] * HID + offs_h[None, :], tl.sigmoid(acc_g), mask=t_mask[:, None])
    else:
        m = tl.load(mask_ptr + toks, mask=t_mask, other=0).to(tl.float32)
        val = (acc_p * m[:, None] * tl.sigmoid(acc_g)).to({e_tl})
        dst = (b[:, None] * HID + offs_h[None, :]) * NN + r[:, None]
        if group == 0:
            tl.store(left_ptr + dst, val, mask=t_mask[:, None])
        else:
            tl.store(right_ptr + dst, val, mask=t_mask[:, None])'''


def out_kernel(c: Choices) -> str:
    edge_tl, edge_kw = EDGE[c["edge"]]
    if c.get("out_layout", "token_major") == "token_major":
        load = "y = tl.load(c_ptr + toks[:, None] * HID + offs_h[None, :], mask=t_mask[:, None], other=0.0)"
    else:
        load = dedent("""\
        b = toks // NN
        r = toks % NN
        y = tl.load(c_ptr + (b[:, None] * HID + offs_h[None, :]) * NN + r[:, None], mask=t_mask[:, None], other=0.0)""")
    return f'''\
@triton.jit
def _out_norm_gate_proj_kernel(
    c_ptr, og_ptr, ln_w_ptr, ln_b_ptr, wo_ptr, y_ptr,
    n_tok, NN, DIM, eps,
    HID: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """LayerNorm over the channels, times the out gate, then the output projection."""
    toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_mask = toks < n_tok
    offs_h = tl.arange(0, HID)
    offs_d = tl.arange(0, BLOCK_D)
{indent(load, 4)}
    mean = tl.sum(y, axis=1) / HID
    yc = y - mean[:, None]
    rstd = 1.0 / tl.sqrt(tl.sum(yc * yc, axis=1) / HID + eps)
    lw = tl.load(ln_w_ptr + offs_h)
    lb = tl.load(ln_b_ptr + offs_h)
    gate = tl.load(og_ptr + toks[:, None] * HID + offs_h[None, :], mask=t_mask[:, None], other=0.0)
    yg = ((yc * rstd[:, None] * lw[None, :] + lb[None, :]) * gate).to({edge_tl})
    {glue.ruler("output projection in BLOCK_D column chunks")}
    for d0 in range(0, DIM, BLOCK_D):
        cols = d0 + offs_d
        w = tl.load(wo_ptr + cols[None, :] * HID + offs_h[:, None], mask=cols[None, :] < DIM, other=0.0).to({edge_tl})
        out = tl.dot(yg, w{edge_kw})
        tl.store(y_ptr + toks[:, None] * DIM + cols[None, :], out, mask=t_mask[:, None] & (cols[None, :] < DIM))'''


def _launcher(c: Choices, for_check: bool, doc: str, body: str) -> str:
    head = glue.guard_decorator(c["guard"]) + "def triangle_multiplication(x, mask, weights, hid):"
    launch = glue.guard_launch(c["guard"], body, "x", for_check)
    base = dedent("""\
    bs, N, _, dim = x.shape
    assert hid in (16, 32, 64, 128, 256), "the kernels hold a token's channels in one power-of-two block"
    n_tok = bs * N * N
    eps = 1e-5""")
    return "\n".join([head, glue.launcher_doc(doc), indent(base, 4), indent(launch, 4), "    return y"])


CUSTOM = '''\
def custom_kernel(data):
    x, mask, weights, config = data
    return triangle_multiplication(x, mask, weights, config["hidden_dim"])'''


def _finish(c: Choices, doc: str, parts: list[str], imports: tuple[str, ...], for_check: bool) -> str:
    parts = [glue.guard_part(c["guard"], for_check), *parts, CUSTOM]
    return glue.module(doc, parts, imports + glue.guard_imports(c["guard"], for_check))


def _out_alloc(c: Choices) -> str:
    if c.get("out_layout", "token_major") == "token_major":
        return "c = torch.empty((bs, N, N, hid), dtype=torch.float32, device=x.device)"
    return "c = torch.empty((bs, hid, N, N), dtype=torch.float32, device=x.device)"


def render_fused_three(c: Choices, for_check: bool) -> str:
    _, e_torch, _ = PRECISION[c["mm"]]
    bt, bd, warps = c["token_tile"]
    part, contract, imports = contraction_launch(c, for_check, "left", "right", "c")
    launch = dedent(f"""\
    w_cat = torch.cat([weights["left_proj.weight"], weights["left_gate.weight"], weights["right_proj.weight"],
                       weights["right_gate.weight"], weights["out_gate.weight"]], dim=0)  # (5 hid, dim)
    left = torch.empty((bs, hid, N, N), dtype={e_torch}, device=x.device)
    right = torch.empty((bs, hid, N, N), dtype={e_torch}, device=x.device)
    og = torch.empty((n_tok, hid), dtype=torch.float32, device=x.device)
    _ln_proj_gate_kernel[(triton.cdiv(n_tok, {bt}), 3)](
        x, mask, weights["norm.weight"], weights["norm.bias"], w_cat, left, right, og, n_tok, N * N, dim, eps,
        HID=hid, BLOCK_T={bt}, BLOCK_D={bd}, num_warps={warps})
    {_out_alloc(c)}
    """) + "\n" + contract + "\n" + dedent(f"""\
    y = torch.empty_like(x)
    _out_norm_gate_proj_kernel[(triton.cdiv(n_tok, {bt}),)](
        c, og, weights["to_out_norm.weight"], weights["to_out_norm.bias"], weights["to_out.weight"], y,
        n_tok, N * N, dim, eps, HID=hid, BLOCK_T={bt}, BLOCK_D={bd}, num_warps={warps})""")
    doc = _doc("three fused kernels", f"LayerNorm, the five projections ({c['edge']} dots), gates and mask in "
               f"one kernel writing {c['mm']} channel-first operands; the contraction as a batched matmul "
               f"({c['contraction']}); output LayerNorm, gate and projection fused.", c)
    parts = [part, ln_proj_kernel(c), contraction_kernel(c, for_check), out_kernel(c),
             _launcher(c, for_check, "Fused projections, contraction, fused output.", launch)]
    return _finish(c, doc, parts, imports, for_check)


def gate_kernel(c: Choices) -> str:
    e_tl, _, _ = PRECISION[c["mm"]]
    return f'''\
@triton.jit
def _gate_kernel(
    proj_ptr, mask_ptr, left_ptr, right_ptr, og_ptr,
    n_tok, NN,
    HID: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """Gates and mask of the five projections (n_tok, 5 hid); left/right stored channel-first."""
    toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_mask = toks < n_tok
    offs_h = tl.arange(0, HID)
    row = proj_ptr + toks[:, None] * (5 * HID) + offs_h[None, :]
    lp = tl.load(row, mask=t_mask[:, None], other=0.0).to(tl.float32)
    lg = tl.load(row + HID, mask=t_mask[:, None], other=0.0).to(tl.float32)
    rp = tl.load(row + 2 * HID, mask=t_mask[:, None], other=0.0).to(tl.float32)
    rg = tl.load(row + 3 * HID, mask=t_mask[:, None], other=0.0).to(tl.float32)
    og = tl.load(row + 4 * HID, mask=t_mask[:, None], other=0.0).to(tl.float32)
    m = tl.load(mask_ptr + toks, mask=t_mask, other=0).to(tl.float32)[:, None]
    b = toks // NN
    r = toks % NN
    dst = (b[:, None] * HID + offs_h[None, :]) * NN + r[:, None]
    tl.store(left_ptr + dst, (lp * m * tl.sigmoid(lg)).to({e_tl}), mask=t_mask[:, None])
    tl.store(right_ptr + dst, (rp * m * tl.sigmoid(rg)).to({e_tl}), mask=t_mask[:, None])
    tl.store(og_ptr + toks[:, None] * HID + offs_h[None, :], tl.sigmoid(og), mask=t_mask[:, None])'''


def render_torch_hybrid(c: Choices, for_check: bool) -> str:
    _, e_torch, _ = PRECISION[c["mm"]]
    proj_dtype = {"fp16": "torch.float16", "fp32": "torch.float32"}[c["proj"]]
    c2 = dict(c, out_layout="token_major")
    part, contract, imports = contraction_launch(c2, for_check, "left", "right", "c")
    launch = dedent(f"""\
    w_cat = torch.cat([weights["left_proj.weight"], weights["left_gate.weight"], weights["right_proj.weight"],
                       weights["right_gate.weight"], weights["out_gate.weight"]], dim=0)  # (5 hid, dim)
    xn = F.layer_norm(x, (dim,), weights["norm.weight"], weights["norm.bias"], eps)
    # one matmul for all five projections (PyTorch, {c["proj"]})
    proj = torch.matmul(xn.reshape(n_tok, dim).to({proj_dtype}), w_cat.to({proj_dtype}).t())
    left = torch.empty((bs, hid, N, N), dtype={e_torch}, device=x.device)
    right = torch.empty((bs, hid, N, N), dtype={e_torch}, device=x.device)
    og = torch.empty((n_tok, hid), dtype=torch.float32, device=x.device)
    _gate_kernel[(triton.cdiv(n_tok, {c["gate_block"]}),)](proj, mask, left, right, og, n_tok, N * N, HID=hid,
                                                         BLOCK_T={c["gate_block"]}, num_warps=4)
    c = torch.empty((bs, N, N, hid), dtype=torch.float32, device=x.device)
    """) + "\n" + contract + "\n" + dedent("""\
    out = F.layer_norm(c, (hid,), weights["to_out_norm.weight"], weights["to_out_norm.bias"], eps)
    y = torch.matmul(out * og.view(bs, N, N, hid), weights["to_out.weight"].t())""")
    doc = _doc("PyTorch around Triton gating and contraction", "LayerNorm and one concatenated "
               f"projection matmul ({c['proj']}) in PyTorch; a Triton kernel applies gates and mask and writes "
               f"{c['mm']} channel-first operands; the Triton contraction; PyTorch LayerNorm and linear for "
               "the output.", c2)
    parts = [part, gate_kernel(c), contraction_kernel(c2, for_check),
             _launcher(c2, for_check, "PyTorch edges, Triton core.", launch)]
    source = _finish(c2, doc, parts, imports, for_check)
    return source.replace("import torch\n", "import torch\nimport torch.nn.functional as F\n", 1)


def render_unfused(c: Choices, for_check: bool) -> str:
    lin_kw = ', input_precision="ieee"' if c["linear"] == "ieee" else ', input_precision="tf32"'
    bm, bn, bk = c["linear_tile"]
    kernels = f'''\
@triton.jit
def _layer_norm_rows_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
    """One row per program: y = LayerNorm(x) in fp32."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    tl.store(y_ptr + row * n_cols + cols, xc * rstd * w + b, mask=mask)


@triton.jit
def _linear_kernel(a_ptr, w_ptr, y_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y (M, N) = a (M, K) @ w (N, K)^T, fp32."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * K + ks[None, :], mask=(offs_m[:, None] < M) & (ks[None, :] < K), other=0.0)
        w = tl.load(w_ptr + offs_n[None, :] * K + ks[:, None], mask=(ks[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, w, acc{lin_kw})
    tl.store(y_ptr + offs_m[:, None] * N + offs_n[None, :], acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _gate_mask_kernel(p_ptr, g_ptr, mask_ptr, out_ptr, n_tok, NN, HID: tl.constexpr, BLOCK_T: tl.constexpr,
                      CHANNEL_FIRST: tl.constexpr):
    """out = p * mask * sigmoid(g), written channel-first (bs, hid, N, N) or token-major."""
    toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_mask = toks < n_tok
    offs_h = tl.arange(0, HID)
    src = toks[:, None] * HID + offs_h[None, :]
    p = tl.load(p_ptr + src, mask=t_mask[:, None], other=0.0)
    g = tl.load(g_ptr + src, mask=t_mask[:, None], other=0.0)
    m = tl.load(mask_ptr + toks, mask=t_mask, other=0).to(tl.float32)
    val = p * m[:, None] * tl.sigmoid(g)
    if CHANNEL_FIRST:
        dst = ((toks // NN)[:, None] * HID + offs_h[None, :]) * NN + (toks % NN)[:, None]
    else:
        dst = src
    tl.store(out_ptr + dst, val.to(out_ptr.dtype.element_ty), mask=t_mask[:, None])


@triton.jit
def _sigmoid_mul_kernel(a_ptr, g_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out = a * sigmoid(g), elementwise."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, a * tl.sigmoid(g), mask=mask)'''
    _, e_torch, _ = PRECISION[c["mm"]]
    c2 = dict(c, out_layout="token_major")
    part, contract, imports = contraction_launch(c2, for_check, "left", "right", "c")
    launch = dedent(f"""\
    def linear(a, w):
        out = torch.empty((a.shape[0], w.shape[0]), dtype=torch.float32, device=a.device)
        grid = (triton.cdiv(a.shape[0], {bm}), triton.cdiv(w.shape[0], {bn}))
        _linear_kernel[grid](a, w, out, a.shape[0], w.shape[0], a.shape[1], BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk})
        return out

    xn = torch.empty((n_tok, dim), dtype=torch.float32, device=x.device)
    _layer_norm_rows_kernel[(n_tok,)](x, weights["norm.weight"], weights["norm.bias"], xn, dim, eps,
                                      BLOCK=triton.next_power_of_2(dim))
    lp, lg = linear(xn, weights["left_proj.weight"]), linear(xn, weights["left_gate.weight"])
    rp, rg = linear(xn, weights["right_proj.weight"]), linear(xn, weights["right_gate.weight"])
    og = linear(xn, weights["out_gate.weight"])
    left = torch.empty((bs, hid, N, N), dtype={e_torch}, device=x.device)
    right = torch.empty((bs, hid, N, N), dtype={e_torch}, device=x.device)
    _gate_mask_kernel[(triton.cdiv(n_tok, 64),)](lp, lg, mask, left, n_tok, N * N, HID=hid, BLOCK_T=64, CHANNEL_FIRST=True)
    _gate_mask_kernel[(triton.cdiv(n_tok, 64),)](rp, rg, mask, right, n_tok, N * N, HID=hid, BLOCK_T=64, CHANNEL_FIRST=True)
    c = torch.empty((bs, N, N, hid), dtype=torch.float32, device=x.device)
    """) + "\n" + contract + "\n" + dedent("""\
    cn = torch.empty((n_tok, hid), dtype=torch.float32, device=x.device)
    _layer_norm_rows_kernel[(n_tok,)](c, weights["to_out_norm.weight"], weights["to_out_norm.bias"], cn, hid, eps,
                                      BLOCK=triton.next_power_of_2(hid))
    gated = torch.empty_like(cn)
    _sigmoid_mul_kernel[(triton.cdiv(n_tok * hid, 1024),)](cn, og, gated, n_tok * hid, BLOCK=1024)
    y = linear(gated, weights["to_out.weight"]).view(bs, N, N, dim)""")
    doc = _doc("one Triton kernel per step", "Row LayerNorm, five separate projection matmuls "
               f"({c['linear']} dots), gate kernels, the contraction, LayerNorm, gate multiply and the output "
               "matmul, every intermediate through HBM in fp32: about a dozen launches.", c2)
    parts = [part, kernels, contraction_kernel(c2, for_check), _launcher(c2, for_check, "A kernel per step.", launch)]
    return _finish(c2, doc, parts, imports, for_check)


def _contraction_knobs() -> dict:
    return {
        "mm": tuple(PRECISION),
        "contraction": lambda c: ("dot", "fma") if c["mm"] in ("tf32", "ieee") else ("dot",),
        "tuning": lambda c: ("autotune", "fixed") if c["contraction"] == "dot" else ("fixed",),
        "tile": lambda c: _tiles(c) if c["tuning"] == "fixed" else None,
        "order": ("grouped", "row_major"),
        "group_m": lambda c: (4, 8) if c["order"] == "grouped" else None,
        "grid": ("tiles", "persistent"),
        "sms": lambda c: glue.SM_SOURCES if c["grid"] == "persistent" else None,
        "per_sm": lambda c: (1, 2, 4) if c["grid"] == "persistent" else None,
    }


def _tiles(c: Choices) -> tuple:
    if c["contraction"] == "fma":
        return ((16, 16, 16, 1, 1), (32, 32, 8, 4, 1), (16, 64, 8, 2, 1))
    size = 2 if c["mm"] in ("bf16", "fp16") else 4
    return tuple(t for t in TILES if fits(t, size))


def _ln_proj_fits(c: Choices) -> bool:
    """The projection kernel pipelines (3 stages) an x tile and two weight tiles of the widest
    benchmark hidden size (128) in the edge dtype: they must fit shared memory."""
    bt, bd, _ = c["token_tile"]
    size = 2 if c["edge"] == "fp16" else 4
    return 3 * (bt * bd + 2 * bd * 128) * size <= SMEM_LIMIT


def space() -> TaskSpace:
    structures = (
        Structure("fused_three", "fused projections, contraction, fused output",
                  {"guard": glue.LAUNCH_GUARDS, **_contraction_knobs(), "edge": tuple(EDGE),
                   "ln_stats": ("raw", "two_pass"), "out_layout": ("token_major", "channel_first"),
                   "token_tile": ((32, 64, 4), (64, 32, 4), (64, 64, 8), (16, 32, 2), (128, 32, 8))},
                  render_fused_three, valid=_ln_proj_fits),
        Structure("torch_hybrid", "PyTorch edges around Triton gates and contraction",
                  {"guard": glue.LAUNCH_GUARDS, **_contraction_knobs(), "proj": ("fp16", "fp32"),
                   "gate_block": (16, 32, 64)}, render_torch_hybrid),
        Structure("unfused", "one Triton kernel per step",
                  {"guard": glue.LAUNCH_GUARDS, **_contraction_knobs(), "linear": ("tf32", "ieee"),
                   "linear_tile": ((64, 64, 32), (32, 32, 32), (128, 64, 32), (16, 64, 16))}, render_unfused),
    )
    return TaskSpace(TASK, structures)
