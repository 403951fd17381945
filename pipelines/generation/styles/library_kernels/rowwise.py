"""Row-wise kernels (softmax, rms_norm, layer_norm) as kernel libraries write them.

Each task reduces a row of x (M, N) bf16 to statistics, then writes the row normalised; the
libraries differ in how programs map to rows and how the reduction runs, which is what the
structures here vary:

    row_block        one program per row, the whole row in registers (Liger, unsloth, tutorial 02)
    multi_row        ROWS rows per program in a 2-D block (Liger's block kernels for short rows)
    persistent_rows  a grid of k x SM-count programs striding over rows, or one sized by
                     occupancy after compiling ahead (tutorial 02 on Triton 3)
    looped           one program (or a persistent program) per row, the row walked in chunks:
                     online or two-pass softmax, sum-of-squares loops, Welford or tutorial 05's
                     mean/variance/normalise loops for layer_norm
    split_row        the row split over a second grid dimension: partial statistics per chunk,
                     a small combine kernel (or a combine inside each apply program), then an
                     elementwise apply kernel
    stats_then_apply a statistics kernel per row writing fp32 stats, then a 2-D tiled apply
                     kernel: no fusion, x read twice

The canonical identifiers (x_ptr, stride_x, n_cols, BLOCK_SIZE, ...) are renamed per dialect
(Liger's X_ptr / X_row_stride, the tutorials' X / stride_xm / N), so equal designs are written
in the spellings users bring.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.generation.styles.library_kernels import glue
from pipelines.generation.styles.library_kernels.glue import (
    Choices,
    Structure,
    TaskSpace,
    dedent,
    indent,
)

LOG2E = "1.4426950408889634"

DIALECTS: dict[str, dict[str, str]] = {
    "plain": {},
    "liger": {"x_ptr": "X_ptr", "y_ptr": "Y_ptr", "w_ptr": "W_ptr", "b_ptr": "B_ptr", "rstd_ptr": "RSTD_ptr",
              "mean_ptr": "Mean_ptr", "stride_x": "X_row_stride", "stride_y": "Y_row_stride"},
    "tutorial": {"x_ptr": "X", "y_ptr": "Y", "w_ptr": "W", "b_ptr": "B", "rstd_ptr": "Rstd", "mean_ptr": "Mean",
                 "stride_x": "stride_xm", "stride_y": "stride_ym", "n_rows": "M", "n_cols": "N",
                 "BLOCK_SIZE": "BLOCK_N"},
}


@dataclass(frozen=True)
class Dims:
    """How a body indexes its block: 1-D (one row) or 2-D (ROWS x BLOCK_SIZE)."""

    ax: str  # reduction axis
    b: str  # broadcast of a per-row value against the block
    w: str  # broadcast of a per-column vector against the block


ONE = Dims("0", "", "")
TWO = Dims("1", "[:, None]", "[None, :]")


# =============================================================================================
# The tasks' maths, as code fragments over an fp32 block `x` with column mask `mask`
# =============================================================================================


def _exp(c: Choices, arg: str) -> str:
    if c.get("exp") == "exp2":
        return f"tl.exp2(({arg}) * {LOG2E})"
    return f"tl.exp({arg})"


def _rsqrt(c: Choices, arg: str) -> str:
    return f"tl.rsqrt({arg})" if c.get("rsqrt", "rsqrt") == "rsqrt" else f"1.0 / tl.sqrt({arg})"


def _out(c: Choices) -> str:
    """The store's cast: the output pointer's element type or bf16 spelled out."""
    return ".to(y_ptr.dtype.element_ty)" if c.get("dialect") == "liger" else ".to(tl.bfloat16)"


def pad(task: str) -> str:
    """What masked lanes of x hold: -inf vanishes from a softmax's max and exp, 0 from sums."""
    return 'float("-inf")' if task == "softmax" else "0.0"


def kernel_pointers(task: str, c: Choices) -> list[str]:
    """Pointer parameters of the fused kernels, canonical names."""
    ptrs = ["y_ptr", "x_ptr"]
    if task == "rms_norm":
        ptrs += ["w_ptr"] + (["rstd_ptr"] if c.get("save_stats") else [])
    elif task == "layer_norm":
        ptrs += ["w_ptr", "b_ptr"] + (["mean_ptr", "rstd_ptr"] if c.get("save_stats") else [])
    return ptrs


def launcher_pointers(task: str, c: Choices) -> list[str]:
    """The launcher's tensors for kernel_pointers, in the same order."""
    names = {"y_ptr": "y", "x_ptr": "x", "w_ptr": "weight", "b_ptr": "bias", "rstd_ptr": "rstd", "mean_ptr": "mean"}
    return [names[p] for p in kernel_pointers(task, c)]


def weight_loads(task: str, offs: str, mask: str, hint: str = "") -> str:
    if task == "softmax":
        return ""
    lines = [f"w = tl.load(w_ptr + {offs}, mask={mask}, other=0.0{hint}).to(tl.float32)"]
    if task == "layer_norm":
        lines.append(f"b = tl.load(b_ptr + {offs}, mask={mask}, other=0.0{hint}).to(tl.float32)")
    return "\n".join(lines)


def stats_stores(task: str, c: Choices, rows: str, row_mask: str | None) -> str:
    """Stores of the per-row statistics a training forward keeps for its backward."""
    if not c.get("save_stats"):
        return ""
    m = f", mask={row_mask}" if row_mask else ""
    lines = [f"tl.store(rstd_ptr + {rows}, rstd{m})"]
    if task == "layer_norm":
        lines.insert(0, f"tl.store(mean_ptr + {rows}, mean{m})")
    return "\n".join(lines)


