"""Kernel families of the fp8_quant task: per-(row, 128-column group) absmax scale, e4m3 output.

The reference moves ~40 B/elt through fp32 temporaries; a fused kernel reads 2 B, writes 1 B.
    group_tile            one program per (row, GROUPS_PER_PROGRAM groups): a [G, 128] tile
    row_looped            one program per row, looping over its groups G at a time
    persistent_tiles      a fixed grid of programs striding over all (row, group-block) tiles
    two_kernel_unfused    a scales kernel, then a quantise kernel that re-reads x
    chunked_naive         one program per group, two scalar-ish passes of CHUNK elements
    torch_cast_fallback   Triton writes clamped fp32/bf16 values, PyTorch casts them to e4m3
    torch_scales          PyTorch computes the scales, Triton quantises

The Triton interpreter (TRITON_INTERPRET=1) mis-rounds fp32 -> e4m3 casts whose mantissa
carries into the exponent (e.g. 127.99 becomes 64, not 128). Every in-kernel cast is therefore
preceded by an exact round-to-nearest-even onto the e4m3 grid in fp32 (`round_to_e4m3`, after
which the cast is exact on any backend): always with rounding="bits", and only under the
interpreter (PRE_ROUND, set by the launcher for CPU tensors) with rounding="cvt", which on a GPU
leaves the rounding to the hardware cvt instruction. torch_cast_fallback avoids the in-kernel
cast altogether.
"""

from __future__ import annotations

from pipelines.generation.families import _rowwise as rw
from pipelines.generation.space import Family, Knob, KnobValues

TASK = "fp8_quant"

KNOB_DOCS = {
    "PROGRAMS": "programs of the capped grid (min(PROGRAMS, tiles) are launched)",
    "GROUPS_PER_PROGRAM": "128-column groups per tile",
    "CHUNK": "elements per step within a 128-column group",
    "NUM_WARPS": "warps per program",
    "NUM_STAGES": "software-pipelining depth of loops",
    "GRID_SIZE": "programs of the persistent grid (capped at the tile count)",
}

G_TILE = Knob("GROUPS_PER_PROGRAM", (1, 2, 4, 8, 16, 32), "128-column groups per tile")
G_LOOP = Knob("GROUPS_PER_PROGRAM", (1, 2, 4, 8, 16), "128-column groups per loop step")
G_PERSIST = Knob("GROUPS_PER_PROGRAM", (1, 2, 4, 8), "128-column groups per tile")
NUM_WARPS_SMALL = Knob("NUM_WARPS", (1, 2, 4, 8), "warps per program")
CHUNK = Knob("CHUNK", (8, 16, 32, 64), "elements per step within a 128-column group")
SCALE_MATH = Knob(
    "scale_math",
    ("div", "mul_reciprocal"),
    "q = x / scale, or q = x * (448 / absmax) (one division per group instead of per element)",
)
ROUNDING = Knob(
    "rounding",
    ("cvt", "bits"),
    "e4m3 rounding by the hardware cvt, or by an fp32 bit trick before an exact cast",
)
TMP_DTYPE = Knob(
    "tmp_dtype", ("float32", "bfloat16"), "dtype of the clamped values handed to PyTorch"
)

HELPERS = """\
@triton.jit
def round_to_e4m3(v):
    # v: fp32, |v| <= 448. Returns v rounded half-to-even onto the e4m3 grid, still fp32, so the
    # fp8 cast that follows is exact on every backend (the interpreter's own rounding carries
    # wrongly across binades). Normal range: keep 3 of fp32's 23 mantissa bits.
    bits = v.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000
    normal = bits.to(tl.float32, bitcast=True)
    # subnormal range (|v| < 2^-6): a fixed step of 2^-9; adding 1.5 * 2^14 rounds to it
    sub = (tl.abs(v) + 24576.0) - 24576.0
    sub = tl.where(v < 0, -sub, sub)
    return tl.where(tl.abs(v) < 0.015625, sub, normal)"""

