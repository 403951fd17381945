"""matmul_bias_gelu as kernel libraries write it: out = gelu(A @ B + bias), A (M, K), B (K, N), bias
(N,), all bf16, exact-erf GELU (a tanh GELU is within the task's tolerance and also appears).

    tiled            one program per output tile, tl.dot over K in fp32, bias and GELU fused in
                     the epilogue; tiles in grouped (GROUP_M swizzle), row-major or column-major
                     order; autotuned over a few configs (tutorial 03) or fixed tiles
    persistent       k x SM-count programs striding over the tiles (tutorial 09 without TMA)
    block_ptr        tl.make_block_ptr loads with boundary checks and tl.advance (older
                     tutorials, flash-linear-attention's habit)
    separate_epilogue the matmul writes C (bf16 or fp32) to HBM, a second elementwise kernel adds
                     the bias and applies GELU
    split_k          K split over a second grid dimension: fp32 partials in a workspace or
                     atomically added, then an epilogue kernel reduces and applies bias and GELU
    naive_outer      no tensor cores: fp32 broadcast-multiply-and-sum over small tiles
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

TASK = "matmul_bias_gelu"
SMEM_LIMIT = 232448  # bytes of shared memory a block may use on sm_90

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
TILES = (
    (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 32, 4, 4),
    (128, 64, 64, 4, 4), (64, 128, 32, 4, 4), (64, 64, 64, 4, 3), (64, 64, 32, 2, 4),
    (32, 64, 32, 2, 5), (32, 32, 32, 2, 3), (16, 32, 32, 1, 2), (16, 16, 16, 1, 2),
)
# autotune sets: a few configs each, keyed on the problem size
CONFIG_SETS = {
    "large": ((128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 64, 64, 4, 4)),
    "mixed": ((128, 128, 64, 8, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 32, 4, 4),
              (32, 64, 32, 2, 5)),
    "small": ((64, 64, 32, 4, 3), (32, 64, 32, 2, 4), (32, 32, 32, 2, 3), (16, 32, 32, 1, 2)),
}
INV_SQRT2 = "0.7071067811865476"
SQRT_2_OVER_PI = "0.7978845608028654"


def smem_bytes(bm: int, bn: int, bk: int, stages: int) -> int:
    """Shared memory of a pipelined bf16 tl.dot loop: `stages` buffers of the A and B tiles."""
    return stages * (bm * bk + bk * bn) * 2


def fits(tile: tuple) -> bool:
    """Within shared memory, and an fp32 accumulator of at most 128 registers a thread."""
    bm, bn, bk, warps, stages = tile
    return smem_bytes(bm, bn, bk, stages) <= SMEM_LIMIT and bm * bn // (32 * warps) <= 128


def _gelu(c: Choices, x: str) -> str:
    """GELU of an fp32 expression: exact (erf) or tanh approximation (tanh through a sigmoid)."""
    if c.get("gelu") == "tanh":
        return f"{x} * tl.sigmoid(2.0 * {SQRT_2_OVER_PI} * ({x} + 0.044715 * {x} * {x} * {x}))"
    return f"0.5 * {x} * (1.0 + tl.erf({x} * {INV_SQRT2}))"


def _epilogue(c: Choices, acc: str = "acc") -> str:
    """Bias and GELU on the fp32 accumulator of the tile (offs_cm, offs_cn), stored as bf16."""
    rounded = f"{acc}.to(tl.bfloat16).to(tl.float32)" if c.get("rounding") == "bf16_steps" else acc
    return dedent(f"""\
    {glue.ruler("epilogue: bias and GELU in fp32, one bf16 store")}
    bias = tl.load(bias_ptr + offs_cn, mask=offs_cn < N, other=0.0).to(tl.float32)
    x = {rounded} + bias[None, :]
    y = {_gelu(c, "x")}
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, y.to(tl.bfloat16), mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))""")


def _tile_coords(c: Choices, tile: str) -> str:
    """pid_m, pid_n of a linear tile index in the chosen order."""
    if c["order"] == "grouped":
        return dedent(f"""\
        # grouped ordering: GROUP_M tiles down a column before moving right, for L2 reuse of B
        num_pid_in_group = GROUP_M * num_pid_n
        group_id = {tile} // num_pid_in_group
        first_pid_m = group_id * GROUP_M
        group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + (({tile} % num_pid_in_group) % group_size_m)
        pid_n = ({tile} % num_pid_in_group) // group_size_m""")
    if c["order"] == "column_major":
        return f"pid_m = {tile} % num_pid_m\npid_n = {tile} // num_pid_m"
    return f"pid_m = {tile} // num_pid_n\npid_n = {tile} % num_pid_n"