def whole_row_math(task: str, c: Choices, d: Dims) -> str:
    """`y` (fp32, the block's shape) from the block `x`, with w/b already loaded."""
    ax, b, w = d.ax, d.b, d.w
    if task == "softmax":
        norm = f"e / d{b}" if c.get("normalise") != "reciprocal" else f"e * (1.0 / d){b}"
        return dedent(f"""\
        m = tl.max(x, axis={ax})
        e = {_exp(c, f"x - m{b}")}
        d = tl.sum(e, axis={ax})
        y = {norm}""")
    if task == "rms_norm":
        return dedent(f"""\
        mean_square = tl.sum(x * x, axis={ax}) / n_cols
        rstd = {_rsqrt(c, "mean_square + eps")}
        {_rms_scale(c, f"x * rstd{b}", f"w{w}")}""")
    if c.get("variance") == "raw":
        var = dedent(f"""\
        mean = tl.sum(x, axis={ax}) / n_cols
        var = tl.maximum(tl.sum(x * x, axis={ax}) / n_cols - mean * mean, 0.0)
        xc = x - mean{b}""")
    else:
        var = dedent(f"""\
        mean = tl.sum(x, axis={ax}) / n_cols
        xc = tl.where(mask, x - mean{b}, 0.0)
        var = tl.sum(xc * xc, axis={ax}) / n_cols""")
    return var + "\n" + dedent(f"""\
    rstd = {_rsqrt(c, "var + eps")}
    y = xc * rstd{b} * w{w} + b{w}""")


def _rms_scale(c: Choices, normed: str, weight: str) -> str:
    """The weight multiply: Llama's rounds the normalised row to bf16 first, as the reference."""
    if c.get("casting", "llama") == "llama":
        return f"y = ({normed}).to(tl.bfloat16).to(tl.float32) * {weight}"
    return f"y = {normed} * {weight}"


def apply_math(task: str, c: Choices, d: Dims) -> str:
    """`y` from `x` and the row statistics already known (m/d, rstd, mean/rstd)."""
    b, w = d.b, d.w
    if task == "softmax":
        if c.get("normalise") == "reciprocal":
            return f"y = {_exp(c, f'x - m{b}')} * inv_d{b}"
        return f"y = {_exp(c, f'x - m{b}')} / d{b}"
    if task == "rms_norm":
        return _rms_scale(c, f"x * rstd{b}", f"w{w}")
    return f"y = (x - mean{b}) * rstd{b} * w{w} + b{w}"


# =============================================================================================
# Kernel signatures and launchers
# =============================================================================================


def _signature(task: str, c: Choices, pointers: list[str], sizes: list[str], meta: list[str]) -> str:
    lines = ["    # pointers", "    " + ", ".join(pointers) + ",", "    # strides (elements) and sizes",
             "    " + ", ".join(sizes) + ","]
    if task != "softmax":
        lines.append("    eps,")
    if meta:
        lines += ["    # meta-parameters", *[f"    {m}: tl.constexpr," for m in meta]]
    return "\n".join(lines)


def _forward_name(task: str) -> str:
    return f"{task}_forward"


def _forward_args(task: str) -> str:
    return {"softmax": "x", "rms_norm": "x, weight, eps", "layer_norm": "x, weight, bias, eps"}[task]


def _allocs(task: str, c: Choices) -> str:
    lines = ["n_rows, n_cols = x.shape", "y = torch.empty_like(x)"]
    if c.get("save_stats"):
        if task == "layer_norm":
            lines.append("mean = torch.empty(n_rows, dtype=torch.float32, device=x.device)")
        lines.append("rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)")
    return "\n".join(lines)


def _custom_kernel(task: str) -> str:
    unpack = {"softmax": "(x,) = data", "rms_norm": "x, weight, eps = data",
              "layer_norm": "x, weight, bias, eps = data"}[task]
    return f'''\
def custom_kernel(data):
    {unpack}
    return {_forward_name(task)}({_forward_args(task)})'''


def _launcher(task: str, c: Choices, for_check: bool, doc: str, body: str) -> str:
    """The forward function (guarded as `guard` says) around launcher `body` (after allocs)."""
    launch = glue.guard_launch(c["guard"], body, "x", for_check)
    head = glue.guard_decorator(c["guard"]) + f"def {_forward_name(task)}({_forward_args(task)}):"
    assert_line = 'assert x.ndim == 2 and x.stride(-1) == 1, "expects a row-major (M, N) matrix"'
    return "\n".join([head, glue.launcher_doc(doc), indent(assert_line, 4), indent(_allocs(task, c), 4),
                      indent(launch, 4), "    return y"])


def _launch_args(task: str, c: Choices) -> str:
    args = launcher_pointers(task, c) + ["y.stride(0)", "x.stride(0)", "n_rows", "n_cols"]
    if task != "softmax":
        args.append("eps")
    return ", ".join(args)


def _warps_choice(c: Choices) -> str:
    """Launcher lines that set BLOCK_SIZE and num_warps for a whole-row kernel."""
    warps = c["warps"]
    if warps.startswith("settings:"):
        return "BLOCK_SIZE, num_warps = calculate_settings(n_cols)"
    return f"BLOCK_SIZE = triton.next_power_of_2(n_cols)\nnum_warps = {warps.split(':')[1]}"


def _settings_parts(c: Choices) -> list[str]:
    warps = c.get("warps", "")
    if isinstance(warps, str) and warps.startswith("settings:"):
        return [glue.settings_part(warps.split(":")[1])]
    return []


def _doc(task: str, title: str, text: str, c: Choices) -> str:
    what = {"softmax": "Row softmax of a bf16 (M, N) matrix, fp32 inside",
            "rms_norm": "RMSNorm of a bf16 (M, N) matrix with a bf16 weight",
            "layer_norm": "LayerNorm of a bf16 (M, N) matrix with bf16 weight and bias"}[task]
    return f"{what}: {title}.\n\n{glue.wrap_doc(text)}"


