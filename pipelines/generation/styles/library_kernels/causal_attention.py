"""causal_attention as kernel libraries write it: softmax(q k^T / sqrt(D), causal) v for bf16
(B, H, S, D) tensors.

    flash            one program per (query block, batch x head), online softmax over key
                     blocks in fp32 (flash-attention 2 in Triton, tutorial 06): causal blocks
                     skipped and the diagonal masked apart, every visited block masked, or no
                     skipping at all (every key block visited, the mask does the work); offsets or
                     block pointers; exp or exp2 with a log2(e)-folded scale; query blocks in
                     launch order or heaviest first
    persistent       k x SM-count programs striding over the (query block, head) work items
    two_pass         a first pass over the keys for the row max and normaliser, a second that
                     recomputes the scores and accumulates normalised probabilities times v
    unfused          three kernels through HBM: scores (fp32 or bf16, S x S per head), a row
                     softmax writing bf16 probabilities, then probabilities @ v
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

TASK = "causal_attention"
LOG2E = "1.44269504"
SMEM_LIMIT = 232448
MAX_HEAD_DIM = 128  # the largest head dimension of the benchmarks

# (BLOCK_M, BLOCK_N, num_warps, num_stages)
TILES = ((128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2), (128, 32, 4, 4), (64, 64, 4, 3),
         (64, 32, 4, 4), (64, 64, 4, 2), (32, 32, 2, 2), (32, 16, 2, 3), (16, 16, 1, 2))
CONFIG_SETS = {
    "tutorial": ((128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 4)),
    "small": ((64, 32, 4, 4), (64, 64, 4, 2), (32, 32, 2, 2)),
}


def fits(tile: tuple, head_dim: int = MAX_HEAD_DIM) -> bool:
    """Shared memory of Q and the pipelined K/V tiles, and an fp32 accumulator and score tile of
    at most 128 registers a thread each."""
    bm, bn, warps, stages = tile
    smem = bm * head_dim * 2 + stages * 2 * bn * head_dim * 2
    threads = 32 * warps
    return smem <= SMEM_LIMIT * 0.8 and bm * head_dim // threads <= 128 and bm * bn // threads <= 128


def _doc(title: str, text: str, c: Choices) -> str:
    return (f"Causal self-attention forward, bf16 (B, H, S, D): {title}.\n\n{glue.wrap_doc(text)}")


SIGNATURE = """\
    Q, K, V, Out, sm_scale,
    stride_qz, stride_qh, stride_qm, stride_qk,
    stride_kz, stride_kh, stride_kn, stride_kk,
    stride_vz, stride_vh, stride_vn, stride_vk,
    stride_oz, stride_oh, stride_om, stride_ok,
    H, N_CTX,"""

ARGS = ("q, k, v, o, sm_scale, *q.stride(), *k.stride(), *v.stride(), *o.stride(), H, S")


def _exp(c: Choices) -> str:
    return "tl.exp2" if c.get("exp") == "exp2" else "tl.exp"


def _scale_expr(c: Choices) -> str:
    return f"sm_scale * {LOG2E}" if c.get("exp") == "exp2" else "sm_scale"


def inner_helper(c: Choices) -> str:
    """The online-softmax step over key blocks [lo, hi) as a @triton.jit helper."""
    if c.get("k_layout") == "trans":
        k_load = dedent("""\
        k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kk, mask=cols[:, None] < N_CTX, other=0.0)
        qk = tl.dot(q, tl.trans(k))""")
    else:
        k_load = dedent("""\
        k = tl.load(k_base + offs_d[:, None] * stride_kk + cols[None, :] * stride_kn, mask=cols[None, :] < N_CTX, other=0.0)
        qk = tl.dot(q, k)""")
    loop = f"tl.range(lo, hi, BLOCK_N, num_stages={c['loop_stages']})" if c.get("loop_stages") else "range(lo, hi, BLOCK_N)"
    exp = _exp(c)
    return f'''\
@triton.jit
def _attn_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kk, stride_vn, stride_vk,
                qk_scale, lo, hi, offs_m, offs_n, offs_d, N_CTX,
                BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """Online softmax over key blocks [lo, hi): rescale the running output and normaliser."""
    for start_n in {loop}:
        cols = start_n + offs_n
{indent(k_load, 8)}
        if MASKED:
            keep = offs_m[:, None] >= cols[None, :]
            qk = tl.where(keep, qk * qk_scale, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = {exp}(qk)
        alpha = {exp}(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vk, mask=cols[:, None] < N_CTX, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    return acc, l_i, m_i'''


def _calls(c: Choices) -> str:
    """The key-block loops of one query block, by masking mode."""
    call = ("acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kk, stride_vn, "
            "stride_vk, qk_scale, {lo}, {hi}, offs_m, offs_n, offs_d, N_CTX, BLOCK_N, {masked})")
    mode = c["masking"]
    if mode == "split_diagonal":
        return "\n".join([
            "# blocks wholly below the diagonal need no mask; the diagonal blocks do",
            call.format(lo="0", hi="start_m * BLOCK_M", masked="False"),
            call.format(lo="start_m * BLOCK_M", hi="tl.minimum((start_m + 1) * BLOCK_M, N_CTX)", masked="True"),
        ])
    if mode == "mask_visited":
        return ("# every visited block masked; blocks above the diagonal skipped\n"
                + call.format(lo="0", hi="tl.minimum((start_m + 1) * BLOCK_M, N_CTX)", masked="True"))
    return ("# every key block visited: the mask alone makes it causal\n"
            + call.format(lo="0", hi="N_CTX", masked="True"))


def _block_setup(c: Choices) -> str:
    """q, the running statistics and the bases of one (query block, head)."""
    off = "off_z.to(tl.int64) * stride_{t}z + off_h.to(tl.int64) * stride_{t}h" if c.get("int64") else (
        "off_z * stride_{t}z + off_h * stride_{t}h")
    return dedent(f"""\
    off_z = off_hz // H
    off_h = off_hz % H
    q_base = Q + {off.format(t="q")}
    k_base = K + {off.format(t="k")}
    v_base = V + {off.format(t="v")}
    o_base = Out + {off.format(t="o")}
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk, mask=offs_m[:, None] < N_CTX, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = {_scale_expr(c)}""")


STORE = dedent("""\
acc = acc / l_i[:, None]
tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_ok, acc.to(Out.dtype.element_ty), mask=offs_m[:, None] < N_CTX)""")


def _program_map(c: Choices) -> str:
    m = "tl.num_programs({a}) - 1 - tl.program_id({a})" if c.get("heavy_first") else "tl.program_id({a})"
    if c.get("grid_order", "m_major") == "m_major":
        return f"start_m = {m.format(a=0)}\noff_hz = tl.program_id(1)"
    return f"off_hz = tl.program_id(0)\nstart_m = {m.format(a=1)}"


def _launcher(c: Choices, for_check: bool, doc: str, body: str) -> str:
    head = glue.guard_decorator(c["guard"]) + "def attention_forward(q, k, v):"
    base = dedent("""\
    B, H, S, D = q.shape
    assert k.shape == q.shape and v.shape == q.shape and D in (16, 32, 64, 128, 256), "q, k, v: (B, H, S, D)"
    o = torch.empty_like(q)
    sm_scale = D ** -0.5""")
    launch = glue.guard_launch(c["guard"], body, "q", for_check)
    return "\n".join([head, glue.launcher_doc(doc), indent(base, 4), indent(launch, 4), "    return o"])


CUSTOM = '''\
def custom_kernel(data):
    q, k, v = data
    return attention_forward(q, k, v)'''


def _finish(c: Choices, doc: str, parts: list[str], imports: tuple[str, ...], for_check: bool) -> str:
    parts = [glue.guard_part(c["guard"], for_check), *parts, CUSTOM]
    return glue.module(doc, parts, imports + glue.guard_imports(c["guard"], for_check))


def _grid(c: Choices, bm: str) -> str:
    if c.get("grid_order", "m_major") == "m_major":
        return f"(triton.cdiv(S, {bm}), B * H)"
    return f"(B * H, triton.cdiv(S, {bm}))"


def render_flash(c: Choices, for_check: bool) -> str:
    if c["pointers"] == "block_ptr":
        return render_flash_block_ptr(c, for_check)
    body = (glue.ruler("this program's query block and head") + "\n" + _program_map(c) + "\n" + _block_setup(c) + "\n"
            + glue.ruler("online softmax over the key blocks") + "\n" + _calls(c) + "\n" + STORE)
    decorators = ""
    tuned = c["tuning"] == "autotune"
    if tuned:
        configs = [glue.config({"BLOCK_M": bm, "BLOCK_N": bn}, w, s) for bm, bn, w, s in CONFIG_SETS[c["config_set"]]
                   if c["masking"] != "split_diagonal" or bm % bn == 0]
        decorators = glue.autotune(configs, ["N_CTX", "HEAD_DIM"], for_check, c.get("check_config", 0)) + "\n"
    kernel = (f"{decorators}@triton.jit\ndef _attn_fwd(\n{SIGNATURE}\n    HEAD_DIM: tl.constexpr,\n"
              "    BLOCK_M: tl.constexpr,\n    BLOCK_N: tl.constexpr,\n):\n" + indent(body, 4))
    if tuned:
        grid = _grid(c, 'META["BLOCK_M"]')
        launch = f"grid = lambda META: {grid}\n_attn_fwd[grid]({ARGS}, HEAD_DIM=D)"
    else:
        bm, bn, warps, stages = c["tile"]
        launch = (f"grid = {_grid(c, str(bm))}\n"
                  f"_attn_fwd[grid]({ARGS}, HEAD_DIM=D, BLOCK_M={bm}, BLOCK_N={bn}, num_warps={warps}, num_stages={stages})")
    skip = {"split_diagonal": "key blocks above the diagonal are skipped and only the diagonal blocks "
                              "are masked", "mask_visited": "key blocks above the diagonal are skipped, "
                              "every visited block is masked", "no_skip": "every key block is visited and "
                              "masked (twice the causal work)"}[c["masking"]]
    doc = _doc("flash attention, one program per query block and head",
               f"Scores stay on chip: q @ k^T and p @ v on tensor cores with fp32 online softmax; {skip}.", c)
    return _finish(c, doc, [inner_helper(c), kernel, _launcher(c, for_check, "Flash attention forward.", launch)],
                   (), for_check)


def render_flash_block_ptr(c: Choices, for_check: bool) -> str:
    exp = _exp(c)
    mode = c["masking"]
    hi = "N_CTX" if mode == "no_skip" else "tl.minimum((start_m + 1) * BLOCK_M, N_CTX)"
    off = "off_z.to(tl.int64) * stride_{t}z + off_h.to(tl.int64) * stride_{t}h" if c.get("int64") else (
        "off_z * stride_{t}z + off_h * stride_{t}h")
    body = glue.ruler("block pointers to this head's q, k^T, v and output") + "\n" + _program_map(c) + "\n" + dedent(f"""\
    off_z = off_hz // H
    off_h = off_hz % H
    q_block = tl.make_block_ptr(base=Q + {off.format(t="q")}, shape=(N_CTX, HEAD_DIM), strides=(stride_qm, stride_qk),
                                offsets=(start_m * BLOCK_M, 0), block_shape=(BLOCK_M, HEAD_DIM), order=(1, 0))
    kt_block = tl.make_block_ptr(base=K + {off.format(t="k")}, shape=(HEAD_DIM, N_CTX), strides=(stride_kk, stride_kn),
                                 offsets=(0, 0), block_shape=(HEAD_DIM, BLOCK_N), order=(0, 1))
    v_block = tl.make_block_ptr(base=V + {off.format(t="v")}, shape=(N_CTX, HEAD_DIM), strides=(stride_vn, stride_vk),
                                offsets=(0, 0), block_shape=(BLOCK_N, HEAD_DIM), order=(1, 0))
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    q = tl.load(q_block, boundary_check=(0, 1), padding_option="zero")
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = {_scale_expr(c)}
    {glue.ruler("online softmax over the key blocks, masked by position")}
    for start_n in range(0, {hi}, BLOCK_N):
        k = tl.load(kt_block, boundary_check=(0, 1), padding_option="zero")
        qk = tl.dot(q, k)
        keep = offs_m[:, None] >= (start_n + offs_n)[None, :]
        qk = tl.where(keep, qk * qk_scale, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = {exp}(qk - m_ij[:, None])
        alpha = {exp}(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_block, boundary_check=(0, 1), padding_option="zero")
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
        kt_block = tl.advance(kt_block, (0, BLOCK_N))
        v_block = tl.advance(v_block, (BLOCK_N, 0))
    acc = acc / l_i[:, None]
    o_block = tl.make_block_ptr(base=Out + {off.format(t="o")}, shape=(N_CTX, HEAD_DIM), strides=(stride_om, stride_ok),
                                offsets=(start_m * BLOCK_M, 0), block_shape=(BLOCK_M, HEAD_DIM), order=(1, 0))
    tl.store(o_block, acc.to(Out.dtype.element_ty), boundary_check=(0, 1))""")
    kernel = (f"@triton.jit\ndef _attn_fwd_block_ptr(\n{SIGNATURE}\n    HEAD_DIM: tl.constexpr,\n"
              "    BLOCK_M: tl.constexpr,\n    BLOCK_N: tl.constexpr,\n):\n" + indent(body, 4))
    bm, bn, warps, stages = c["tile"]
    launch = (f"grid = {_grid(c, str(bm))}\n_attn_fwd_block_ptr[grid]({ARGS}, HEAD_DIM=D, BLOCK_M={bm}, BLOCK_N={bn}, "
              f"num_warps={warps}, num_stages={stages})")
    doc = _doc("flash attention through block pointers",
               "q, k^T, v and the output are addressed with tl.make_block_ptr (zero padding at the "
               "sequence end) and advanced along the keys; every visited key block is masked by position"
               + (", all of them visited." if mode == "no_skip" else ", blocks above the diagonal skipped."), c)
    return _finish(c, doc, [kernel, _launcher(c, for_check, "Flash attention forward, block pointers.", launch)],
                   (), for_check)


def render_persistent(c: Choices, for_check: bool) -> str:
    order = c["work_order"]
    if order == "heads_inner_heavy_first":
        coords = "start_m = num_m - 1 - work // BH\noff_hz = work % BH"
    elif order == "heads_inner":
        coords = "start_m = work // BH\noff_hz = work % BH"
    else:
        coords = "off_hz = work // num_m\nstart_m = work % num_m"
    body = glue.ruler("persistent: each program walks (query block, head) work items") + "\n" + dedent("""\
    num_m = tl.cdiv(N_CTX, BLOCK_M)
    BH = H * Z
    total = num_m * BH
    for work in range(tl.program_id(0), total, tl.num_programs(0)):
    """) + "\n" + indent(coords + "\n" + _block_setup(c) + "\n" + _calls(c) + "\n" + STORE, 4)
    kernel = (f"@triton.jit\ndef _attn_fwd_persistent(\n{SIGNATURE}\n    Z,\n    HEAD_DIM: tl.constexpr,\n"
              "    BLOCK_M: tl.constexpr,\n    BLOCK_N: tl.constexpr,\n):\n" + indent(body, 4))
    code, sms = glue.sm_count_part(c["sms"], for_check)
    sms = sms.replace("x.device", "q.device")
    bm, bn, warps, stages = c["tile"]
    launch = dedent(f"""\
    work = triton.cdiv(S, {bm}) * B * H
    grid = (min(work, {c["per_sm"]} * {sms}),)
    _attn_fwd_persistent[grid]({ARGS}, B, HEAD_DIM=D, BLOCK_M={bm}, BLOCK_N={bn}, num_warps={warps}, num_stages={stages})""")
    doc = _doc("flash attention on a persistent grid",
               f"The grid is sized from the SM count; each program takes work items in {order.replace('_', ' ')} "
               "order and runs the online-softmax loop of one query block of one head.", c)
    imports = ("functools",) if c["sms"] == "torch_props" and not for_check else ()
    return _finish(c, doc, [code, inner_helper(c), kernel,
                            _launcher(c, for_check, "Persistent flash attention forward.", launch)], imports, for_check)


def render_two_pass(c: Choices, for_check: bool) -> str:
    exp = _exp(c)
    hi = "N_CTX" if c["masking"] == "no_skip" else "tl.minimum((start_m + 1) * BLOCK_M, N_CTX)"
    body = (glue.ruler("this program's query block and head") + "\n" + _program_map(c) + "\n" + _block_setup(c) + "\n"
            + dedent(f"""\
    {glue.ruler("first pass: row max and normaliser from q @ k^T alone")}
    for start_n in range(0, {hi}, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(k_base + offs_d[:, None] * stride_kk + cols[None, :] * stride_kn, mask=cols[None, :] < N_CTX, other=0.0)
        qk = tl.where(offs_m[:, None] >= cols[None, :], tl.dot(q, k) * qk_scale, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        l_i = l_i * {exp}(m_i - m_ij) + tl.sum({exp}(qk - m_ij[:, None]), 1)
        m_i = m_ij
    inv_l = 1.0 / l_i
    {glue.ruler("second pass: recompute the scores, accumulate normalised p @ v")}
    for start_n in range(0, {hi}, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(k_base + offs_d[:, None] * stride_kk + cols[None, :] * stride_kn, mask=cols[None, :] < N_CTX, other=0.0)
        qk = tl.where(offs_m[:, None] >= cols[None, :], tl.dot(q, k) * qk_scale, float("-inf"))
        p = {exp}(qk - m_i[:, None]) * inv_l[:, None]
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vk, mask=cols[:, None] < N_CTX, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc)
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_ok, acc.to(Out.dtype.element_ty), mask=offs_m[:, None] < N_CTX)"""))
    kernel = (f"@triton.jit\ndef _attn_fwd_two_pass(\n{SIGNATURE}\n    HEAD_DIM: tl.constexpr,\n"
              "    BLOCK_M: tl.constexpr,\n    BLOCK_N: tl.constexpr,\n):\n" + indent(body, 4))
    bm, bn, warps, stages = c["tile"]
    launch = (f"grid = {_grid(c, str(bm))}\n_attn_fwd_two_pass[grid]({ARGS}, HEAD_DIM=D, BLOCK_M={bm}, BLOCK_N={bn}, "
              f"num_warps={warps}, num_stages={stages})")
    doc = _doc("two passes over the keys", "The first pass finds each row's max and normaliser, the "
               "second recomputes q @ k^T and adds exactly normalised probabilities times v: no rescaling "
               "of the accumulator, twice the score work.", c)
    return _finish(c, doc, [kernel, _launcher(c, for_check, "Two-pass attention forward.", launch)], (), for_check)


def render_unfused(c: Choices, for_check: bool) -> str:
    bm, bn, warps = c["score_tile"]
    s_tl = "tl.float32" if c["scores"] == "fp32" else "tl.bfloat16"
    s_torch = "torch.float32" if c["scores"] == "fp32" else "torch.bfloat16"
    skip = c["skip_upper"]
    scores_kernel = f"""\
@triton.jit
def _scores_kernel(
    Q, K, S_ptr, sm_scale,
    stride_qh, stride_qm, stride_kh, stride_kn, stride_sh, stride_sm,
    N_CTX,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    {glue.ruler("grid (query blocks, key blocks, heads): scaled, masked q @ k^T")}
    start_m = tl.program_id(0)
    start_n = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
{"    if start_n * BLOCK_N > start_m * BLOCK_M + BLOCK_M - 1:" + chr(10) + "        return  # wholly above the diagonal: left at -inf" if skip else ""}
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + bh * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :], mask=offs_m[:, None] < N_CTX, other=0.0)
    k = tl.load(K + bh * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :], mask=offs_n[:, None] < N_CTX, other=0.0)
    s = tl.dot(q, tl.trans(k)) * sm_scale
    s = tl.where(offs_m[:, None] >= offs_n[None, :], s, float("-inf"))
    mask = (offs_m[:, None] < N_CTX) & (offs_n[None, :] < N_CTX)
    tl.store(S_ptr + bh * stride_sh + offs_m[:, None] * stride_sm + offs_n[None, :], s.to({s_tl}), mask=mask)"""
    softmax_kernel = f"""\