PROLOGUE = """\
def custom_kernel(data):
    (x,) = data
    assert x.ndim == 2 and x.dtype == torch.bfloat16, "fp8_quant expects x: (M, K) bf16"
    M, K = x.shape
    assert K % 128 == 0, "K must be a multiple of the 128-column group"
    if x.stride(1) != 1:
        x = x.contiguous()  # the kernels step through columns with unit stride
    n_groups = K // 128
    q = torch.empty((M, K), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty((M, n_groups), dtype=torch.float32, device=x.device)"""

PRE_ROUND_LINE = (
    "    # the Triton interpreter (CPU tensors) cannot round fp32 -> e4m3 correctly: pre-round there\n"
    "    PRE_ROUND = not x.is_cuda"
)


def _quantise(v: KnobValues, x: str, amax: str, bcast: str) -> str:
    """Lines computing `scale` and clamped fp32 `q` from fp32 `x` and its group absmax.

    `bcast` broadcasts a per-group value against `x` (e.g. "[:, None]", or "" for a scalar)."""
    lines = [f"scale = tl.maximum({amax}, 1e-10) / 448.0  # fp32, one per group"]
    if v.get("scale_math", "div") == "div":
        lines.append(f"q = {x} / scale{bcast}")
    else:
        lines.append(
            f"q = {x} * (448.0 / tl.maximum({amax}, 1e-10)){bcast}  # one division per group"
        )
    lines.append("q = tl.minimum(tl.maximum(q, -448.0), 448.0)")
    return "\n".join(lines)


def _round(v: KnobValues) -> str:
    """Rounding before the fp8 cast (see the module docstring)."""
    if v.get("rounding") == "bits":
        return "q = round_to_e4m3(q)  # exact RNE in fp32; the cast below is then exact"
    return "if PRE_ROUND:\n    q = round_to_e4m3(q)  # interpreter only; a GPU rounds in its cvt"


def _indent(code: str, n: int) -> str:
    pad = " " * n
    return "\n".join(pad + line if line else line for line in code.splitlines())


def _pre_round(v: KnobValues) -> tuple[str, str, str]:
    """(kernel constexpr parameter line, launcher line, launch kwarg) for rounding="cvt"."""
    if v.get("rounding") == "cvt":
        return (
            "    PRE_ROUND: tl.constexpr,  # pre-round onto the e4m3 grid (interpreter only)\n",
            PRE_ROUND_LINE + "\n",
            " PRE_ROUND=PRE_ROUND,",
        )
    return "", "", ""


def _module(
    v: KnobValues,
    algorithm: str,
    summary: str,
    details: str,
    traffic: str,
    kernels: str,
    launcher: str,
    helpers: bool = True,
) -> str:
    choices = ", ".join(f"{k}={v[k]}" for k in ("scale_math", "rounding", "tmp_dtype") if k in v)
    return rw.module(
        task=TASK,
        algorithm=algorithm,
        summary=summary,
        details=details + (f" {choices}." if choices else ""),
        traffic=traffic,
        values=v,
        knob_docs=KNOB_DOCS,
        kernels=kernels,
        launcher=launcher,
        helpers=HELPERS if helpers else "",
    )


SIGNATURE = """\
    # pointers
    x_ptr, q_ptr, s_ptr,
    # sizes
    M, n_groups,
    # strides (elements)
    stride_xm, stride_qm, stride_sm,"""


def _tile_body(v: KnobValues) -> str:
    """Quantise the [G, 128] tile of groups `groups` of row `row` (kernel-body code, unindented)."""
    ev = rw.evict(v)
    return f"""\
gmask = groups < n_groups
offs = groups[:, None] * 128 + tl.arange(0, 128)[None, :]  # [G, 128] column indices
x = tl.load(x_ptr + row * stride_xm + offs, mask=gmask[:, None], other=0.0{ev}).to(tl.float32)
# -- per-group absmax -> scale, then scale, clamp, round (fp32)
amax = tl.max(tl.abs(x), axis=1)  # (G,)
{_quantise(v, "x", "amax", "[:, None]")}
{_round(v)}
# -- write 1 B/elt of e4m3 and one fp32 scale per group
tl.store(q_ptr + row * stride_qm + offs, q.to(tl.float8e4nv), mask=gmask[:, None])
tl.store(s_ptr + row * stride_sm + groups, scale, mask=gmask)"""