def _finish(task: str, c: Choices, doc: str, parts: list[str], imports: tuple[str, ...], for_check: bool) -> str:
    parts = [glue.guard_part(c["guard"], for_check), *parts, _custom_kernel(task)]
    imports = imports + glue.guard_imports(c["guard"], for_check)
    return glue.rename(glue.module(doc, parts, imports), DIALECTS[c["dialect"]])


def _hint(c: Choices, policy: str) -> str:
    return f', eviction_policy="{policy}"' if c.get("cache_hint") else ""


def _row_offset(c: Choices, pid: str) -> str:
    return f"{pid}.to(tl.int64)" if c.get("int64") else pid


# =============================================================================================
# Structures
# =============================================================================================


def render_row_block(task: str, c: Choices, for_check: bool) -> str:
    name = f"_{task}_fwd_kernel"
    meta = ["BLOCK_SIZE"]
    body = f"""\
    {glue.ruler("one program per row; BLOCK_SIZE >= n_cols holds the whole row")}
    row = {_row_offset(c, "tl.program_id(0)")}
    offs = tl.arange(0, BLOCK_SIZE)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other={pad(task)}{_hint(c, "evict_first")}).to(tl.float32)
{indent(weight_loads(task, "offs", "mask"), 4)}
    {glue.ruler("fp32 statistics and normalisation in registers")}
{indent(whole_row_math(task, c, ONE), 4)}
{indent(stats_stores(task, c, "row", None), 4)}
    tl.store(y_ptr + row * stride_y + offs, y{_out(c)}, mask=mask)"""
    decorators = ""
    if c["warps"] == "autotune":
        configs = [glue.config({}, w) for w in (2, 4, 8, 16)]
        decorators = glue.autotune(configs, ["n_cols"], for_check, c.get("check_config", 0)) + "\n"
        decorators += glue.heuristics({"BLOCK_SIZE": 'triton.next_power_of_2(args["n_cols"])'}) + "\n"
        launch = f"{name}[(n_rows,)]({_launch_args(task, c)})"
    else:
        launch = _warps_choice(c) + f"\n{name}[(n_rows,)]({_launch_args(task, c)}, BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps)"
    kernel = f"""\
{decorators}@triton.jit
def {name}(
{_signature(task, c, kernel_pointers(task, c), ["stride_y", "stride_x", "n_rows", "n_cols"], meta)}
):
{body}"""
    doc = _doc(task, "one program per row, the row held whole in registers",
               "Each program loads one row (BLOCK_SIZE = next power of two of N), reduces it in fp32 and "
               "writes it once: 2 B read and 2 B written per element in one launch.", c)
    launcher = _launcher(task, c, for_check, "One program per row.", launch)
    return _finish(task, c, doc, [*_settings_parts(c), kernel, launcher], (), for_check)


def render_multi_row(task: str, c: Choices, for_check: bool) -> str:
    name = f"_{task}_block_fwd_kernel"
    body = f"""\
    {glue.ruler("ROWS_PER_PROGRAM rows per program in a 2-D block")}
    rows = {_row_offset(c, "tl.program_id(0)")} * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    offs = tl.arange(0, BLOCK_SIZE)
    row_mask = rows < n_rows
    mask = row_mask[:, None] & (offs[None, :] < n_cols)
    x = tl.load(x_ptr + rows[:, None] * stride_x + offs[None, :], mask=mask, other={pad(task)}).to(tl.float32)
{indent(weight_loads(task, "offs", "offs < n_cols"), 4)}
    {glue.ruler("per-row statistics along axis 1, fp32")}
{indent(whole_row_math(task, c, TWO), 4)}
{indent(stats_stores(task, c, "rows", "row_mask"), 4)}
    tl.store(y_ptr + rows[:, None] * stride_y + offs[None, :], y{_out(c)}, mask=mask)"""
    kernel = f"""\
@triton.jit
def {name}(
{_signature(task, c, kernel_pointers(task, c), ["stride_y", "stride_x", "n_rows", "n_cols"], ["BLOCK_SIZE", "ROWS_PER_PROGRAM"])}
):
{body}"""
    warps = c["warps"]
    warp_line = ("num_warps = 4 if BLOCK_SIZE * rows_per_program <= 4096 else 8 if BLOCK_SIZE * rows_per_program "
                 "<= 16384 else 16") if warps == "by_size" else f"num_warps = {warps}"
    launch = dedent(f"""\
    BLOCK_SIZE = triton.next_power_of_2(n_cols)
    # short rows share a program: about {c["row_elems"]} elements per block
    rows_per_program = max(1, min({c["max_rows"]}, {c["row_elems"]} // BLOCK_SIZE))
    {warp_line}
    grid = (triton.cdiv(n_rows, rows_per_program),)
    {name}[grid]({_launch_args(task, c)}, BLOCK_SIZE=BLOCK_SIZE, ROWS_PER_PROGRAM=rows_per_program, num_warps=num_warps)""")
    doc = _doc(task, "several rows per program in a 2-D block",
               "Short rows leave most lanes of a one-row program idle; here each program loads "
               "ROWS_PER_PROGRAM rows as a (ROWS, BLOCK_SIZE) block and reduces along axis 1. Long "
               "rows fall back to one row per program.", c)
    launcher = _launcher(task, c, for_check, "Rows grouped per program.", launch)
    return _finish(task, c, doc, [kernel, launcher], (), for_check)