def _k_loop(c: Choices, k_range: str = "0, tl.cdiv(K, BLOCK_K)", k_step: str = "BLOCK_K") -> str:
    """The tile's fp32 accumulator over K (offs_m, offs_n set; A/B pointers built here)."""
    modulo = c.get("bounds") == "modulo"
    m_mask = "" if modulo else " & (offs_m[:, None] < M)"
    n_mask = "" if modulo else " & (offs_n[None, :] < N)"
    if c.get("even_k"):
        loads = dedent(f"""\
        if EVEN_K:
            a = tl.load(a_ptrs{", mask=offs_m[:, None] < M, other=0.0" if not modulo else ""})
            b = tl.load(b_ptrs{", mask=offs_n[None, :] < N, other=0.0" if not modulo else ""})
        else:
            a = tl.load(a_ptrs, mask=(offs_k[None, :] < K - k * BLOCK_K){m_mask}, other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k * BLOCK_K){n_mask}, other=0.0)""")
    else:
        loads = dedent(f"""\
        a = tl.load(a_ptrs, mask=(offs_k[None, :] < K - k * BLOCK_K){m_mask}, other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k * BLOCK_K){n_mask}, other=0.0)""")
    dot = "acc = tl.dot(a, b, acc)" if c.get("dot_acc", "inplace") == "inplace" else "acc += tl.dot(a, b)"
    if modulo:
        offs = dedent("""\
        # rows and columns past the edge wrap around (always in bounds); the store masks them
        offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
        offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N""")
    else:
        offs = dedent("""\
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)""")
    return offs + "\n" + dedent(f"""\
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range({k_range}):
    """) + "\n" + indent(loads + "\n" + dot + "\n" + dedent(f"""\
    a_ptrs += {k_step} * stride_ak
    b_ptrs += {k_step} * stride_bk"""), 4)


SIGNATURE = """\
    # pointers: A (M, K), B (K, N), bias (N,), C (M, N), bf16
    a_ptr, b_ptr, bias_ptr, c_ptr,
    # sizes
    M, N, K,
    # strides (elements)
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    # meta-parameters"""

ARGS = "a, b, bias, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1)"


def _doc(title: str, text: str, c: Choices) -> str:
    return (f"Fused linear layer with GELU, out = gelu(A @ B + bias) in bf16: {title}.\n\n"
            f"{glue.wrap_doc(text)}")


def _launcher(c: Choices, for_check: bool, doc: str, body: str) -> str:
    head = glue.guard_decorator(c["guard"]) + "def matmul_bias_gelu(a, b, bias):"
    base = dedent("""\
    assert a.shape[1] == b.shape[0] and b.shape[1] == bias.shape[0], "shape mismatch"
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)""")
    launch = glue.guard_launch(c["guard"], body, "a", for_check)
    return "\n".join([head, glue.launcher_doc(doc), indent(base, 4), indent(launch, 4), "    return c"])


CUSTOM = '''\
def custom_kernel(data):
    a, b, bias = data
    return matmul_bias_gelu(a, b, bias)'''


def _finish(c: Choices, doc: str, parts: list[str], imports: tuple[str, ...], for_check: bool) -> str:
    parts = [glue.guard_part(c["guard"], for_check), *parts, CUSTOM]
    return glue.module(doc, parts, imports + glue.guard_imports(c["guard"], for_check))


