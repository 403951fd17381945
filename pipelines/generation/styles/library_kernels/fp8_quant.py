"""fp8_quant as inference libraries write it: per-token-group (1 x 128) e4m3 quantisation of a bf16
(M, K) matrix, returning (q (M, K) float8_e4m3fn, scales (M, K / 128) fp32).

    per_group       one program per group of 128 (vLLM / SGLang's per-token-group kernel), scales
                    row-major or column-major (a (G, M) buffer returned transposed, as DeepGEMM
                    wants them)
    per_row         one program per row, looping over its groups
    group_tile      a 2-D tile per program: several groups of one row, or one group of several
                    rows, reduced along the group axis
    persistent      a grid of k x SM-count programs striding over the groups
    scales_first    unfused: a kernel writes the scales, a second one reads x and the scales
                    again and writes q
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

TASK = "fp8_quant"

DIALECTS = {
    "plain": {},
    "vllm": {"x_ptr": "y_ptr", "q_ptr": "y_q_ptr", "s_ptr": "y_s_ptr", "n_cols": "y_num_columns",
             "stride_x": "y_row_stride"},
}

HEADER = '''\
GROUP_SIZE = 128
FP8_MAX = tl.constexpr(448.0)  # torch.finfo(torch.float8_e4m3fn).max
EPS = tl.constexpr(1e-10)  # smallest absmax a scale is taken from'''


def _doc(title: str, text: str, c: Choices) -> str:
    return (f"Per-token-group fp8 e4m3 quantisation (groups of 128): {title}.\n\n{glue.wrap_doc(text)}\n\n"
            "scale = max(absmax(group), 1e-10) / 448; q = clamp(x / scale, -448, 448) as float8_e4m3fn."
            f"")


def _quantise(c: Choices, ax: str | None, b: str = "") -> str:
    """`scale` and `q` (fp8) from the fp32 block `x`; `ax` the group axis (None: 1-D group)."""
    axis = f", axis={ax}" if ax is not None else ""
    if c.get("scale_math") == "reciprocal":
        scaled = f"x * (1.0 / scale){b}"
    else:
        scaled = f"x / scale{b}"
    if c.get("clamp") == "min_max":
        clamp = f"tl.minimum(tl.maximum({scaled}, -FP8_MAX), FP8_MAX)"
    else:
        clamp = f"tl.clamp({scaled}, -FP8_MAX, FP8_MAX)"
    return dedent(f"""\
    absmax = tl.maximum(tl.max(tl.abs(x){axis}), EPS)
    scale = absmax / FP8_MAX
    q = {_cast(c, clamp)}""")


def _cast(c: Choices, value: str) -> str:
    """The saturating fp8 cast of an fp32 expression (CHECK_ROUNDING marks the interpreter's render)."""
    cast = "q_ptr.dtype.element_ty" if c.get("dialect") == "vllm" else "tl.float8e4nv"
    return f"CHECK_ROUNDING({value}).to({cast})"


# The interpreter's fp32 -> e4m3 cast mis-rounds values whose mantissa carries into the
# exponent; its render rounds onto the e4m3 grid first (round to nearest even, as the GPU's
# cvt.rn does), after which the cast is exact.
ROUND_E4M3 = '''\
@triton.jit
def _round_e4m3(v):
    """v (fp32, |v| <= 448) rounded to the nearest e4m3 value, ties to even, still fp32."""
    # normal e4m3 numbers keep 3 of fp32's 23 mantissa bits: round at bit 20
    bits = v.to(tl.uint32, bitcast=True)
    lsb = (bits >> 20) & 1
    normal = ((bits + 0x7FFFF + lsb) & 0xFFF00000).to(tl.float32, bitcast=True)
    # below 2^-6 the e4m3 grid is uniform with step 2^-9: adding 3 * 2^13 rounds to it
    tiny = (tl.abs(v) + 24576.0) - 24576.0
    tiny = tl.where(v < 0, -tiny, tiny)
    return tl.where(tl.abs(v) < 0.015625, tiny, normal)'''


def _check_rounding(source: str, for_check: bool) -> str:
    """Drop the CHECK_ROUNDING marks (GPU), or make them calls of _round_e4m3 (interpreter)."""
    mark = "CHECK_ROUNDING("
    if for_check:
        return source.replace(mark, "_round_e4m3(")
    while (start := source.find(mark)) >= 0:
        depth, end = 1, start + len(mark)
        while depth:
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            end += 1
        source = source[:start] + source[start + len(mark):end - 1] + source[end:]
    return source


def _guarded(c: Choices, for_check: bool, doc: str, body: str) -> str:
    head = glue.guard_decorator(c["guard"]) + "def per_token_group_quant_fp8(x):"
    base = dedent("""\
    assert x.ndim == 2 and x.shape[1] % GROUP_SIZE == 0, "expects x (M, K) with K a multiple of 128"
    assert x.stride(-1) == 1, "expects row-major x"
    n_rows, n_cols = x.shape
    n_groups = n_cols // GROUP_SIZE
    q = torch.empty((n_rows, n_cols), dtype=torch.float8_e4m3fn, device=x.device)""")
    if c.get("scale_layout") == "col_major":
        base += ("\n# scales stored column-major (a (groups, rows) buffer), returned as its (rows, groups) view\n"
                 "scales = torch.empty((n_groups, n_rows), dtype=torch.float32, device=x.device).t()")
    else:
        base += "\nscales = torch.empty((n_rows, n_groups), dtype=torch.float32, device=x.device)"
    launch = glue.guard_launch(c["guard"], body, "x", for_check)
    return "\n".join([head, glue.launcher_doc(doc), indent(base, 4), indent(launch, 4), "    return q, scales"])


CUSTOM = '''\
def custom_kernel(data):
    (x,) = data
    return per_token_group_quant_fp8(x)'''


def _finish(c: Choices, doc: str, parts: list[str], imports: tuple[str, ...], for_check: bool) -> str:
    parts = [HEADER, glue.guard_part(c["guard"], for_check), ROUND_E4M3 if for_check else "", *parts, CUSTOM]
    imports = imports + glue.guard_imports(c["guard"], for_check)
    source = _check_rounding(glue.module(doc, parts, imports), for_check)
    return glue.rename(source, DIALECTS[c["dialect"]])


def _jit(name: str, params: str, body: str, decorators: str = "") -> str:
    """A kernel; its group size is the constexpr GROUP (launchers pass GROUP_SIZE)."""
    body = body.replace("GROUP_SIZE", "GROUP")
    return f"{decorators}@triton.jit\ndef {name}(\n{params}\n):\n{indent(body, 4)}"


PARAMS = """\
    # pointers: x (M, K) bf16, q (M, K) fp8, scales (M, K / 128) fp32
    x_ptr, q_ptr, s_ptr,
    # sizes and strides (elements)
    n_rows, n_cols, n_groups, stride_x, stride_q, stride_s_row, stride_s_group,
    # meta-parameters
    GROUP: tl.constexpr,"""

ARGS = ("x, q, scales, n_rows, n_cols, n_groups, x.stride(0), q.stride(0), scales.stride(0), scales.stride(1), "
        "GROUP=GROUP_SIZE")


def _offset(c: Choices, expr: str) -> str:
    return f"({expr}).to(tl.int64)" if c.get("int64") else expr


def render_per_group(c: Choices, for_check: bool) -> str:
    body = f"""\
{glue.ruler("one program per group: which row, which group of it")}
group_id = {_offset(c, "tl.program_id(0)")}
row = group_id // n_groups
group = group_id % n_groups
cols = tl.arange(0, BLOCK)
mask = cols < GROUP_SIZE
x = tl.load(x_ptr + row * stride_x + group * GROUP_SIZE + cols, mask=mask, other=0.0).to(tl.float32)
{glue.ruler("fp32 absmax, scale and the saturating cast")}
{_quantise(c, None)}
tl.store(q_ptr + row * stride_q + group * GROUP_SIZE + cols, q, mask=mask)
tl.store(s_ptr + row * stride_s_row + group * stride_s_group, scale)"""
    kernel = _jit("_per_token_group_quant_fp8_kernel", PARAMS + "\n    BLOCK: tl.constexpr,", body)
    warps = "min(max(BLOCK // 256, 1), 8)" if c["warps"] == "by_block" else str(c["warps"])
    launch = dedent(f"""\
    BLOCK = triton.next_power_of_2(GROUP_SIZE)
    num_warps = {warps}
    _per_token_group_quant_fp8_kernel[(n_rows * n_groups,)]({ARGS}, BLOCK=BLOCK, num_warps=num_warps, num_stages={c["stages"]})""")
    doc = _doc("one program per group", "M x K / 128 programs of 128 elements each: many tiny "
               "programs, one load, one reduction and two stores each.", c)
    return _finish(c, doc, [kernel, _guarded(c, for_check, "One program per group.", launch)], (), for_check)


def render_per_row(c: Choices, for_check: bool) -> str:
    loop = f"tl.range(0, n_groups, num_stages={c['loop_stages']})" if c["loop_stages"] else "range(0, n_groups)"
    body = f"""\
{glue.ruler("one program per row, looping over its groups")}
row = {_offset(c, "tl.program_id(0)")}
cols = tl.arange(0, GROUP_SIZE)
for group in {loop}:
    x = tl.load(x_ptr + row * stride_x + group * GROUP_SIZE + cols).to(tl.float32)
{indent(_quantise(c, None), 4)}
    tl.store(q_ptr + row * stride_q + group * GROUP_SIZE + cols, q)
    tl.store(s_ptr + row * stride_s_row + group * stride_s_group, scale)"""
    kernel = _jit("_quant_fp8_row_kernel", PARAMS, body)
    launch = f"_quant_fp8_row_kernel[(n_rows,)]({ARGS}, num_warps={c['warps']})"
    doc = _doc("one program per row, looping over its groups", "M programs, each walks K / 128 "
               "groups one after another: few programs for short-M shapes.", c)
    return _finish(c, doc, [kernel, _guarded(c, for_check, "One program per row.", launch)], (), for_check)


def render_group_tile(c: Choices, for_check: bool) -> str:
    kind, size = c["tile"]
    if kind == "groups":
        body = f"""\
{glue.ruler(f"a ({size}, 128) tile: {size} consecutive groups of one row")}
row = {_offset(c, "tl.program_id(0)")}
groups = tl.program_id(1) * TILE + tl.arange(0, TILE)
cols = tl.arange(0, GROUP_SIZE)
g_mask = groups < n_groups
offs = groups[:, None] * GROUP_SIZE + cols[None, :]
x = tl.load(x_ptr + row * stride_x + offs, mask=g_mask[:, None], other=0.0).to(tl.float32)
{_quantise(c, "1", "[:, None]")}
tl.store(q_ptr + row * stride_q + offs, q, mask=g_mask[:, None])
tl.store(s_ptr + row * stride_s_row + groups * stride_s_group, scale, mask=g_mask)"""
        grid = "(n_rows, triton.cdiv(n_groups, TILE))"
    else:
        body = f"""\
{glue.ruler(f"a ({size}, 128) tile: one group of {size} rows")}
rows = {_offset(c, "tl.program_id(0)")} * TILE + tl.arange(0, TILE)
group = tl.program_id(1)
cols = tl.arange(0, GROUP_SIZE)
r_mask = rows < n_rows
x = tl.load(x_ptr + rows[:, None] * stride_x + group * GROUP_SIZE + cols[None, :], mask=r_mask[:, None], other=0.0).to(tl.float32)
{_quantise(c, "1", "[:, None]")}
tl.store(q_ptr + rows[:, None] * stride_q + group * GROUP_SIZE + cols[None, :], q, mask=r_mask[:, None])
tl.store(s_ptr + rows * stride_s_row + group * stride_s_group, scale, mask=r_mask)"""
        grid = "(triton.cdiv(n_rows, TILE), n_groups)"
    kernel = _jit("_quant_fp8_tile_kernel", PARAMS + "\n    TILE: tl.constexpr,", body)
    launch = f"_quant_fp8_tile_kernel[{grid.replace('TILE', str(size))}]({ARGS}, TILE={size}, num_warps={c['warps']})"
    doc = _doc("2-D tiles of groups", f"Each program quantises a ({size}, 128) tile ({kind} along its "
               "first axis): absmax along axis 1, one scale per group.", c)
    return _finish(c, doc, [kernel, _guarded(c, for_check, "2-D tiles of groups.", launch)], (), for_check)


def render_persistent(c: Choices, for_check: bool) -> str:
    body = f"""\
{glue.ruler("a fixed grid striding over all M x K / 128 groups")}
cols = tl.arange(0, GROUP_SIZE)
total = n_rows * n_groups
for group_id in tl.range(tl.program_id(0), total, tl.num_programs(0), num_stages={c["loop_stages"]}):
    row = group_id // n_groups
    group = group_id % n_groups
    x = tl.load(x_ptr + row * stride_x + group * GROUP_SIZE + cols).to(tl.float32)
{indent(_quantise(c, None), 4)}
    tl.store(q_ptr + row * stride_q + group * GROUP_SIZE + cols, q)
    tl.store(s_ptr + row * stride_s_row + group * stride_s_group, scale)"""
    kernel = _jit("_quant_fp8_persistent_kernel", PARAMS, body)
    code, sms = glue.sm_count_part(c["sms"], for_check)
    launch = dedent(f"""\
    programs = min(n_rows * n_groups, {c["per_sm"]} * {sms})
    _quant_fp8_persistent_kernel[(programs,)]({ARGS}, num_warps={c["warps"]})""")
    doc = _doc("a persistent grid over groups", "The grid is sized from the SM count; each program "
               "walks group ids start, start + grid, ...", c)
    imports = ("functools",) if c["sms"] == "torch_props" and not for_check else ()
    return _finish(c, doc, [code, kernel, _guarded(c, for_check, "Persistent programs over groups.", launch)],
                   imports, for_check)


def render_scales_first(c: Choices, for_check: bool) -> str:
    scales_body = f"""\
{glue.ruler("first kernel: one scale per group, (ROWS, 128) tiles")}
rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
group = tl.program_id(1)
cols = tl.arange(0, GROUP_SIZE)
r_mask = rows < n_rows
x = tl.load(x_ptr + rows[:, None] * stride_x + group * GROUP_SIZE + cols[None, :], mask=r_mask[:, None], other=0.0).to(tl.float32)
scale = tl.maximum(tl.max(tl.abs(x), axis=1), EPS) / FP8_MAX
tl.store(s_ptr + rows * stride_s_row + group * stride_s_group, scale, mask=r_mask)"""
    scaled = "x * (1.0 / scale)[:, None]" if c.get("scale_math") == "reciprocal" else "x / scale[:, None]"
    clamp = (f"tl.minimum(tl.maximum({scaled}, -FP8_MAX), FP8_MAX)" if c.get("clamp") == "min_max"
             else f"tl.clamp({scaled}, -FP8_MAX, FP8_MAX)")
    quant_body = f"""\
{glue.ruler("second kernel: read x and the scales again, write q")}
rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
group = tl.program_id(1)
cols = tl.arange(0, GROUP_SIZE)
r_mask = rows < n_rows
x = tl.load(x_ptr + rows[:, None] * stride_x + group * GROUP_SIZE + cols[None, :], mask=r_mask[:, None], other=0.0).to(tl.float32)
scale = tl.load(s_ptr + rows * stride_s_row + group * stride_s_group, mask=r_mask, other=1.0)
q = {_cast(c, clamp)}
tl.store(q_ptr + rows[:, None] * stride_q + group * GROUP_SIZE + cols[None, :], q, mask=r_mask[:, None])"""
    k1 = _jit("_group_scales_kernel", PARAMS + "\n    ROWS: tl.constexpr,", scales_body)
    k2 = _jit("_group_quant_kernel", PARAMS + "\n    ROWS: tl.constexpr,", quant_body)
    launch = dedent(f"""\
    grid = (triton.cdiv(n_rows, {c["rows"]}), n_groups)
    _group_scales_kernel[grid]({ARGS}, ROWS={c["rows"]}, num_warps={c["warps"]})
    _group_quant_kernel[grid]({ARGS}, ROWS={c["rows"]}, num_warps={c["warps"]})""")
    doc = _doc("scales first, then the quantisation", "Unfused: x is read twice (once per kernel) and "
               "the scales make a round trip through HBM; two launches.", c)
    return _finish(c, doc, [k1, k2, _guarded(c, for_check, "Scales, then q.", launch)], (), for_check)


def space() -> TaskSpace:
    common = {"dialect": tuple(DIALECTS), "guard": glue.LAUNCH_GUARDS, "scale_math": ("divide", "reciprocal"),
              "clamp": ("clamp", "min_max"), "scale_layout": ("row_major", "col_major")}
    structures = (
        Structure("per_group", "one program per group of 128",
                  {**common, "warps": ("by_block", 1, 2, 4, 8), "stages": (1, 2, 3), "int64": (False, True)},
                  render_per_group),
        Structure("per_row", "one program per row, looping over its groups",
                  {**common, "warps": (1, 2, 4, 8), "loop_stages": (None, 2, 3, 4), "int64": (False, True)},
                  render_per_row),
        Structure("group_tile", "2-D tiles of groups",
                  {**common, "tile": (("groups", 2), ("groups", 4), ("groups", 8), ("groups", 16),
                                      ("rows", 2), ("rows", 4), ("rows", 8), ("rows", 32)),
                   "warps": (1, 2, 4, 8), "int64": (False, True)}, render_group_tile),
        Structure("persistent", "SM-sized grid striding over groups",
                  {**common, "sms": glue.SM_SOURCES, "per_sm": (1, 2, 4, 8, 16), "warps": (1, 2, 4),
                   "loop_stages": (1, 2, 3)}, render_persistent),
        Structure("scales_first", "a scale kernel, then a quantise kernel",
                  {**{k: v for k, v in common.items()}, "rows": (1, 4, 16, 64), "warps": (1, 2, 4, 8)},
                  render_scales_first),
    )
    return TaskSpace(TASK, structures)