# -----------------------------------------------------------------------------
# group_tile
# -----------------------------------------------------------------------------
def render_group_tile(v: KnobValues) -> str:
    param, pre_line, pre_kw = _pre_round(v)
    kernels = f"""\
@triton.jit
def fp8_quant_kernel(
{SIGNATURE}
    # meta-parameters
    G: tl.constexpr,  # 128-column groups per program
{param}):
    # -- map program to (row, block of G groups)
    row = tl.program_id(0)
    groups = tl.program_id(1) * G + tl.arange(0, G)
{_indent(_tile_body(v), 4)}
"""
    launcher = f"""\
{PROLOGUE}
{pre_line}    grid = (M, triton.cdiv(n_groups, GROUPS_PER_PROGRAM))
    fp8_quant_kernel[grid](
        x, q, scales, M, n_groups, x.stride(0), q.stride(0), scales.stride(0),
        G=GROUPS_PER_PROGRAM,{pre_kw}
        num_warps=NUM_WARPS,
    )
    return q, scales
"""
    return _module(
        v,
        "group_tile",
        "one program per (row, GROUPS_PER_PROGRAM groups), a [G, 128] tile",
        """Each program loads a [G, 128] tile (G consecutive groups of one row), reduces the
        absmax of each group along the 128 columns, and writes the e4m3 values and the G scales;
        no loop, so the grid is M x K/(128 G) programs.""",
        "2 B read + 1 B written per element, 4 B per 128 elements of scales, one kernel.",
        kernels,
        launcher,
    )


# -----------------------------------------------------------------------------
# row_looped
# -----------------------------------------------------------------------------
def render_row_looped(v: KnobValues) -> str:
    param, pre_line, pre_kw = _pre_round(v)
    kernels = f"""\
@triton.jit
def fp8_quant_kernel(
{SIGNATURE}
    # meta-parameters
    G: tl.constexpr,  # 128-column groups per loop step
    NUM_STAGES: tl.constexpr,
{param}):
    # -- one program per row, looping over its groups G at a time
    row = tl.program_id(0)
    for g0 in tl.range(0, n_groups, G, num_stages=NUM_STAGES):
        groups = g0 + tl.arange(0, G)
{_indent(_tile_body(v), 8)}
"""
    launcher = f"""\
{PROLOGUE}
{pre_line}    fp8_quant_kernel[(M,)](
        x, q, scales, M, n_groups, x.stride(0), q.stride(0), scales.stride(0),
        G=GROUPS_PER_PROGRAM, NUM_STAGES=NUM_STAGES,{pre_kw}
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return q, scales
"""
    return _module(
        v,
        "row_looped",
        "one program per row, looping over its groups",
        """One program per row walks the row's groups G at a time ([G, 128] tiles), the loop
        software-pipelined NUM_STAGES deep. Only M programs: with few rows (the 256-row shapes)
        most SMs get one program or none.""",
        "2 B read + 1 B written per element, 4 B per 128 elements of scales, one kernel.",
        kernels,
        launcher,
    )


# -----------------------------------------------------------------------------
# persistent_tiles
# -----------------------------------------------------------------------------
def render_persistent(v: KnobValues) -> str:
    param, pre_line, pre_kw = _pre_round(v)
    kernels = f"""\
@triton.jit
def fp8_quant_kernel(
{SIGNATURE}
    n_tiles, tiles_per_row,
    # meta-parameters
    G: tl.constexpr,  # 128-column groups per tile
    NUM_STAGES: tl.constexpr,
{param}):
    # -- persistent schedule: program p handles tiles p, p + P, ...; tile t = (row, block)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for t in tl.range(pid, n_tiles, nprog, num_stages=NUM_STAGES):
        row = t // tiles_per_row
        groups = (t % tiles_per_row) * G + tl.arange(0, G)
{_indent(_tile_body(v), 8)}
"""
    launcher = f"""\
{PROLOGUE}
{pre_line}    tiles_per_row = triton.cdiv(n_groups, GROUPS_PER_PROGRAM)
    n_tiles = M * tiles_per_row
    grid = (min(GRID_SIZE, n_tiles),)
    fp8_quant_kernel[grid](
        x, q, scales, M, n_groups, x.stride(0), q.stride(0), scales.stride(0),
        n_tiles, tiles_per_row,
        G=GROUPS_PER_PROGRAM, NUM_STAGES=NUM_STAGES,{pre_kw}
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return q, scales
"""
    return _module(
        v,
        "persistent_tiles",
        "a fixed grid of programs striding over all [G, 128] tiles",
        """GRID_SIZE programs (capped at the tile count) stride over the M x K/(128 G) tiles,
        the tile loop software-pipelined NUM_STAGES deep. A grid far below the SM count leaves
        the GPU idle; near it, launch cost is paid once.""",
        "2 B read + 1 B written per element, 4 B per 128 elements of scales, one kernel.",
        kernels,
        launcher,
    )