def render_persistent_rows(task: str, c: Choices, for_check: bool) -> str:
    name = f"_{task}_persistent_kernel"
    stages = c["stages"]
    body = f"""\
    {glue.ruler("a fixed grid of programs, each striding over rows")}
    start = tl.program_id(0)
    step = tl.num_programs(0)
    offs = tl.arange(0, BLOCK_SIZE)
    mask = offs < n_cols
{indent(weight_loads(task, "offs", "mask", _hint(c, "evict_last")), 4)}
    for row in tl.range(start, n_rows, step, num_stages=NUM_STAGES):
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other={pad(task)}{_hint(c, "evict_first")}).to(tl.float32)
{indent(whole_row_math(task, c, ONE), 8)}
{indent(stats_stores(task, c, "row", None), 8)}
        tl.store(y_ptr + row * stride_y + offs, y{_out(c)}, mask=mask)"""
    kernel = f"""\
@triton.jit
def {name}(
{_signature(task, c, kernel_pointers(task, c), ["stride_y", "stride_x", "n_rows", "n_cols"], ["BLOCK_SIZE", "NUM_STAGES"])}
):
{body}"""
    parts = [*_settings_parts(c)]
    args = launcher_pointers(task, c) + ["y.stride(0)", "x.stride(0)", "n_rows", "n_cols"] + (["eps"] if task != "softmax" else [])
    if c["sms"] == "warmup":
        parts.insert(0, glue.warmup_props_part(for_check))
        if not for_check:
            parts.insert(1, "_COMPILED = {}  # (shape, strides) -> (compiled kernel, programs)")
        launch = _warps_choice(c) + "\n" + glue.warmup_launch(
            name, args, {"BLOCK_SIZE": "BLOCK_SIZE", "NUM_STAGES": str(stages)}, "num_warps", str(stages),
            "(x.shape, x.stride(), num_warps)", "n_rows", for_check, cap=str(c.get("per_sm_cap", 4)))
    else:
        sm_code, sms = glue.sm_count_part(c["sms"], for_check)
        parts.insert(0, sm_code)
        launch = _warps_choice(c) + "\n" + dedent(f"""\
        programs = min({c["per_sm"]} * {sms}, n_rows)
        {name}[(programs,)]({", ".join(args)}, BLOCK_SIZE=BLOCK_SIZE, NUM_STAGES={stages}, num_warps=num_warps, num_stages={stages})""")
    doc = _doc(task, "a persistent grid striding over rows",
               "The grid is sized from the device (SM count times programs per SM, or the occupancy "
               "of the compiled kernel) and each program walks rows start, start + grid, ...; the "
               "weights stay in registers across rows and the row loop is software-pipelined.", c)
    launcher = _launcher(task, c, for_check, "Persistent programs over rows.", launch)
    imports = ("functools",) if c["sms"] == "torch_props" and not for_check else ()
    return _finish(task, c, doc, [*parts, kernel, launcher], imports, for_check)


def _looped_stats(task: str, c: Choices, load) -> str:
    """Statistics loops over the row in BLOCK_SIZE chunks; `load(hint)` gives the chunk's load."""
    rng = _range(c, "0, n_cols, BLOCK_SIZE")
    head = "for start in " + rng + ":\n    offs = start + cols\n    mask = offs < n_cols\n"
    kind = c["reduction"]
    if task == "softmax":
        if kind == "online_scalar":
            return dedent(f"""\
            m = float("-inf")
            d = 0.0
            {glue.ruler("one read: running max and rescaled running sum")}
            """) + "\n" + head + indent(dedent(f"""\
            x = {load("evict_last")}
            m_new = tl.maximum(m, tl.max(x, axis=0))
            d = d * {_exp(c, "m - m_new")} + tl.sum({_exp(c, "x - m_new")}, axis=0)
            m = m_new"""), 4) + ("\ninv_d = 1.0 / d" if c.get("normalise") == "reciprocal" else "")
        if kind == "online_vector":
            return dedent(f"""\
            m_vec = tl.full([BLOCK_SIZE], float("-inf"), tl.float32)
            d_vec = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
            {glue.ruler("one read: per-lane running max and sum, merged after the loop")}
            """) + "\n" + head + indent(dedent(f"""\
            x = {load("evict_last")}
            m_new = tl.maximum(m_vec, x)
            # lanes that saw only padding keep max -inf: shift them by 0 so exp gives 0, not NaN
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            d_vec = d_vec * {_exp(c, "m_vec - shift")} + {_exp(c, "x - shift")}
            m_vec = m_new"""), 4) + "\n" + dedent(f"""\
            m = tl.max(m_vec, axis=0)
            d = tl.sum(d_vec * {_exp(c, "m_vec - m")}, axis=0)""") + (
                "\ninv_d = 1.0 / d" if c.get("normalise") == "reciprocal" else "")
        # two loops: max, then the sum of exponentials
        return dedent(f"""\
        {glue.ruler("first read: the row max")}
        m_vec = tl.full([BLOCK_SIZE], float("-inf"), tl.float32)
        """) + "\n" + head + indent(f"x = {load('evict_last')}\nm_vec = tl.maximum(m_vec, x)", 4) + "\n" + dedent(f"""\
        m = tl.max(m_vec, axis=0)
        {glue.ruler("second read: the sum of exponentials")}
        d_vec = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        """) + "\n" + head + indent(f"x = {load('evict_last')}\nd_vec += tl.where(mask, {_exp(c, 'x - m')}, 0.0)", 4) + (
            "\nd = tl.sum(d_vec, axis=0)") + ("\ninv_d = 1.0 / d" if c.get("normalise") == "reciprocal" else "")
    if task == "rms_norm":
        if kind == "scalar_acc":
            acc = "acc = 0.0\n" + head + indent(f"x = {load('evict_last')}\nacc += tl.sum(x * x, axis=0)", 4)
            total = "acc"
        else:
            acc = "acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)\n" + head + indent(
                f"x = {load('evict_last')}\nacc += x * x", 4)
            total = "tl.sum(acc, axis=0)"
        return (glue.ruler("first read: the sum of squares") + "\n" + acc + "\n"
                + f"rstd = {_rsqrt(c, f'{total} / n_cols + eps')}")
    # layer_norm
    if kind == "welford":
        return dedent(f"""\
        {glue.ruler("one read: Welford statistics merged chunk by chunk (Chan's update)")}
        count = 0.0
        mean = 0.0
        m2 = 0.0
        """) + "\n" + head + indent(dedent(f"""\
        x = {load("evict_last")}
        n_chunk = tl.sum(mask.to(tl.float32), axis=0)
        mean_chunk = tl.sum(x, axis=0) / n_chunk
        m2_chunk = tl.sum(tl.where(mask, (x - mean_chunk) * (x - mean_chunk), 0.0), axis=0)
        total = count + n_chunk
        delta = mean_chunk - mean
        mean += delta * (n_chunk / total)
        m2 += m2_chunk + delta * delta * (count * n_chunk / total)
        count = total"""), 4) + f"\nrstd = {_rsqrt(c, 'm2 / n_cols + eps')}"
    if kind == "raw_moments":
        return dedent(f"""\
        {glue.ruler("one read: sum and sum of squares")}
        acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        acc_sq = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        """) + "\n" + head + indent(f"x = {load('evict_last')}\nacc += x\nacc_sq += x * x", 4) + "\n" + dedent(f"""\
        mean = tl.sum(acc, axis=0) / n_cols
        var = tl.maximum(tl.sum(acc_sq, axis=0) / n_cols - mean * mean, 0.0)
        rstd = {_rsqrt(c, "var + eps")}""")
    # two loops as tutorial 05: the mean, then the centred variance
    return dedent(f"""\
    {glue.ruler("first read: the mean")}
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    """) + "\n" + head + indent(f"x = {load('evict_last')}\nacc += x", 4) + "\n" + dedent(f"""\
    mean = tl.sum(acc, axis=0) / n_cols
    {glue.ruler("second read: the variance around it")}
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    """) + "\n" + head + indent(f"x = {load('evict_last')}\nxc = tl.where(mask, x - mean, 0.0)\nacc += xc * xc", 4) + (
        "\n" + dedent(f"""\
    var = tl.sum(acc, axis=0) / n_cols
    rstd = {_rsqrt(c, "var + eps")}"""))