def _meta(c: Choices) -> list[str]:
    meta = ["BLOCK_M", "BLOCK_N", "BLOCK_K"]
    if c.get("order") == "grouped":
        meta.append("GROUP_M")
    if c.get("even_k"):
        meta.append("EVEN_K")
    return meta


def _tile_kwargs(c: Choices, tile: tuple) -> str:
    bm, bn, bk, warps, stages = tile
    kw = f"BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk}"
    if c.get("order") == "grouped":
        kw += f", GROUP_M={c['group_m']}"
    return kw + f", num_warps={warps}, num_stages={stages}"


def _decorators(c: Choices, for_check: bool) -> str:
    """Autotune (configs of the chosen set) and the EVEN_K heuristic, as the choices say."""
    out = ""
    if c.get("tuning") == "autotune":
        configs = []
        for bm, bn, bk, warps, stages in CONFIG_SETS[c["config_set"]]:
            meta = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
            if c.get("order") == "grouped":
                meta["GROUP_M"] = c["group_m"]
            configs.append(glue.config(meta, warps, stages))
        out += glue.autotune(configs, ["M", "N", "K"], for_check, c.get("check_config", 0)) + "\n"
    if c.get("even_k"):
        out += glue.heuristics({"EVEN_K": 'args["K"] % args["BLOCK_K"] == 0'}) + "\n"
    return out


def _signature(meta: list[str]) -> str:
    return SIGNATURE + "\n" + "\n".join(f"    {m}: tl.constexpr," for m in meta)


def render_tiled(c: Choices, for_check: bool) -> str:
    if c["order"] == "grouped" or c["grid"] == "1d":
        head = "pid = tl.program_id(0)\nnum_pid_m = tl.cdiv(M, BLOCK_M)\nnum_pid_n = tl.cdiv(N, BLOCK_N)\n" + _tile_coords(
            c, "pid")
        grid = "lambda META: (triton.cdiv(M, META[\"BLOCK_M\"]) * triton.cdiv(N, META[\"BLOCK_N\"]),)"
    else:
        head = "pid_m = tl.program_id(0)\npid_n = tl.program_id(1)" if c["order"] == "row_major" else (
            "pid_n = tl.program_id(0)\npid_m = tl.program_id(1)")
        grid = ('lambda META: (triton.cdiv(M, META["BLOCK_M"]), triton.cdiv(N, META["BLOCK_N"]))'
                if c["order"] == "row_major" else
                'lambda META: (triton.cdiv(N, META["BLOCK_N"]), triton.cdiv(M, META["BLOCK_M"]))')
    body = (glue.ruler("map the program to its output tile") + "\n" + head + "\n"
            + glue.ruler("fp32 accumulation of A and B tiles over K") + "\n" + _k_loop(c) + "\n"
            + "offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)\noffs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)\n"
            + _epilogue(c))
    kernel = (f"{_decorators(c, for_check)}@triton.jit\ndef matmul_bias_gelu_kernel(\n{_signature(_meta(c))}\n):\n"
              + indent(body, 4))
    if c["tuning"] == "autotune":
        launch = f"grid = {grid}\nmatmul_bias_gelu_kernel[grid]({ARGS})"
    else:
        launch = f"grid = {grid}\nmatmul_bias_gelu_kernel[grid]({ARGS}, {_tile_kwargs(c, c['tile'])})"
    doc = _doc("one program per output tile, bias and GELU fused",
               f"Tiles in {c['order'].replace('_', '-')} order; A and B tiles are loaded over K and "
               "multiplied on tensor cores into an fp32 accumulator; the epilogue adds the bias and "
               "applies GELU before the only store of C.", c)
    return _finish(c, doc, [kernel, _launcher(c, for_check, "Tiled matmul with fused epilogue.", launch)], (),
                   for_check)