# -----------------------------------------------------------------------------
# two_kernel_unfused
# -----------------------------------------------------------------------------
def render_two_kernel(v: KnobValues) -> str:
    param, pre_line, pre_kw = _pre_round(v)
    ev = rw.evict(v)
    if v["scale_math"] == "div":
        qline = "q = x / scale[:, None]"
    else:
        qline = "q = x * (1.0 / scale)[:, None]  # one division per group"
    kernels = f"""\
@triton.jit
def scales_kernel(
    # pointers
    x_ptr, s_ptr,
    # sizes
    n_groups,
    # strides (elements)
    stride_xm, stride_sm,
    # meta-parameters
    G: tl.constexpr,  # 128-column groups per program
):
    # -- pass 1 over x: per-group absmax -> scale
    row = tl.program_id(0)
    groups = tl.program_id(1) * G + tl.arange(0, G)
    gmask = groups < n_groups
    offs = groups[:, None] * 128 + tl.arange(0, 128)[None, :]
    x = tl.load(x_ptr + row * stride_xm + offs, mask=gmask[:, None], other=0.0{ev}).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-10) / 448.0
    tl.store(s_ptr + row * stride_sm + groups, scale, mask=gmask)


@triton.jit
def quantise_kernel(
    # pointers
    x_ptr, s_ptr, q_ptr,
    # sizes
    n_groups,
    # strides (elements)
    stride_xm, stride_sm, stride_qm,
    # meta-parameters
    G: tl.constexpr,  # 128-column groups per program
{param}):
    # -- pass 2 over x: scale with the stored scales, clamp, round, cast
    row = tl.program_id(0)
    groups = tl.program_id(1) * G + tl.arange(0, G)
    gmask = groups < n_groups
    offs = groups[:, None] * 128 + tl.arange(0, 128)[None, :]
    x = tl.load(x_ptr + row * stride_xm + offs, mask=gmask[:, None], other=0.0{ev}).to(tl.float32)
    scale = tl.load(s_ptr + row * stride_sm + groups, mask=gmask, other=1.0)
    {qline}
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
{_indent(_round(v), 4)}
    tl.store(q_ptr + row * stride_qm + offs, q.to(tl.float8e4nv), mask=gmask[:, None])
"""
    launcher = f"""\
{PROLOGUE}
{pre_line}    grid = (M, triton.cdiv(n_groups, GROUPS_PER_PROGRAM))
    scales_kernel[grid](x, scales, n_groups, x.stride(0), scales.stride(0), G=GROUPS_PER_PROGRAM, num_warps=NUM_WARPS)
    quantise_kernel[grid](
        x, scales, q, n_groups, x.stride(0), scales.stride(0), q.stride(0),
        G=GROUPS_PER_PROGRAM,{pre_kw}
        num_warps=NUM_WARPS,
    )
    return q, scales
"""
    return _module(
        v,
        "two_kernel_unfused",
        "a scales kernel, then a quantise kernel re-reading x",
        """Unfused: the first launch reads x and writes the per-group scales, the second reads x
        again plus the scales and writes the e4m3 values. Twice the reads of x and two
        launches.""",
        "2 x 2 B read + 1 B written per element, scales written and read back.",
        kernels,
        launcher,
    )