def _range(c: Choices, bounds: str) -> str:
    stages = c.get("loop_stages")
    return f"tl.range({bounds}, num_stages={stages})" if stages else f"range({bounds})"


def render_looped(task: str, c: Choices, for_check: bool) -> str:
    name = f"_{task}_looped_kernel"

    def load(hint: str) -> str:
        return (f"tl.load(x_ptr + row * stride_x + offs, mask=mask, other={pad(task)}{_hint(c, hint)})"
                ".to(tl.float32)")

    stats = _looped_stats(task, c, load)
    write = dedent(f"""\
    {glue.ruler("last read: normalise and write")}
    for start in {_range(c, "0, n_cols, BLOCK_SIZE")}:
        offs = start + cols
        mask = offs < n_cols
        x = {load("evict_first")}
    """) + "\n" + indent(weight_loads(task, "offs", "mask") + "\n" + apply_math(task, c, ONE) + "\n"
                         + f"tl.store(y_ptr + row * stride_y + offs, y{_out(c)}, mask=mask)", 4)
    row_body = stats + "\n" + stats_stores(task, c, "row", None) + "\n" + write
    persistent = c["grid"] == "persistent"
    if persistent:
        body = ("    cols = tl.arange(0, BLOCK_SIZE)\n    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):\n"
                + indent(row_body, 8))
    else:
        body = f"    row = {_row_offset(c, 'tl.program_id(0)')}\n    cols = tl.arange(0, BLOCK_SIZE)\n" + indent(row_body, 4)
    decorators = ""
    tuned = c["block"] == "autotune"
    if tuned:
        configs = [glue.config({"BLOCK_SIZE": b}, w) for b, w in ((512, 2), (1024, 4), (2048, 4), (4096, 8), (8192, 8))]
        decorators = glue.autotune(configs, ["n_cols"], for_check, c.get("check_config", 0)) + "\n"
    kernel = f"""\
{decorators}@triton.jit
def {name}(
{_signature(task, c, kernel_pointers(task, c), ["stride_y", "stride_x", "n_rows", "n_cols"], ["BLOCK_SIZE"])}
):
{body}"""
    parts = []
    if persistent:
        sm_code, sms = glue.sm_count_part(c["sms"], for_check)
        parts.append(sm_code)
        grid = f"(min(n_rows, {c['per_sm']} * {sms}),)"
    else:
        grid = "(n_rows,)"
    if tuned:
        launch = f"{name}[{grid}]({_launch_args(task, c)})"
    else:
        launch = f"{name}[{grid}]({_launch_args(task, c)}, BLOCK_SIZE={c['block']}, num_warps={c['warps']})"
    reads = {"online_scalar": 2, "online_vector": 2, "two_loops": 3, "scalar_acc": 2, "vector_acc": 2,
             "welford": 2, "raw_moments": 2}[c["reduction"]]
    doc = _doc(task, f"rows walked in chunks, {c['reduction'].replace('_', ' ')} statistics",
               f"Each program walks its row in BLOCK_SIZE chunks, so any width fits in a few registers; "
               f"it reads the row {reads} times (statistics, then normalise and write).", c)
    launcher = _launcher(task, c, for_check, "Chunked row loops.", launch)
    imports = ("functools",) if persistent and c["sms"] == "torch_props" and not for_check else ()
    return _finish(task, c, doc, [*parts, kernel, launcher], imports, for_check)


def _partials(task: str, c: Choices) -> list[str]:
    if task == "softmax":
        return ["part_max", "part_sum"]
    if task == "rms_norm":
        return ["part_sq"]
    return ["part_mean", "part_m2"] if c["moments"] == "welford" else ["part_sum", "part_sq"]


