"""gdn_chunk_fwd_o as flash-linear-attention-style code writes it: the output of chunked Gated
DeltaNet, chunk size 64.

For chunk n and head h (qs = q * scale): o = exp(g) * qs @ h[n] + (causal, gated qs @ k^T) @ v.

    chunk_tiled     grid (V / BV, chunks, B x H): each program accumulates q @ h and q @ k^T over
                    K in BK slices, gates and masks the (64, 64) score block and adds it times v
                    (flash-linear-attention's chunk_fwd_o): block pointers or offsets, autotuned
                    over BK / BV / warps / stages or fixed
    whole_head      grid (chunks, B x H): K and V whole in one program (one dot each)
    persistent      k x SM-count programs striding over the (V tile, chunk, head) items
    scores_first    two kernels: the gated, masked (64, 64) scores of every chunk go to HBM in
                    fp32, a second kernel reads them back for the output
    inter_then_intra two kernels: the inter-chunk term exp(g) q @ h to an fp32 buffer, then the
                    intra-chunk term added to it
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

TASK = "gdn_chunk_fwd_o"
LOG2E = "1.4426950408889634"

CONFIG_SETS = {
    "fla": ((64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 4, 2), (64, 128, 8, 2), (32, 64, 2, 3)),
    "narrow": ((32, 32, 2, 2), (64, 32, 4, 3), (32, 64, 4, 4)),
}  # (BK, BV, num_warps, num_stages)


def _doc(title: str, text: str, c: Choices) -> str:
    return (f"Gated DeltaNet chunked output (chunk size 64): {title}.\n\n{glue.wrap_doc(text)}\n\n"
            "o[i] = scale * (exp(g[i]) q[i] @ h[n] + sum_(j <= i in the chunk) (q[i] . k[j]) exp(g[i] - g[j]) "
            f"v[j]).")


def _gate(c: Choices, arg: str) -> str:
    if c.get("exp") == "exp2":
        return f"tl.exp2(({arg}) * {LOG2E})"
    return f"tl.exp({arg})"


SIGNATURE = """\
    # q, k (B, T, H, K), v and o (B, T, H, V), h (B, NT, H, K, V) bf16; g (B, T, H) fp32
    q, k, v, h, g, o, scale,
    T, H, K, V, NT,"""

ARGS = "q, k, v, h, g, o, scale, T, H, K, V, NT"


def _heads(c: Choices) -> str:
    """Bases of this (batch, head, chunk): token offset `bos` and the pointer offsets."""
    cast = ".to(tl.int64)" if c.get("int64") else ""
    return dedent(f"""\
    i_b = i_bh // H
    i_h = i_bh % H
    bos = i_b{cast} * T
    o_t = tl.arange(0, BT)
    t = i_t * BT + o_t
    m_t = t < T""")


def _accumulate_offsets(c: Choices, with_inter: bool = True, with_intra: bool = True) -> str:
    """b_o (q @ h) and b_A (q @ k^T) accumulated over K with plain pointer offsets."""
    lines = ["o_v = i_v * BV + tl.arange(0, BV)", "m_v = o_v < V"]
    if with_inter:
        lines.append("b_o = tl.zeros([BT, BV], dtype=tl.float32)")
    if with_intra:
        lines.append("b_A = tl.zeros([BT, BT], dtype=tl.float32)")
    lines.append("for i_k in range(tl.cdiv(K, BK)):")
    body = [
        "o_k = i_k * BK + tl.arange(0, BK)",
        "m_k = o_k < K",
        "b_q = tl.load(q + ((bos + t) * H + i_h)[:, None] * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0)",
    ]
    if with_intra:
        body.append("b_kt = tl.load(k + ((bos + t) * H + i_h)[None, :] * K + o_k[:, None], "
                    "mask=m_k[:, None] & m_t[None, :], other=0.0)")
    if with_inter:
        body.append("b_h = tl.load(h + ((i_b * NT + i_t) * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :], "
                    "mask=m_k[:, None] & m_v[None, :], other=0.0)")
        body.append("b_o += tl.dot(b_q, b_h)")
    if with_intra:
        body.append("b_A += tl.dot(b_q, b_kt)")
    return "\n".join(lines) + "\n" + indent("\n".join(body), 4)


def _accumulate_block_ptr(c: Choices) -> str:
    """The same accumulation through block pointers (flash-linear-attention's habit)."""
    return dedent("""\
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        p_q = tl.make_block_ptr(q + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
        p_k = tl.make_block_ptr(k + (bos * H + i_h) * K, (K, T), (1, H * K), (i_k * BK, i_t * BT), (BK, BT), (0, 1))
        p_h = tl.make_block_ptr(h + ((i_b * NT + i_t) * H + i_h) * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_q = tl.load(p_q, boundary_check=(0, 1))
        b_k = tl.load(p_k, boundary_check=(0, 1))
        b_h = tl.load(p_h, boundary_check=(0, 1))
        b_o += tl.dot(b_q, b_h)
        b_A += tl.dot(b_q, b_k)""")


def _gate_and_mix(c: Choices, block_ptr: bool) -> str:
    """Gate both terms, mask the scores causally, add scores @ v, store o."""
    a_cast = "b_A.to(b_v.dtype)" if c.get("a_dtype", "bf16") == "bf16" else "b_A"
    v_cast = "b_v" if c.get("a_dtype", "bf16") == "bf16" else "b_v.to(tl.float32)"
    if block_ptr:
        loads = dedent("""\
        p_g = tl.make_block_ptr(g + bos * H + i_h, (T,), (H,), (i_t * BT,), (BT,), (0,))
        p_v = tl.make_block_ptr(v + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        p_o = tl.make_block_ptr(o + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        b_g = tl.load(p_g, boundary_check=(0,))
        b_v = tl.load(p_v, boundary_check=(0, 1))""")
        store = "tl.store(p_o, b_o.to(p_o.dtype.element_ty), boundary_check=(0, 1))"
    else:
        loads = dedent("""\
        b_g = tl.load(g + (bos + t) * H + i_h, mask=m_t, other=0.0)
        b_v = tl.load(v + ((bos + t) * H + i_h)[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)""")
        store = ("tl.store(o + ((bos + t) * H + i_h)[:, None] * V + o_v[None, :], b_o.to(o.dtype.element_ty), "
                 "mask=m_t[:, None] & m_v[None, :])")
    return loads + "\n" + dedent(f"""\
    {glue.ruler("gates: exp(g_i) on the state term, exp(g_i - g_j) on the causal scores")}
    b_o = b_o * {_gate(c, "b_g")}[:, None]
    causal = o_t[:, None] >= o_t[None, :]
    b_A = tl.where(causal, b_A * {_gate(c, "b_g[:, None] - b_g[None, :]")}, 0.0)
    b_o = (b_o + tl.dot({a_cast}, {v_cast})) * scale
    """) + "\n" + store


def _kernel(name: str, body: str, meta: list[str], decorators: str = "", extra_sig: str = "") -> str:
    sig = SIGNATURE + extra_sig + "\n" + "\n".join(f"    {m}: tl.constexpr," for m in meta)
    return f"{decorators}@triton.jit\ndef {name}(\n{sig}\n):\n" + indent(body, 4)


def _launcher(c: Choices, for_check: bool, doc: str, body: str, allocs: str = "") -> str:
    head = glue.guard_decorator(c["guard"]) + "def chunk_gated_delta_rule_fwd_o(q, k, v, h, g, scale):"
    base = dedent("""\
    B, T, H, K = q.shape
    V = v.shape[-1]
    BT = 64  # chunk size: h holds one state per 64 tokens
    NT = triton.cdiv(T, BT)
    assert h.shape == (B, NT, H, K, V), "h: (B, NT, H, K, V)"
    o = torch.empty_like(v)""")
    if allocs:
        base += "\n" + allocs
    launch = glue.guard_launch(c["guard"], body, "q", for_check)
    return "\n".join([head, glue.launcher_doc(doc), indent(base, 4), indent(launch, 4), "    return o"])


CUSTOM = '''\
def custom_kernel(data):
    q, k, v, h, g, scale = data
    return chunk_gated_delta_rule_fwd_o(q, k, v, h, g, scale)'''


def _finish(c: Choices, doc: str, parts: list[str], imports: tuple[str, ...], for_check: bool) -> str:
    parts = [glue.guard_part(c["guard"], for_check), *parts, CUSTOM]
    return glue.module(doc, parts, imports + glue.guard_imports(c["guard"], for_check))


def _block_sizes(bk: int, bv: int) -> str:
    """Launcher lines clamping BK / BV to the head sizes (at least 16, what tl.dot needs)."""
    return dedent(f"""\
    BK = max(16, min({bk}, triton.next_power_of_2(K)))
    BV = max(16, min({bv}, triton.next_power_of_2(V)))""")


def _grid(c: Choices, bv: str) -> str:
    if c.get("grid_order", "v_first") == "v_first":
        return f"(triton.cdiv(V, {bv}), NT, B * H)"
    return f"(NT, B * H, triton.cdiv(V, {bv}))"


def _program_ids(c: Choices) -> str:
    if c.get("grid_order", "v_first") == "v_first":
        return "i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)"
    return "i_t, i_bh, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)"


def render_chunk_tiled(c: Choices, for_check: bool) -> str:
    block_ptr = c["pointers"] == "block_ptr"
    acc = _accumulate_block_ptr(c) if block_ptr else _accumulate_offsets(c)
    body = (glue.ruler("this program's V tile, chunk and (batch, head)") + "\n" + _program_ids(c) + "\n" + _heads(c)
            + "\n" + glue.ruler("q @ h and q @ k^T over K slices, fp32") + "\n" + acc + "\n"
            + _gate_and_mix(c, block_ptr))
    tuned = c["tuning"] == "autotune"
    decorators = ""
    if tuned:
        configs = [glue.config({"BK": bk, "BV": bv}, w, s) for bk, bv, w, s in CONFIG_SETS[c["config_set"]]]
        decorators = glue.autotune(configs, ["H", "K", "V", "BT"], for_check, c.get("check_config", 0)) + "\n"
    kernel = _kernel("chunk_fwd_kernel_o", body, ["BT", "BK", "BV"], decorators)
    if tuned:
        launch = dedent(f"""\
        grid = lambda meta: {_grid(c, 'meta["BV"]')}
        chunk_fwd_kernel_o[grid]({ARGS}, BT=BT)""")
    else:
        bk, bv, warps, stages = c["tile"]
        launch = _block_sizes(bk, bv) + "\n" + dedent(f"""\
        grid = {_grid(c, "BV")}
        chunk_fwd_kernel_o[grid]({ARGS}, BT=BT, BK=BK, BV=BV, num_warps={warps}, num_stages={stages})""")
    how = "block pointers" if block_ptr else "pointer offsets"
    doc = _doc("one program per (V tile, chunk, head)",
               f"Each program loads q, k^T and the chunk's state h in BK slices ({how}), accumulates "
               "q @ h and the (64, 64) scores in fp32, applies the gates and the causal mask and adds "
               "scores @ v: one fused kernel, h read once per V tile.", c)
    return _finish(c, doc, [kernel, _launcher(c, for_check, "Chunked output, one fused kernel.", launch)], (),
                   for_check)


def render_whole_head(c: Choices, for_check: bool) -> str:
    body = (glue.ruler("one program per (chunk, head): all of K and V at once") + "\n"
            + "i_t, i_bh = tl.program_id(0), tl.program_id(1)\ni_v = 0\n" + _heads(c) + "\n"
            + _accumulate_offsets(c) + "\n" + _gate_and_mix(c, False))
    kernel = _kernel("chunk_fwd_o_whole_head_kernel", body, ["BT", "BK", "BV"])
    launch = dedent(f"""\
    BK = max(16, triton.next_power_of_2(K))
    BV = max(16, triton.next_power_of_2(V))
    chunk_fwd_o_whole_head_kernel[(NT, B * H)]({ARGS}, BT=BT, BK=BK, BV=BV, num_warps={c["warps"]}, num_stages={c["stages"]})""")
    doc = _doc("one program per (chunk, head), whole K and V", "BK = K and BV = V: a single pass over "
               "the state, fewer and larger programs with wider accumulators.", c)
    return _finish(c, doc, [kernel, _launcher(c, for_check, "Chunked output, whole heads.", launch)], (), for_check)


def render_persistent(c: Choices, for_check: bool) -> str:
    coords = dedent("""\
    n_v = tl.cdiv(V, BV)
    total = n_v * NT * B * H
    for item in range(tl.program_id(0), total, tl.num_programs(0)):
        i_v = item % n_v
        i_t = (item // n_v) % NT
        i_bh = item // (n_v * NT)""")
    inner = _heads(c) + "\n" + _accumulate_offsets(c) + "\n" + _gate_and_mix(c, False)
    body = glue.ruler("persistent: programs stride over (V tile, chunk, head) items") + "\n" + coords + "\n" + indent(
        inner, 4)
    kernel = _kernel("chunk_fwd_o_persistent_kernel", body, ["BT", "BK", "BV"], extra_sig="\n    B,")
    code, sms = glue.sm_count_part(c["sms"], for_check)
    sms = sms.replace("x.device", "q.device")
    bk, bv, warps, stages = c["tile"]
    launch = _block_sizes(bk, bv) + "\n" + dedent(f"""\
    items = triton.cdiv(V, BV) * NT * B * H
    grid = (min(items, {c["per_sm"]} * {sms}),)
    chunk_fwd_o_persistent_kernel[grid]({ARGS}, B, BT=BT, BK=BK, BV=BV, num_warps={warps}, num_stages={stages})""")
    doc = _doc("a persistent grid over (V tile, chunk, head)", "The grid is sized from the SM count; "
               "each program loops over work items and runs the fused chunk computation for each.", c)
    imports = ("functools",) if c["sms"] == "torch_props" and not for_check else ()
    return _finish(c, doc, [code, kernel, _launcher(c, for_check, "Chunked output, persistent.", launch)], imports,
                   for_check)


def render_scores_first(c: Choices, for_check: bool) -> str:
    a_body = (glue.ruler("kernel 1: gated, causal (64, 64) scores of one chunk and head to HBM") + "\n"
              + "i_t, i_bh = tl.program_id(0), tl.program_id(1)\ni_v = 0\n" + _heads(c) + "\n"
              + _accumulate_offsets(c, with_inter=False) + "\n" + dedent(f"""\
    b_g = tl.load(g + (bos + t) * H + i_h, mask=m_t, other=0.0)
    b_A = tl.where(o_t[:, None] >= o_t[None, :], b_A * {_gate(c, "b_g[:, None] - b_g[None, :]")}, 0.0)
    tl.store(A + ((bos + t) * H + i_h)[:, None] * BT + o_t[None, :], b_A, mask=m_t[:, None])"""))
    a_kernel = _kernel("chunk_scores_kernel", a_body, ["BT", "BK", "BV"], extra_sig="\n    A,")
    a_cast = "b_A.to(b_v.dtype)" if c.get("a_dtype", "bf16") == "bf16" else "b_A"
    v_cast = "b_v" if c.get("a_dtype", "bf16") == "bf16" else "b_v.to(tl.float32)"
    o_body = (glue.ruler("kernel 2: exp(g) q @ h plus the stored scores @ v") + "\n" + _program_ids(c) + "\n"
              + _heads(c) + "\n" + _accumulate_offsets(c, with_intra=False) + "\n" + dedent(f"""\
    b_g = tl.load(g + (bos + t) * H + i_h, mask=m_t, other=0.0)
    b_A = tl.load(A + ((bos + t) * H + i_h)[:, None] * BT + o_t[None, :], mask=m_t[:, None], other=0.0)
    b_v = tl.load(v + ((bos + t) * H + i_h)[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
    b_o = (b_o * {_gate(c, "b_g")}[:, None] + tl.dot({a_cast}, {v_cast})) * scale
    tl.store(o + ((bos + t) * H + i_h)[:, None] * V + o_v[None, :], b_o.to(o.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])"""))
    o_kernel = _kernel("chunk_output_kernel", o_body, ["BT", "BK", "BV"], extra_sig="\n    A,")
    bk, bv, warps, stages = c["tile"]
    launch = _block_sizes(bk, bv) + "\n" + dedent(f"""\
    chunk_scores_kernel[(NT, B * H)]({ARGS}, A, BT=BT, BK=BK, BV=BV, num_warps={warps}, num_stages={stages})
    grid = {_grid(c, "BV")}
    chunk_output_kernel[grid]({ARGS}, A, BT=BT, BK=BK, BV=BV, num_warps={warps}, num_stages={stages})""")
    doc = _doc("scores first, then the output", "Kernel 1 writes the gated, masked (64, 64) score block "
               "of every chunk and head to HBM in fp32; kernel 2 computes the state term and adds the "
               "stored scores times v. q is read twice and the scores make a round trip.", c)
    launcher = _launcher(c, for_check, "Scores kernel, then output kernel.", launch,
                         "A = torch.empty((B, T, H, BT), dtype=torch.float32, device=q.device)")
    return _finish(c, doc, [a_kernel, o_kernel, launcher], (), for_check)


def render_inter_then_intra(c: Choices, for_check: bool) -> str:
    inter_body = (glue.ruler("kernel 1: the state term exp(g) * q @ h * scale, fp32 to HBM") + "\n"
                  + _program_ids(c) + "\n" + _heads(c) + "\n" + _accumulate_offsets(c, with_intra=False) + "\n"
                  + dedent(f"""\
    b_g = tl.load(g + (bos + t) * H + i_h, mask=m_t, other=0.0)
    b_o = b_o * {_gate(c, "b_g")}[:, None] * scale
    tl.store(O_inter + ((bos + t) * H + i_h)[:, None] * V + o_v[None, :], b_o, mask=m_t[:, None] & m_v[None, :])"""))
    a_cast = "b_A.to(b_v.dtype)" if c.get("a_dtype", "bf16") == "bf16" else "b_A"
    v_cast = "b_v" if c.get("a_dtype", "bf16") == "bf16" else "b_v.to(tl.float32)"
    intra_body = (glue.ruler("kernel 2: the intra-chunk term, added to the stored state term") + "\n"
                  + _program_ids(c) + "\n" + _heads(c) + "\n" + _accumulate_offsets(c, with_inter=False) + "\n"
                  + dedent(f"""\
    b_g = tl.load(g + (bos + t) * H + i_h, mask=m_t, other=0.0)
    b_A = tl.where(o_t[:, None] >= o_t[None, :], b_A * {_gate(c, "b_g[:, None] - b_g[None, :]")}, 0.0)
    b_v = tl.load(v + ((bos + t) * H + i_h)[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
    b_o = tl.load(O_inter + ((bos + t) * H + i_h)[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
    b_o += tl.dot({a_cast}, {v_cast}) * scale
    tl.store(o + ((bos + t) * H + i_h)[:, None] * V + o_v[None, :], b_o.to(o.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])"""))
    k1 = _kernel("chunk_inter_kernel", inter_body, ["BT", "BK", "BV"], extra_sig="\n    O_inter,")
    k2 = _kernel("chunk_intra_kernel", intra_body, ["BT", "BK", "BV"], extra_sig="\n    O_inter,")
    bk, bv, warps, stages = c["tile"]
    launch = _block_sizes(bk, bv) + "\n" + dedent(f"""\
    grid = {_grid(c, "BV")}
    chunk_inter_kernel[grid]({ARGS}, o_inter, BT=BT, BK=BK, BV=BV, num_warps={warps}, num_stages={stages})
    chunk_intra_kernel[grid]({ARGS}, o_inter, BT=BT, BK=BK, BV=BV, num_warps={warps}, num_stages={stages})""")
    doc = _doc("state term, then intra-chunk term", "Two kernels: the first writes exp(g) q @ h (times "
               "scale) to an fp32 buffer, the second computes the causal gated scores, adds scores @ v "
               "to the buffer's values and writes o. q is read twice, the output three times over.", c)
    launcher = _launcher(c, for_check, "State term, then intra-chunk term.", launch,
                         "o_inter = torch.empty((B, T, H, V), dtype=torch.float32, device=q.device)")
    return _finish(c, doc, [k1, k2, launcher], (), for_check)


TILES = ((64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 4, 2), (64, 128, 8, 2), (32, 32, 2, 2), (32, 64, 4, 3),
         (16, 16, 1, 2), (128, 128, 8, 1))


def space() -> TaskSpace:
    common = {"guard": glue.LAUNCH_GUARDS, "exp": ("exp", "exp2"), "a_dtype": ("bf16", "fp32"),
              "int64": (False, True)}
    structures = (
        Structure("chunk_tiled", "one fused program per (V tile, chunk, head)",
                  {**common, "pointers": ("block_ptr", "offsets"), "grid_order": ("v_first", "chunk_first"),
                   "tuning": ("autotune", "fixed"),
                   "config_set": lambda c: tuple(CONFIG_SETS) if c["tuning"] == "autotune" else None,
                   "tile": lambda c: TILES if c["tuning"] == "fixed" else None}, render_chunk_tiled),
        Structure("whole_head", "one program per (chunk, head), whole K and V",
                  {**common, "warps": (4, 8), "stages": (1, 2, 3)}, render_whole_head),
        Structure("persistent", "SM-sized grid over (V tile, chunk, head) items",
                  {**common, "sms": glue.SM_SOURCES, "per_sm": (1, 2, 4), "tile": TILES}, render_persistent),
        Structure("scores_first", "scores kernel, then output kernel",
                  {**common, "grid_order": ("v_first", "chunk_first"), "tile": TILES}, render_scores_first),
        Structure("inter_then_intra", "state-term kernel, then intra-chunk kernel",
                  {**common, "grid_order": ("v_first", "chunk_first"), "tile": TILES}, render_inter_then_intra),
    )
    return TaskSpace(TASK, structures)