def render_persistent(c: Choices, for_check: bool) -> str:
    body = (glue.ruler("persistent: each program walks tiles start, start + grid, ...") + "\n" + dedent(f"""\
        num_pid_m = tl.cdiv(M, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        num_tiles = num_pid_m * num_pid_n
        for tile_id in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0){", flatten=True" if c["flatten"] else ""}):
        """) + "\n" + indent(_tile_coords(c, "tile_id") + "\n" + _k_loop(c) + "\n"
                             + "offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)\n"
                             + "offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)\n" + _epilogue(c), 4))
    kernel = (f"{_decorators(c, for_check)}@triton.jit\ndef matmul_bias_gelu_persistent_kernel(\n"
              f"{_signature(_meta(c))}\n):\n" + indent(body, 4))
    code, sms = glue.sm_count_part(c["sms"], for_check)
    sms = sms.replace("x.device", "a.device")
    if c["tuning"] == "autotune":
        launch = dedent(f"""\
        grid = lambda META: (min({c["per_sm"]} * {sms}, triton.cdiv(M, META["BLOCK_M"]) * triton.cdiv(N, META["BLOCK_N"])),)
        matmul_bias_gelu_persistent_kernel[grid]({ARGS})""")
    else:
        bm, bn = c["tile"][:2]
        launch = dedent(f"""\
        num_tiles = triton.cdiv(M, {bm}) * triton.cdiv(N, {bn})
        grid = (min({c["per_sm"]} * {sms}, num_tiles),)
        matmul_bias_gelu_persistent_kernel[grid]({ARGS}, {_tile_kwargs(c, c["tile"])})""")
    doc = _doc("a persistent grid of programs over the output tiles",
               "The grid is sized from the SM count; each program loops over tiles in "
               f"{c['order'].replace('_', '-')} order with the K loop and fused epilogue inside.", c)
    imports = ("functools",) if c["sms"] == "torch_props" and not for_check else ()
    return _finish(c, doc, [code, kernel, _launcher(c, for_check, "Persistent tiled matmul.", launch)], imports,
                   for_check)


def render_block_ptr(c: Choices, for_check: bool) -> str:
    bm, bn, bk, warps, stages = c["tile"]
    dot = "acc = tl.dot(a, b, acc)" if c.get("dot_acc", "inplace") == "inplace" else "acc += tl.dot(a, b)"
    if c["order"] == "grouped":
        head = "pid = tl.program_id(0)\nnum_pid_m = tl.cdiv(M, BLOCK_M)\nnum_pid_n = tl.cdiv(N, BLOCK_N)\n" + _tile_coords(
            c, "pid")
        grid = f"(triton.cdiv(M, {bm}) * triton.cdiv(N, {bn}),)"
    else:
        head = "pid_m = tl.program_id(0)\npid_n = tl.program_id(1)"
        grid = f"(triton.cdiv(M, {bm}), triton.cdiv(N, {bn}))"
    rounded = "acc.to(tl.bfloat16).to(tl.float32)" if c.get("rounding") == "bf16_steps" else "acc"
    body = glue.ruler("block pointers over A, B and C") + "\n" + head + "\n" + dedent(f"""\
    a_block = tl.make_block_ptr(base=a_ptr, shape=(M, K), strides=(stride_am, stride_ak),
                                offsets=(pid_m * BLOCK_M, 0), block_shape=(BLOCK_M, BLOCK_K), order=(1, 0))
    b_block = tl.make_block_ptr(base=b_ptr, shape=(K, N), strides=(stride_bk, stride_bn),
                                offsets=(0, pid_n * BLOCK_N), block_shape=(BLOCK_K, BLOCK_N), order=(1, 0))
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_block, boundary_check=(0, 1), padding_option="zero")
        b = tl.load(b_block, boundary_check=(0, 1), padding_option="zero")
        {dot}
        a_block = tl.advance(a_block, (0, BLOCK_K))
        b_block = tl.advance(b_block, (BLOCK_K, 0))
    {glue.ruler("epilogue: bias and GELU, stored through a block pointer")}
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    bias = tl.load(bias_ptr + offs_cn, mask=offs_cn < N, other=0.0).to(tl.float32)
    x = {rounded} + bias[None, :]
    y = {_gelu(c, "x")}
    c_block = tl.make_block_ptr(base=c_ptr, shape=(M, N), strides=(stride_cm, stride_cn),
                                offsets=(pid_m * BLOCK_M, pid_n * BLOCK_N), block_shape=(BLOCK_M, BLOCK_N), order=(1, 0))
    tl.store(c_block, y.to(tl.bfloat16), boundary_check=(0, 1))""")
    meta = ["BLOCK_M", "BLOCK_N", "BLOCK_K"] + (["GROUP_M"] if c["order"] == "grouped" else [])
    kernel = f"@triton.jit\ndef matmul_bias_gelu_block_ptr_kernel(\n{_signature(meta)}\n):\n" + indent(body, 4)
    launch = f"matmul_bias_gelu_block_ptr_kernel[{grid}]({ARGS}, {_tile_kwargs(c, c['tile'])})"
    doc = _doc("block pointers with boundary checks", "A, B and C are addressed through "
               "tl.make_block_ptr; loads pad the ragged edges with zeros, tl.advance steps along K.", c)
    return _finish(c, doc, [kernel, _launcher(c, for_check, "Block-pointer matmul.", launch)], (), for_check)