def _partial_math(task: str, c: Choices) -> str:
    """Chunk statistics of `x` (a CHUNK of one row), stored at `slot`."""
    if task == "softmax":
        return dedent(f"""\
        chunk_max = tl.max(x, axis=0)
        chunk_sum = tl.sum({_exp(c, "x - chunk_max")}, axis=0)
        tl.store(part_max_ptr + slot, chunk_max)
        tl.store(part_sum_ptr + slot, chunk_sum)""")
    if task == "rms_norm":
        return "tl.store(part_sq_ptr + slot, tl.sum(x * x, axis=0))"
    if c["moments"] == "welford":
        return dedent("""\
        n_chunk = tl.sum(mask.to(tl.float32), axis=0)
        chunk_mean = tl.sum(x, axis=0) / n_chunk
        xc = tl.where(mask, x - chunk_mean, 0.0)
        tl.store(part_mean_ptr + slot, chunk_mean)
        tl.store(part_m2_ptr + slot, tl.sum(xc * xc, axis=0))""")
    return dedent("""\
    tl.store(part_sum_ptr + slot, tl.sum(x, axis=0))
    tl.store(part_sq_ptr + slot, tl.sum(x * x, axis=0))""")


def _combine_math(task: str, c: Choices) -> str:
    """Row statistics from the row's partials (loaded over `s < n_splits`)."""
    if task == "softmax":
        inv = "\ninv_d = 1.0 / d" if c.get("normalise") == "reciprocal" else ""
        return dedent(f"""\
        part_max = tl.load(part_max_ptr + row * n_splits + s, mask=s_mask, other=float("-inf"))
        part_sum = tl.load(part_sum_ptr + row * n_splits + s, mask=s_mask, other=0.0)
        m = tl.max(part_max, axis=0)
        d = tl.sum(part_sum * {_exp(c, "part_max - m")}, axis=0)""") + inv
    if task == "rms_norm":
        return dedent(f"""\
        part_sq = tl.load(part_sq_ptr + row * n_splits + s, mask=s_mask, other=0.0)
        rstd = {_rsqrt(c, "tl.sum(part_sq, axis=0) / n_cols + eps")}""")
    if c["moments"] == "welford":
        return dedent(f"""\
        # chunk sizes: CHUNK each, the last one ragged
        n_chunk = tl.minimum(n_cols - s * CHUNK, CHUNK).to(tl.float32)
        part_mean = tl.load(part_mean_ptr + row * n_splits + s, mask=s_mask, other=0.0)
        part_m2 = tl.load(part_m2_ptr + row * n_splits + s, mask=s_mask, other=0.0)
        mean = tl.sum(tl.where(s_mask, n_chunk * part_mean, 0.0), axis=0) / n_cols
        spread = tl.where(s_mask, n_chunk * (part_mean - mean) * (part_mean - mean), 0.0)
        rstd = {_rsqrt(c, "(tl.sum(part_m2, axis=0) + tl.sum(spread, axis=0)) / n_cols + eps")}""")
    return dedent(f"""\
    part_sum = tl.load(part_sum_ptr + row * n_splits + s, mask=s_mask, other=0.0)
    part_sq = tl.load(part_sq_ptr + row * n_splits + s, mask=s_mask, other=0.0)
    mean = tl.sum(part_sum, axis=0) / n_cols
    var = tl.maximum(tl.sum(part_sq, axis=0) / n_cols - mean * mean, 0.0)
    rstd = {_rsqrt(c, "var + eps")}""")


def _row_stats(task: str, c: Choices) -> list[str]:
    """The per-row statistics an apply step needs."""
    if task == "softmax":
        return ["m", "inv_d" if c.get("normalise") == "reciprocal" else "d"]
    if task == "rms_norm":
        return ["rstd"]
    return ["mean", "rstd"]