# -----------------------------------------------------------------------------
# chunked_naive
# -----------------------------------------------------------------------------
def render_chunked(v: KnobValues) -> str:
    param, pre_line, pre_kw = _pre_round(v)
    ev = rw.evict(v)
    if v["scale_math"] == "div":
        inv, scaled = "", "x / scale"
    else:
        inv, scaled = (
            "    inv = 448.0 / tl.maximum(amax, 1e-10)  # one division per group",
            "x * inv",
        )
    kernels = f"""\
@triton.jit
def fp8_quant_kernel(
{SIGNATURE}
    # meta-parameters
    CHUNK: tl.constexpr,  # elements per step within the 128-column group
{param}):
    # -- one program per (row, group): the group is walked CHUNK elements at a time, twice
    row = tl.program_id(0)
    group = tl.program_id(1)
    x_grp = x_ptr + row * stride_xm + group * 128
    q_grp = q_ptr + row * stride_qm + group * 128
    cols = tl.arange(0, CHUNK)
    # -- pass 1: absmax, one small block reduction per chunk
    amax = 0.0
    for c in range(0, 128, CHUNK):
        x = tl.load(x_grp + c + cols{ev}).to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(x), axis=0))
    scale = tl.maximum(amax, 1e-10) / 448.0  # fp32
{inv}
    tl.store(s_ptr + row * stride_sm + group, scale)
    # -- pass 2: re-read each chunk, scale, clamp, round, cast
    for c in range(0, 128, CHUNK):
        x = tl.load(x_grp + c + cols{ev}).to(tl.float32)
        q = tl.minimum(tl.maximum({scaled}, -448.0), 448.0)
{_indent(_round(v), 8)}
        tl.store(q_grp + c + cols, q.to(tl.float8e4nv))
"""
    launcher = f"""\
{PROLOGUE}
{pre_line}    fp8_quant_kernel[(M, n_groups)](
        x, q, scales, M, n_groups, x.stride(0), q.stride(0), scales.stride(0),
        CHUNK=CHUNK,{pre_kw}
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return q, scales
"""
    return _module(
        v,
        "chunked_naive",
        "one program per group, two passes of CHUNK elements",
        """Naive: one program per (row, group) walks its 128 elements CHUNK at a time, once for
        the absmax and once to quantise, with a block reduction per chunk; small chunks over
        many warps leave most threads idle and serialise on latency.""",
        "2 x 2 B read (the second from L1/L2) + 1 B written per element.",
        kernels,
        launcher,
    )


# -----------------------------------------------------------------------------
# torch_cast_fallback
# -----------------------------------------------------------------------------
def render_torch_cast(v: KnobValues) -> str:
    ev = rw.evict(v)
    kernels = f"""\
@triton.jit
def fp8_prepare_kernel(
    # pointers
    x_ptr, t_ptr, s_ptr,
    # sizes
    n_groups,
    # strides (elements)
    stride_xm, stride_tm, stride_sm,
    # meta-parameters
    G: tl.constexpr,  # 128-column groups per loop step
):
    # -- one program per row: scales and clamped, scaled values; the e4m3 cast is left to PyTorch
    row = tl.program_id(0)
    for g0 in range(0, n_groups, G):
        groups = g0 + tl.arange(0, G)
        gmask = groups < n_groups
        offs = groups[:, None] * 128 + tl.arange(0, 128)[None, :]
        x = tl.load(x_ptr + row * stride_xm + offs, mask=gmask[:, None], other=0.0{ev}).to(tl.float32)
        amax = tl.max(tl.abs(x), axis=1)
{_indent(_quantise(v, "x", "amax", "[:, None]"), 8)}
        tl.store(t_ptr + row * stride_tm + offs, q.to(t_ptr.dtype.element_ty), mask=gmask[:, None])
        tl.store(s_ptr + row * stride_sm + groups, scale, mask=gmask)
"""
    launcher = f"""\
{PROLOGUE}
    t = torch.empty((M, K), dtype=torch.{v["tmp_dtype"]}, device=x.device)  # clamped x / scale
    fp8_prepare_kernel[(M,)](
        x, t, scales, n_groups, x.stride(0), t.stride(0), scales.stride(0),
        G=GROUPS_PER_PROGRAM,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    # -- PyTorch fallback for the e4m3 cast (round-to-nearest-even on every backend)
    q.copy_(t.to(torch.float8_e4m3fn))
    return q, scales
"""
    nbytes = 4 if v["tmp_dtype"] == "float32" else 2
    return _module(
        v,
        "torch_cast_fallback",
        "Triton scales and clamps, PyTorch casts to e4m3",
        f"""A row-looped Triton kernel computes the scales and the clamped, scaled values but
        stores them as {v["tmp_dtype"]}; PyTorch then casts to float8_e4m3fn and copies. The
        documented interpreter-safe fallback (no fp8 cast inside the kernel), paid for with a
        round trip through an (M, K) temporary.""",
        f"2 B read + {nbytes} B written by Triton, then {nbytes} B read + 1 B written (+ a 1 B copy) by PyTorch per element.",
        kernels,
        launcher,
        helpers=False,
    )