def render_separate_epilogue(c: Choices, for_check: bool) -> str:
    mm_c = dict(c, order="grouped" if c["group_m"] > 1 else "row_major")
    tmp_tl = "tl.float32" if c["tmp"] == "fp32" else "tl.bfloat16"
    body = (glue.ruler("matmul only: the tile of A @ B to a temporary") + "\n" + dedent("""\
        pid = tl.program_id(0)
        num_pid_m = tl.cdiv(M, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)""") + "\n" + _tile_coords(mm_c, "pid") + "\n" + _k_loop(mm_c) + "\n"
        + dedent(f"""\
        offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
        tl.store(c_ptrs, acc.to({tmp_tl}), mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))"""))
    matmul = f"{_decorators(mm_c, for_check)}@triton.jit\ndef matmul_kernel(\n{_signature(_meta(mm_c))}\n):\n" + indent(
        body, 4)
    epilogue = f"""\
@triton.jit
def bias_gelu_kernel(
    t_ptr, bias_ptr, out_ptr,
    n_elements, N,
    BLOCK: tl.constexpr,
):
    {glue.ruler("elementwise over the flattened (M, N) output")}
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(t_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x = x + tl.load(bias_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    y = {_gelu(c, "x")}
    tl.store(out_ptr + offs, y.to(tl.bfloat16), mask=mask)"""
    tmp_torch = "torch.float32" if c["tmp"] == "fp32" else "a.dtype"
    tile = c["tile"]
    kw = _tile_kwargs(mm_c, tile)
    launch = dedent(f"""\
    t = torch.empty((M, N), dtype={tmp_torch}, device=a.device)
    grid = (triton.cdiv(M, {tile[0]}) * triton.cdiv(N, {tile[1]}),)
    matmul_kernel[grid](a, b, bias, t, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), t.stride(0), t.stride(1), {kw})
    bias_gelu_kernel[(triton.cdiv(M * N, {c["ew_block"]}),)](t, bias, c, M * N, N, BLOCK={c["ew_block"]}, num_warps={c["ew_warps"]})""")
    doc = _doc("matmul, then a separate bias + GELU kernel",
               f"Unfused epilogue: the matmul writes its {c['tmp']} result to HBM and an elementwise "
               "kernel reads it back, adds the bias and applies GELU: an extra round trip of the "
               "(M, N) output.", c)
    return _finish(c, doc, [matmul, epilogue, _launcher(c, for_check, "Matmul, then epilogue kernel.", launch)], (),
                   for_check)