def render_split_row(task: str, c: Choices, for_check: bool) -> str:
    partials = _partials(task, c)
    stats = _row_stats(task, c)
    eps = ["eps"] if task != "softmax" else []
    partial_kernel = f"""\
@triton.jit
def _{task}_partial_kernel(
    x_ptr, {", ".join(p + "_ptr" for p in partials)},
    stride_x, n_cols, n_splits,
    CHUNK: tl.constexpr,
):
    {glue.ruler("grid (rows, splits): statistics of one CHUNK of one row")}
    row = {_row_offset(c, "tl.program_id(0)")}
    split = tl.program_id(1)
    offs = split * CHUNK + tl.arange(0, CHUNK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other={pad(task)}).to(tl.float32)
    slot = row * n_splits + split
{indent(_partial_math(task, c), 4)}"""
    combine_body = indent(_combine_math(task, c), 4)
    store_stats = "\n".join(f"    tl.store({s}_out_ptr + row, {s})" for s in stats)
    combine_kernel = f"""\
@triton.jit
def _{task}_combine_kernel(
    {", ".join(p + "_ptr" for p in partials)}, {", ".join(s + "_out_ptr" for s in stats)},
    n_cols, n_splits,{" eps," if eps else ""}
    CHUNK: tl.constexpr,
    SPLITS_BLOCK: tl.constexpr,
):
    {glue.ruler("one program per row: merge the row's partial statistics")}
    row = tl.program_id(0)
    s = tl.arange(0, SPLITS_BLOCK)
    s_mask = s < n_splits
{combine_body}
{store_stats}"""
    in_apply = c["combine"] == "in_apply"
    if in_apply:
        stat_src = (indent("s = tl.arange(0, SPLITS_BLOCK)\ns_mask = s < n_splits", 4) + "\n" + combine_body)
        stat_args = ", ".join(p + "_ptr" for p in partials) + ", n_splits,"
        stat_meta = "\n    SPLITS_BLOCK: tl.constexpr,"
    else:
        stat_src = "\n".join(f"    {s} = tl.load({s}_in_ptr + row)" for s in stats)
        stat_args = ", ".join(s + "_in_ptr" for s in stats) + ","
        stat_meta = ""
    apply_kernel = f"""\
@triton.jit
def _{task}_apply_kernel(
    y_ptr, x_ptr,{" w_ptr," if task != "softmax" else ""}{" b_ptr," if task == "layer_norm" else ""}
    {stat_args}
    stride_y, stride_x, n_cols,{" eps," if eps and in_apply else ""}
    CHUNK: tl.constexpr,{stat_meta}
):
    {glue.ruler("grid (rows, splits): normalise one CHUNK with the row's statistics")}
    row = {_row_offset(c, "tl.program_id(0)")}
{stat_src}
    offs = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
{indent(weight_loads(task, "offs", "mask"), 4)}
{indent(apply_math(task, c, ONE), 4)}
    tl.store(y_ptr + row * stride_y + offs, y{_out(c)}, mask=mask)"""
    wts = {"softmax": "", "rms_norm": "weight, ", "layer_norm": "weight, bias, "}[task]
    alloc_parts = "\n".join(f"{p} = torch.empty((n_rows, n_splits), dtype=torch.float32, device=x.device)" for p in partials)
    launch_lines = [
        f"CHUNK = {c['chunk']}",
        "n_splits = triton.cdiv(n_cols, CHUNK)",
        alloc_parts,
        f"_{task}_partial_kernel[(n_rows, n_splits)](x, {', '.join(partials)}, x.stride(0), n_cols, n_splits, "
        f"CHUNK=CHUNK, num_warps={c['warps']})",
    ]
    if in_apply:
        launch_lines.append(
            f"_{task}_apply_kernel[(n_rows, n_splits)](y, x, {wts}{', '.join(partials)}, n_splits, y.stride(0), "
            f"x.stride(0), n_cols, {'eps, ' if eps else ''}CHUNK=CHUNK, "
            f"SPLITS_BLOCK=triton.next_power_of_2(n_splits), num_warps={c['warps']})")
    else:
        launch_lines += [
            "\n".join(f"{s} = torch.empty(n_rows, dtype=torch.float32, device=x.device)" for s in stats),
            f"_{task}_combine_kernel[(n_rows,)]({', '.join(partials)}, {', '.join(stats)}, n_cols, n_splits, "
            f"{'eps, ' if eps else ''}CHUNK=CHUNK, SPLITS_BLOCK=triton.next_power_of_2(n_splits), num_warps=1)",
            f"_{task}_apply_kernel[(n_rows, n_splits)](y, x, {wts}{', '.join(stats)}, y.stride(0), x.stride(0), "
            f"n_cols, CHUNK=CHUNK, num_warps={c['warps']})",
        ]
    kernels = [partial_kernel] + ([] if in_apply else [combine_kernel]) + [apply_kernel]
    where = "inside every apply program" if in_apply else "in a small combine kernel"
    doc = _doc(task, "rows split over a second grid dimension",
               f"Grid (rows, N / CHUNK): each program reduces one chunk of a row to partial statistics "
               f"(fp32, in HBM); the partials of a row are merged {where}; an apply kernel over the same "
               f"grid normalises each chunk. x is read twice, in {len(kernels)} launches.", c)
    launcher = _launcher(task, c, for_check, "Split reduction, combine, apply.", "\n".join(launch_lines))
    return _finish(task, c, doc, [*kernels, launcher], (), for_check)


def render_stats_then_apply(task: str, c: Choices, for_check: bool) -> str:
    stats = _row_stats(task, c)
    block = c["stats_block"]

    def load(hint: str) -> str:
        return f"tl.load(x_ptr + row * stride_x + offs, mask=mask, other={pad(task)}).to(tl.float32)"

    sc = dict(c, reduction={"softmax": "online_scalar", "rms_norm": "vector_acc", "layer_norm": "two_loops"}[task],
              loop_stages=None)
    stats_code = _looped_stats(task, sc, load)
    stat_stores = "\n".join(f"tl.store({s}_out_ptr + row, {s})" for s in stats)
    stats_kernel = f"""\
@triton.jit
def _{task}_stats_kernel(
    x_ptr, {", ".join(s + "_out_ptr" for s in stats)},
    stride_x, n_cols,{" eps," if task != "softmax" else ""}
    BLOCK_SIZE: tl.constexpr,
):
    {glue.ruler("one program per row: fp32 statistics to HBM")}
    row = {_row_offset(c, "tl.program_id(0)")}
    cols = tl.arange(0, BLOCK_SIZE)
{indent(stats_code, 4)}
{indent(stat_stores, 4)}"""
    tile_m, tile_n = c["tile"]
    apply_kernel = f"""\
@triton.jit
def _{task}_apply_kernel(
    y_ptr, x_ptr,{" w_ptr," if task != "softmax" else ""}{" b_ptr," if task == "layer_norm" else ""} {", ".join(s + "_ptr" for s in stats)},
    stride_y, stride_x, n_rows, n_cols,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    {glue.ruler("2-D tiles of the output: elementwise with per-row statistics")}
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows
    mask = row_mask[:, None] & (offs[None, :] < n_cols)
    x = tl.load(x_ptr + rows[:, None] * stride_x + offs[None, :], mask=mask, other=0.0).to(tl.float32)
{indent(chr(10).join(f"{s} = tl.load({s}_ptr + rows, mask=row_mask, other=0.0)" for s in stats), 4)}
{indent(weight_loads(task, "offs", "offs < n_cols"), 4)}
{indent(apply_math(task, c, TWO), 4)}
    tl.store(y_ptr + rows[:, None] * stride_y + offs[None, :], y{_out(c)}, mask=mask)"""
    wts = {"softmax": "", "rms_norm": "weight, ", "layer_norm": "weight, bias, "}[task]
    launch = "\n".join([
        "\n".join(f"{s} = torch.empty(n_rows, dtype=torch.float32, device=x.device)" for s in stats),
        f"_{task}_stats_kernel[(n_rows,)](x, {', '.join(stats)}, x.stride(0), n_cols, {'eps, ' if task != 'softmax' else ''}"
        f"BLOCK_SIZE={block}, num_warps={c['warps']})",
        f"grid = (triton.cdiv(n_rows, {tile_m}), triton.cdiv(n_cols, {tile_n}))",
        f"_{task}_apply_kernel[grid](y, x, {wts}{', '.join(stats)}, y.stride(0), x.stride(0), n_rows, n_cols, "
        f"BLOCK_M={tile_m}, BLOCK_N={tile_n}, num_warps={c['apply_warps']})",
    ])
    doc = _doc(task, "a statistics kernel, then a tiled apply kernel",
               "Unfused: the first kernel reduces each row (chunked) to fp32 statistics in HBM, the "
               "second normalises (BLOCK_M, BLOCK_N) tiles of the output. x is read at least twice "
               "and there are two launches.", c)
    launcher = _launcher(task, c, for_check, "Statistics, then apply.", launch)
    return _finish(task, c, doc, [stats_kernel, apply_kernel, launcher], (), for_check)