# -----------------------------------------------------------------------------
# torch_scales
# -----------------------------------------------------------------------------
def render_torch_scales(v: KnobValues) -> str:
    param, pre_line, pre_kw = _pre_round(v)
    ev = rw.evict(v)
    if v["scale_math"] == "div":
        qline = "q = x / scale[:, None]"
    else:
        qline = "q = x * (1.0 / scale)[:, None]  # one division per group"
    kernels = f"""\
@triton.jit
def quantise_kernel(
    # pointers
    x_ptr, s_ptr, q_ptr,
    # sizes
    n_groups,
    # strides (elements)
    stride_xm, stride_sm, stride_qm,
    # meta-parameters
    G: tl.constexpr,  # 128-column groups per program
{param}):
    # -- one program per (row, G groups): quantise with scales computed by PyTorch
    row = tl.program_id(0)
    groups = tl.program_id(1) * G + tl.arange(0, G)
    gmask = groups < n_groups
    offs = groups[:, None] * 128 + tl.arange(0, 128)[None, :]
    x = tl.load(x_ptr + row * stride_xm + offs, mask=gmask[:, None], other=0.0{ev}).to(tl.float32)
    scale = tl.load(s_ptr + row * stride_sm + groups, mask=gmask, other=1.0)
    {qline}
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
{_indent(_round(v), 4)}
    tl.store(q_ptr + row * stride_qm + offs, q.to(tl.float8e4nv), mask=gmask[:, None])
"""
    launcher = f"""\
{PROLOGUE}
{pre_line}    # -- PyTorch fallback for the scales: an fp32 copy of x, abs, amax per group
    scales.copy_(x.view(M, n_groups, 128).float().abs().amax(dim=-1).clamp(min=1e-10) / 448.0)
    grid = (M, triton.cdiv(n_groups, GROUPS_PER_PROGRAM))
    quantise_kernel[grid](
        x, scales, q, n_groups, x.stride(0), scales.stride(0), q.stride(0),
        G=GROUPS_PER_PROGRAM,{pre_kw}
        num_warps=NUM_WARPS,
    )
    return q, scales
"""
    return _module(
        v,
        "torch_scales",
        "PyTorch computes the group scales, Triton quantises",
        """The per-group scales come from PyTorch (an fp32 copy of x, abs, amax, clamp, divide);
        a [G, 128]-tiled Triton kernel then reads x and the scales and writes e4m3.""",
        "PyTorch moves ~18 B per element for the scales; Triton reads 2 B and writes 1 B.",
        kernels,
        launcher,
    )