@triton.jit
def _row_softmax_kernel(
    S_ptr, P_ptr, n_cols,
    BLOCK: tl.constexpr,
):
    {glue.ruler("one program per score row: softmax in fp32, bf16 probabilities out")}
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    s = tl.load(S_ptr + row * n_cols + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
    e = tl.exp(s - tl.max(s, axis=0))
    tl.store(P_ptr + row * n_cols + cols, (e / tl.sum(e, axis=0)).to(tl.bfloat16), mask=cols < n_cols)"""
    hi = "tl.minimum(start_m * BLOCK_M + BLOCK_M, N_CTX)" if skip else "N_CTX"
    pv_kernel = f"""\
@triton.jit
def _pv_kernel(
    P_ptr, V, Out,
    stride_ph, stride_pm, stride_vh, stride_vn, stride_oh, stride_om,
    N_CTX,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    {glue.ruler("grid (query blocks, heads): probabilities @ v")}
    start_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, {hi}, BLOCK_N):
        cols = start_n + offs_n
        p = tl.load(P_ptr + bh * stride_ph + offs_m[:, None] * stride_pm + cols[None, :],
                    mask=(offs_m[:, None] < N_CTX) & (cols[None, :] < N_CTX), other=0.0)
        v = tl.load(V + bh * stride_vh + cols[:, None] * stride_vn + offs_d[None, :], mask=cols[:, None] < N_CTX, other=0.0)
        acc = tl.dot(p, v, acc)
    tl.store(Out + bh * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :], acc.to(tl.bfloat16), mask=offs_m[:, None] < N_CTX)"""
    alloc = (f"scores = torch.full((B * H, S, S), float(\"-inf\"), dtype={s_torch}, device=q.device)" if skip else
             f"scores = torch.empty((B * H, S, S), dtype={s_torch}, device=q.device)")
    launch = dedent(f"""\
    qf, kf, vf, of = (t.reshape(B * H, S, D) for t in (q, k, v, o))
    {alloc}
    _scores_kernel[(triton.cdiv(S, {bm}), triton.cdiv(S, {bn}), B * H)](
        qf, kf, scores, sm_scale, qf.stride(0), qf.stride(1), kf.stride(0), kf.stride(1), scores.stride(0), scores.stride(1), S,
        HEAD_DIM=D, BLOCK_M={bm}, BLOCK_N={bn}, num_warps={warps})
    probs = torch.empty((B * H, S, S), dtype=torch.bfloat16, device=q.device)
    _row_softmax_kernel[(B * H * S,)](scores, probs, S, BLOCK=triton.next_power_of_2(S), num_warps={c["softmax_warps"]})
    _pv_kernel[(triton.cdiv(S, {c["pv_block_m"]}), B * H)](
        probs, vf, of, probs.stride(0), probs.stride(1), vf.stride(0), vf.stride(1), of.stride(0), of.stride(1), S,
        HEAD_DIM=D, BLOCK_M={c["pv_block_m"]}, BLOCK_N=64, num_warps=4)""")
    doc = _doc("three kernels through HBM: scores, softmax, probabilities @ v",
               f"The textbook formulation in Triton: an {c['scores']} (S, S) score matrix per head is written"
               f"{', upper blocks skipped (pre-filled with -inf)' if skip else ' whole'}, a row softmax "
               "writes bf16 probabilities, and a third kernel multiplies them with v.", c)
    return _finish(c, doc, [scores_kernel, softmax_kernel, pv_kernel,
                            _launcher(c, for_check, "Unfused attention forward.", launch)], (), for_check)


def space() -> TaskSpace:
    tiles = tuple(t for t in TILES if fits(t))
    common = {"guard": glue.LAUNCH_GUARDS, "exp": ("exp", "exp2"), "int64": (False, True)}
    order = {"grid_order": ("m_major", "bh_major"), "heavy_first": (False, True)}
    structures = (
        Structure("flash", "online softmax over key blocks, one program per query block and head",
                  {**common, **order, "pointers": ("offsets", "block_ptr"),
                   "masking": lambda c: ("split_diagonal", "mask_visited", "no_skip") if c["pointers"] == "offsets"
                   else ("mask_visited", "no_skip"),
                   "tuning": lambda c: ("autotune", "fixed") if c["pointers"] == "offsets" else ("fixed",),
                   "config_set": lambda c: tuple(CONFIG_SETS) if c["tuning"] == "autotune" else None,
                   "tile": lambda c: tiles if c["tuning"] == "fixed" else None,
                   "k_layout": lambda c: ("transposed_load", "trans") if c["pointers"] == "offsets" else None,
                   "loop_stages": lambda c: (None, 2, 3) if c["pointers"] == "offsets" else None},
                  render_flash, valid=_split_ok),
        Structure("persistent", "SM-sized grid over (query block, head) work items",
                  {**common, "sms": glue.SM_SOURCES, "per_sm": (1, 2, 4),
                   "work_order": ("heads_inner", "heads_inner_heavy_first", "blocks_inner"),
                   "masking": ("split_diagonal", "mask_visited"), "tile": tiles,
                   "k_layout": ("transposed_load", "trans"), "loop_stages": (None, 2)},
                  render_persistent, valid=_split_ok),
        Structure("two_pass", "statistics pass, then normalised output pass",
                  {**common, **order, "masking": ("mask_visited", "no_skip"), "tile": tiles}, render_two_pass),
        Structure("unfused", "scores, softmax and p @ v kernels through HBM",
                  {"guard": glue.LAUNCH_GUARDS, "scores": ("fp32", "bf16"), "skip_upper": (False, True),
                   "score_tile": ((64, 64, 4), (128, 64, 4), (64, 32, 2), (32, 32, 2)),
                   "softmax_warps": (4, 8, 16), "pv_block_m": (32, 64, 128)}, render_unfused),
    )
    return TaskSpace(TASK, structures)


def _split_ok(c: Choices) -> bool:
    """Separating the diagonal needs whole key blocks inside a query block."""
    if c.get("masking") != "split_diagonal" or "tile" not in c:
        return True
    return c["tile"][0] % c["tile"][1] == 0