def render_split_k(c: Choices, for_check: bool) -> str:
    mm_c = dict(c, order="grouped" if c["group_m"] > 1 else "row_major")
    atomic = c["reduce"] == "atomic"
    if atomic:
        store = dedent("""\
        w_ptrs = w_ptr + offs_cm[:, None] * N + offs_cn[None, :]
        tl.atomic_add(w_ptrs, acc, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))""")
    else:
        store = dedent("""\
        w_ptrs = w_ptr + pid_k * M * N + offs_cm[:, None] * N + offs_cn[None, :]
        tl.store(w_ptrs, acc, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))""")
    body = (glue.ruler("grid (tiles, SPLIT_K): a K-slice of one tile, fp32 partial out") + "\n" + dedent("""\
        pid = tl.program_id(0)
        pid_k = tl.program_id(1)
        num_pid_m = tl.cdiv(M, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)""") + "\n" + _tile_coords(mm_c, "pid") + "\n"
        + _k_loop(mm_c, "pid_k, tl.cdiv(K, BLOCK_K), SPLIT_K", "SPLIT_K * BLOCK_K").replace(
            "offs_k = tl.arange(0, BLOCK_K)", "offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)").replace(
            "K - k * BLOCK_K", "K - k * BLOCK_K + pid_k * BLOCK_K")
        + "\n" + "offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)\noffs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)\n"
        + store)
    meta = ["BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K"] + (["GROUP_M"] if mm_c["order"] == "grouped" else [])
    sig = _signature(meta).replace("a_ptr, b_ptr, bias_ptr, c_ptr,", "a_ptr, b_ptr, w_ptr,").replace(
        "stride_bn, stride_cm, stride_cn,", "stride_bn,").replace("C (M, N), bf16", "fp32 partials")
    matmul = f"@triton.jit\ndef matmul_split_k_kernel(\n{sig}\n):\n" + indent(body, 4)
    reduce_sum = "x = tl.load(w_ptr + offs, mask=mask, other=0.0)" if atomic else dedent("""\
        x = tl.zeros([BLOCK], dtype=tl.float32)
        for s in range(SPLIT_K):
            x += tl.load(w_ptr + s * n_elements + offs, mask=mask, other=0.0)""")
    epilogue = f"""\
@triton.jit
def split_k_epilogue_kernel(
    w_ptr, bias_ptr, out_ptr,
    n_elements, N,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    {glue.ruler("sum the K-slices, add the bias, apply GELU")}
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
{indent(reduce_sum, 4)}
    x = x + tl.load(bias_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    y = {_gelu(c, "x")}
    tl.store(out_ptr + offs, y.to(tl.bfloat16), mask=mask)"""
    tile = c["tile"]
    bm, bn, bk, warps, stages = tile
    ws = ("w = torch.zeros((M, N), dtype=torch.float32, device=a.device)  # atomically accumulated" if atomic
          else f"w = torch.empty(({c['split_k']}, M, N), dtype=torch.float32, device=a.device)")
    group = f", GROUP_M={c['group_m']}" if mm_c["order"] == "grouped" else ""
    launch = dedent(f"""\
    {ws}
    grid = (triton.cdiv(M, {bm}) * triton.cdiv(N, {bn}), {c["split_k"]})
    matmul_split_k_kernel[grid](a, b, w, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk}, SPLIT_K={c["split_k"]}{group}, num_warps={warps}, num_stages={stages})
    split_k_epilogue_kernel[(triton.cdiv(M * N, 1024),)](w, bias, c, M * N, N, SPLIT_K={c["split_k"]}, BLOCK=1024, num_warps=4)""")
    how = "atomically added into one fp32 (M, N) buffer" if atomic else "written to an fp32 (SPLIT_K, M, N) workspace"
    doc = _doc("K split over a second grid dimension",
               f"Each of SPLIT_K programs per tile multiplies a slice of K; partials are {how}; an "
               "epilogue kernel sums them and applies bias and GELU.", c)
    return _finish(c, doc, [matmul, epilogue, _launcher(c, for_check, "Split-K matmul and epilogue.", launch)], (),
                   for_check)