# -----------------------------------------------------------------------------
# The space
# -----------------------------------------------------------------------------
# -----------------------------------------------------------------------------
# grid_capped_tiles
# -----------------------------------------------------------------------------
def render_grid_capped(v: KnobValues) -> str:
    param, pre_line, pre_kw = _pre_round(v)
    kernels = f"""\
@triton.jit
def fp8_quant_kernel(
{SIGNATURE}
    # meta-parameters
    G: tl.constexpr,  # 128-column groups per tile
    NUM_STAGES: tl.constexpr,
{param}):
    # -- capped persistent schedule over the M x cdiv(n_groups, G) tiles: program p takes
    #    tiles p, p + P, p + 2P, ... (row-major, so consecutive tiles walk along a row)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    tiles_per_row = tl.cdiv(n_groups, G)
    for tile in tl.range(pid, M * tiles_per_row, nprog, num_stages=NUM_STAGES):
        row = tile // tiles_per_row
        groups = (tile % tiles_per_row) * G + tl.arange(0, G)
{_indent(_tile_body(v), 8)}
"""
    launcher = f"""\
{PROLOGUE}
{pre_line}    tiles = M * triton.cdiv(n_groups, GROUPS_PER_PROGRAM)
    grid = (min(PROGRAMS, tiles),)  # deliberately few programs: each walks tiles / PROGRAMS tiles
    fp8_quant_kernel[grid](
        x, q, scales, M, n_groups, x.stride(0), q.stride(0), scales.stride(0),
        G=GROUPS_PER_PROGRAM, NUM_STAGES=NUM_STAGES,{pre_kw}
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return q, scales
"""
    return _module(
        v,
        "grid_capped_tiles",
        "[G, 128] tiles walked by a capped grid of PROGRAMS programs",
        """Only min(PROGRAMS, tiles) programs are launched, whatever the size of the problem:
        program p quantises [G, 128] tiles p, p + P, p + 2P, ... one after another. An H100/H200
        has 132 SMs, so with PROGRAMS < 132 most of the GPU idles and the kernel is bound by the
        memory latency one program can hide; time falls roughly as 1 / PROGRAMS until the SMs
        fill up.""",
        "2 B read + 1 B written per element, but at the bandwidth PROGRAMS programs reach.",
        kernels,
        launcher,
    )


def _tile_ok(v: KnobValues) -> bool:
    return rw.elems_per_thread_ok(v["GROUPS_PER_PROGRAM"] * 128, v["NUM_WARPS"])


FAMILIES: tuple[Family, ...] = (
    rw.family(
        TASK,
        "group_tile",
        "one program per (row, G groups), [G, 128] tile, no loop",
        (G_TILE, rw.NUM_WARPS, SCALE_MATH, ROUNDING, rw.EVICTION),
        render_group_tile,
        _tile_ok,
    ),
    rw.family(
        TASK,
        "row_looped",
        "one program per row looping over its groups",
        (G_LOOP, rw.NUM_WARPS, rw.NUM_STAGES, SCALE_MATH, ROUNDING, rw.EVICTION),
        render_row_looped,
        _tile_ok,
    ),
    rw.family(
        TASK,
        "persistent_tiles",
        "a fixed grid of programs striding over all tiles",
        (rw.GRID_SIZE, G_PERSIST, NUM_WARPS_SMALL, rw.NUM_STAGES, ROUNDING),
        render_persistent,
        _tile_ok,
    ),
    rw.family(
        TASK,
        "two_kernel_unfused",
        "scales kernel, then a quantise kernel re-reading x",
        (G_LOOP, rw.NUM_WARPS, SCALE_MATH, ROUNDING, rw.EVICTION),
        render_two_kernel,
        _tile_ok,
    ),
    rw.family(
        TASK,
        "chunked_naive",
        "one program per group, two passes of CHUNK elements",
        (CHUNK, rw.NUM_WARPS, rw.NUM_STAGES, SCALE_MATH, ROUNDING, rw.EVICTION),
        render_chunked,
    ),
    rw.family(
        TASK,
        "torch_cast_fallback",
        "Triton scales and clamps, PyTorch casts to e4m3",
        (G_LOOP, rw.NUM_WARPS, rw.NUM_STAGES, SCALE_MATH, TMP_DTYPE, rw.EVICTION),
        render_torch_cast,
        _tile_ok,
    ),
    rw.family(
        TASK,
        "torch_scales",
        "PyTorch computes the scales, Triton quantises",
        (G_LOOP, rw.NUM_WARPS, SCALE_MATH, ROUNDING, rw.EVICTION),
        render_torch_scales,
        _tile_ok,
    ),
    rw.family(
        TASK,
        "grid_capped_tiles",
        "[G, 128] tiles walked by a capped grid of PROGRAMS programs (under-occupancy)",
        (rw.PROGRAMS, G_LOOP, NUM_WARPS_SMALL, rw.NUM_STAGES, ROUNDING),
        render_grid_capped,
        _tile_ok,
    ),
)

SEED: tuple[str, dict] = (
    "group_tile",
    {
        "GROUPS_PER_PROGRAM": 1,
        "NUM_WARPS": 4,
        "scale_math": "div",
        "rounding": "cvt",
        "eviction": "none",
    },
)