# =============================================================================================
# The spaces
# =============================================================================================


def _math_knobs(task: str) -> dict:
    if task == "softmax":
        return {"exp": ("exp", "exp2"), "normalise": ("divide", "reciprocal")}
    if task == "rms_norm":
        return {"casting": ("llama", "fp32"), "rsqrt": ("rsqrt", "sqrt_div"), "save_stats": (False, True)}
    return {"rsqrt": ("rsqrt", "sqrt_div"), "save_stats": (False, True)}


def _reductions(task: str) -> tuple[str, ...]:
    return {"softmax": ("online_scalar", "online_vector", "two_loops"),
            "rms_norm": ("scalar_acc", "vector_acc"),
            "layer_norm": ("two_loops", "raw_moments", "welford")}[task]


COMMON = {"dialect": tuple(DIALECTS), "guard": glue.LAUNCH_GUARDS}
WHOLE_ROW_WARPS = ("settings:scaled", "settings:lean", "settings:wide", "fixed:4", "fixed:8", "fixed:16")


def space(task: str) -> TaskSpace:
    """The row-wise structures of `task` (softmax, rms_norm or layer_norm)."""
    m = _math_knobs(task)
    variance = {"variance": ("centered", "raw")} if task == "layer_norm" else {}

    def bind(fn):
        return lambda c, for_check=False: fn(task, c, for_check)

    structures = (
        Structure("row_block", "one program per row, whole row in registers",
                  {**COMMON, **m, **variance, "warps": (*WHOLE_ROW_WARPS, "autotune"),
                   "cache_hint": (False, True), "int64": (False, True)}, bind(render_row_block)),
        Structure("multi_row", "several rows per program in a 2-D block",
                  {**COMMON, **m, **variance, "row_elems": (2048, 4096, 8192, 16384),
                   "max_rows": (8, 32, 128), "warps": (2, 4, 8, "by_size"), "int64": (False, True)},
                  bind(render_multi_row)),
        Structure("persistent_rows", "SM-sized grid striding over rows",
                  {**COMMON, **m, **variance, "sms": ("torch_props", "driver_props", "warmup"),
                   "per_sm": lambda c: None if c["sms"] == "warmup" else (1, 2, 4, 8),
                   "per_sm_cap": lambda c: (2, 4, 8) if c["sms"] == "warmup" else None,
                   "stages": (1, 2, 3), "warps": WHOLE_ROW_WARPS, "cache_hint": (False, True)},
                  bind(render_persistent_rows)),
        Structure("looped", "rows walked in chunks",
                  {**COMMON, **m, "reduction": _reductions(task), "grid": ("per_row", "persistent"),
                   "sms": lambda c: glue.SM_SOURCES if c["grid"] == "persistent" else None,
                   "per_sm": lambda c: (1, 2, 4, 8) if c["grid"] == "persistent" else None,
                   "block": (64, 256, 1024, 4096, "autotune"),
                   "warps": lambda c: None if c["block"] == "autotune" else (1, 2, 4, 8, 16),
                   "loop_stages": (None, 2, 3), "cache_hint": (False, True),
                   "int64": lambda c: (False, True) if c["grid"] == "per_row" else None},
                  bind(render_looped), valid=_looped_valid),
        Structure("split_row", "row split over a second grid dimension",
                  {**COMMON, **m, **({"moments": ("raw", "welford")} if task == "layer_norm" else {}),
                   "chunk": (256, 1024, 2048, 4096), "combine": ("kernel", "in_apply"), "warps": (2, 4, 8),
                   "int64": (False, True)}, bind(render_split_row)),
        Structure("stats_then_apply", "statistics kernel, then tiled apply kernel",
                  {**COMMON, **m, "stats_block": (256, 1024, 4096), "warps": (2, 4, 8),
                   "tile": ((1, 1024), (2, 2048), (4, 512), (8, 256), (16, 128), (32, 64)),
                   "apply_warps": (2, 4, 8), "int64": (False, True)}, bind(render_stats_then_apply)),
    )
    return TaskSpace(task, structures)


def _looped_valid(c: Choices) -> bool:
    # a warp covers 32 lanes: blocks narrower than the program's threads leave lanes idle, which
    # is allowed (slow designs are wanted) but not below one element per thread of one warp
    return c["block"] == "autotune" or c["block"] >= 32 * min(c["warps"], 2)