def render_naive_outer(c: Choices, for_check: bool) -> str:
    bm, bn, bk, warps = c["tile"]
    body = glue.ruler("CUDA cores only: fp32 broadcast products summed over K") + "\n" + dedent("""\
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + (k + offs_k)[None, :] * stride_ak,
                    mask=(offs_m[:, None] < M) & ((k + offs_k)[None, :] < K), other=0.0).to(tl.float32)
        b = tl.load(b_ptr + (k + offs_k)[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=((k + offs_k)[:, None] < K) & (offs_n[None, :] < N), other=0.0).to(tl.float32)
        acc += tl.sum(a[:, :, None] * b[None, :, :], axis=1)
    offs_cm = offs_m
    offs_cn = offs_n""") + "\n" + _epilogue(c)
    kernel = f"@triton.jit\ndef matmul_bias_gelu_fma_kernel(\n{_signature(['BLOCK_M', 'BLOCK_N', 'BLOCK_K'])}\n):\n" + indent(
        body, 4)
    launch = (f"grid = (triton.cdiv(M, {bm}), triton.cdiv(N, {bn}))\n"
              f"matmul_bias_gelu_fma_kernel[grid]({ARGS}, BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk}, num_warps={warps})")
    doc = _doc("fp32 outer products on CUDA cores", "No tl.dot: each program multiplies small fp32 "
               "tiles by broadcasting and summing over K, so tensor cores sit idle.", c)
    return _finish(c, doc, [kernel, _launcher(c, for_check, "Tensor-core-free matmul.", launch)], (), for_check)


def space() -> TaskSpace:
    tiles = tuple(t for t in TILES if fits(t))
    common = {"guard": glue.LAUNCH_GUARDS, "gelu": ("erf", "tanh"), "rounding": ("fp32", "bf16_steps")}
    tuning = {"tuning": ("autotune", "fixed"),
              "config_set": lambda c: tuple(CONFIG_SETS) if c["tuning"] == "autotune" else None,
              "tile": lambda c: tiles if c["tuning"] == "fixed" else None}
    order = {"order": ("grouped", "row_major", "column_major"),
             "group_m": lambda c: (4, 8, 16) if c["order"] == "grouped" else None}
    kloop = {"bounds": ("masked", "modulo"), "even_k": (False, True), "dot_acc": ("inplace", "add")}
    structures = (
        Structure("tiled", "one program per tile, fused epilogue",
                  {**common, **tuning, **order, "grid": lambda c: ("1d", "2d") if c["order"] != "grouped" else None,
                   **kloop}, render_tiled),
        Structure("persistent", "SM-sized grid looping over tiles",
                  {**common, **tuning, **order, "sms": glue.SM_SOURCES, "per_sm": (1, 2),
                   "flatten": (False, True), **kloop}, render_persistent),
        Structure("block_ptr", "block-pointer loads and stores",
                  {**common, "tile": tiles, **order, "dot_acc": ("inplace", "add")}, render_block_ptr,
                  valid=lambda c: c["order"] != "column_major"),
        Structure("separate_epilogue", "matmul to a temporary, then bias + GELU kernel",
                  {**common, "tile": tiles, "group_m": (1, 8), "tmp": ("bf16", "fp32"), **kloop,
                   "ew_block": (256, 1024, 4096), "ew_warps": (2, 4, 8)}, render_separate_epilogue),
        Structure("split_k", "K split over the grid, reduced in an epilogue",
                  {**common, "tile": tiles, "group_m": (1, 8), "split_k": (2, 4, 8), "reduce": ("workspace", "atomic"),
                   "bounds": ("masked",), "dot_acc": ("inplace", "add")}, render_split_k),
        Structure("naive_outer", "fp32 outer products, no tensor cores",
                  {**common, "tile": ((16, 16, 16, 1), (16, 16, 8, 2), (32, 32, 8, 4), (16, 64, 4, 2),
                                      (32, 16, 16, 2))}, render_naive_outer),
    )
    return TaskSpace(TASK, structures)
