"""fp8_quant programs: per-(1 x 128)-group fp8 e4m3 quantisation of a bf16 matrix.

For each row and group of 128 columns: scale = max(absmax, 1e-10) / 448 in fp32, q = clamp(x /
scale, -448, 448) as float8_e4m3fn. The absmax is exact in any dtype (|x| and max do not round),
so it is taken on bf16 or fp32 values, with amax, max().values, aminmax or an inf-norm; the scale
itself is always divided in fp32 (a bf16 scale is 0.4% off, the check allows 0.1%). The quotient
x / scale may be a division, a multiply by the reciprocal, an in-place division, or a bf16
division by the bf16-rounded scale (fp8 keeps 3 mantissa bits, so that stays within one e4m3
step). Compositions: grouped views, a Python loop over column groups, scales broadcast to full
width, and transposed group layouts.
"""

from __future__ import annotations

from pipelines.generation.styles.pytorch_compositions.compose import (
    Call,
    Composition,
    Core,
    TaskSpace,
)

CALL = Call(
    unpack="(x,) = data", args=("x",), split=("x",), dim=0,
    outputs=(("q", "torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)"),
             ("scales", "torch.empty(x.shape[0], x.shape[1] // GROUP, dtype=torch.float32, device=x.device)")),
    unit="rows",
)
NAME = "quantize_rows"
FP8_MAX = {"literal": "FP8_MAX = 448.0", "finfo": "FP8_MAX = torch.finfo(torch.float8_e4m3fn).max"}
GROUPINGS = {
    "view": ("x.view(M, K // GROUP, GROUP)", "view"),
    "reshape": ("x.reshape(M, -1, GROUP)", "reshape"),
    "unflatten": ("x.unflatten(-1, (-1, GROUP))", "view"),
    "view_infer": ("x.view(M, -1, GROUP)", "view"),
}
FLOORS = {
    "clamp": "{a}.clamp(min=SCALE_FLOOR) / FP8_MAX",
    "clamp_min": "{a}.clamp_min(SCALE_FLOOR) / FP8_MAX",
    "maximum": "torch.maximum({a}, torch.full_like({a}, SCALE_FLOOR)) / FP8_MAX",
}
CLAMPS = {
    "clamp": "{y}.clamp(-FP8_MAX, FP8_MAX)",
    "clamp_inplace": "{y}.clamp_(-FP8_MAX, FP8_MAX)",
    "clip": "torch.clip({y}, -FP8_MAX, FP8_MAX)",
}


def _constants(c: dict) -> tuple[str, ...]:
    return ("GROUP = 128", FP8_MAX[c.get("fp8_max", "literal")], "SCALE_FLOOR = 1e-10")


def _amax_lines(kind: str, src: str, bf16_src: str, dim: int = -1) -> list[str]:
    """amax (fp32, one per group) of `src` (fp32 groups) or `bf16_src` (bf16 groups) along `dim`."""
    return {
        "abs_amax": [f"amax = {src}.abs().amax(dim={dim})"],
        "bf16_amax": [f"amax = {bf16_src}.abs().amax(dim={dim}).float()  # exact in bf16"],
        "max_values": [f"amax = {src}.abs().max(dim={dim}).values"],
        "aminmax": [f"lo, hi = torch.aminmax({src}, dim={dim})", "amax = torch.maximum(hi, -lo)"],
        "inf_norm": [f'amax = torch.linalg.vector_norm({src}, ord=float("inf"), dim={dim})'],
    }[kind]


AMAX_WORDS = {"abs_amax": "abs().amax", "bf16_amax": "abs().amax on the bf16 values",
              "max_values": "abs().max().values", "aminmax": "torch.aminmax", "inf_norm": "an inf-norm"}


def _quotient(kind: str, src: str, bf16_src: str, scales: str) -> str:
    return {
        "divide": f"y = {src} / {scales}.unsqueeze(-1)",
        "reciprocal": f"y = {src} * (1.0 / {scales}).unsqueeze(-1)",
        "div_inplace": f"y = {src}.div_({scales}[..., None])",
        "bf16_divide": f"y = {bf16_src} / {scales}[..., None].to(torch.bfloat16)  # bf16 quotient",
    }[kind]


QUOTIENT_WORDS = {"divide": "divides by the scale in fp32", "reciprocal": "multiplies by the "
                  "scale's reciprocal", "div_inplace": "divides in place on the fp32 copy",
                  "bf16_divide": "divides the bf16 values by the bf16-rounded scale"}


def _grouped(c: dict) -> Core:
    group, kind = GROUPINGS[c["grouping"]]
    body = ["M, K = x.shape", f"xg = {group}"]
    if c["upcast"] == "once":
        body.append("xf = xg.float()")
        src = "xf"
    else:
        src = "xg.float()"
    body += _amax_lines(c["amax"], src, "xg")
    body.append("scales = " + FLOORS[c["floor"]].format(a="amax"))
    body.append(_quotient(c["quotient"], src, "xg", "scales"))
    body.append("q = " + CLAMPS[c["clamp"]].format(y="y"))
    flat = "q.to(torch.float8_e4m3fn).view(M, K)" if kind == "view" else "q.to(torch.float8_e4m3fn).reshape(M, K)"
    body.append(f"return {flat}, scales")
    once = "upcasts the groups once" if c["upcast"] == "once" else "upcasts the groups where each step reads them"
    return Core(NAME, ("x",), tuple(body),
                f"The program groups each row 128 columns at a time ({group}), {once}, takes the "
                f"absmax with {AMAX_WORDS[c['amax']]}, floors it at 1e-10 and {QUOTIENT_WORDS[c['quotient']]}, "
                f"then clamps to +-448 and casts to float8_e4m3fn.",
                constants=_constants(c))


def _group_loop(c: dict) -> Core:
    step = c["step"]
    body = ["M, K = x.shape",
            "q = torch.empty(M, K, dtype=torch.float8_e4m3fn, device=x.device)",
            "scales = torch.empty(M, K // GROUP, dtype=torch.float32, device=x.device)",
            "for g in range(0, K // GROUP, GROUPS_PER_STEP):",
            "    cols = slice(g * GROUP, (g + GROUPS_PER_STEP) * GROUP)",
            "    xg = x[:, cols].float().view(M, -1, GROUP)"]
    body += ["    " + line for line in _amax_lines(c["amax"], "xg", "xg")]
    body.append("    s = amax.clamp(min=SCALE_FLOOR) / FP8_MAX")
    body.append("    " + _quotient(c["quotient"], "xg", "xg", "s"))
    body.append("    y = y.clamp(-FP8_MAX, FP8_MAX).view(M, -1)")
    if c["write"] == "slice_assign":
        body += ["    scales[:, g:g + GROUPS_PER_STEP] = s", "    q[:, cols] = y.to(torch.float8_e4m3fn)"]
    else:
        body += ["    scales[:, g:g + GROUPS_PER_STEP].copy_(s)", "    q[:, cols].copy_(y)  # copy_ casts to fp8"]
    body.append("return q, scales")
    return Core(NAME, ("x",), tuple(body),
                f"The program preallocates q and the scales and loops in Python over the column groups, "
                f"{step} group{'s' if step > 1 else ''} of 128 per step: absmax ({AMAX_WORDS[c['amax']]}), "
                f"scale, {QUOTIENT_WORDS[c['quotient']]}, clamp, written into the outputs "
                f"({'slice assignment' if c['write'] == 'slice_assign' else 'copy_'}).",
                constants=(*_constants(c), f"GROUPS_PER_STEP = {step}"))


def _full_width(c: dict) -> Core:
    body = ["M, K = x.shape"]
    body += _amax_lines(c["amax"], "x.float().view(M, -1, GROUP)", "x.view(M, -1, GROUP)")
    body.append("scales = amax.clamp(min=SCALE_FLOOR) / FP8_MAX")
    if c["expand"] == "repeat_interleave":
        body.append("scale_full = scales.repeat_interleave(GROUP, dim=1)  # (M, K)")
    else:
        body.append("scale_full = scales[:, :, None].expand(-1, -1, GROUP).reshape(M, K)")
    y = "x.float() / scale_full" if c["quotient"] == "divide" else "x.float() * scale_full.reciprocal()"
    body.append("q = " + CLAMPS[c["clamp"]].format(y=f"({y})"))
    body.append("return q.to(torch.float8_e4m3fn), scales")
    return Core(NAME, ("x",), tuple(body),
                f"The program computes the per-group scales, then materialises them at full width "
                f"({c['expand'].replace('_', ' ')}) and quantises the whole matrix in one elementwise "
                f"pass against the (M, K) scale tensor.",
                constants=_constants(c))


def _transposed(c: dict) -> Core:
    cont = ".contiguous()" if c["contiguous"] else ""
    body = ["M, K = x.shape",
            f"xt = x.view(M, K // GROUP, GROUP).transpose(1, 2){cont}  # (M, 128, groups)"]
    body += _amax_lines(c["amax"], "xt.float()", "xt", dim=1)
    body.append("scales = amax.clamp(min=SCALE_FLOOR) / FP8_MAX  # (M, groups)")
    body.append("q = " + CLAMPS[c["clamp"]].format(y="(xt.float() / scales[:, None, :])"))
    body.append("return q.to(torch.float8_e4m3fn).transpose(1, 2).reshape(M, K), scales")
    return Core(NAME, ("x",), tuple(body),
                f"The program reduces each group along a transposed (M, 128, groups) layout "
                f"({'copied contiguous' if c['contiguous'] else 'a strided view'}) and transposes the "
                f"fp8 result back.",
                constants=_constants(c))


def _valid_grouped(c: dict) -> bool:
    """In-place division needs the private fp32 copy; a kept fp32 copy must be read."""
    if c["upcast"] == "once":
        return c["amax"] != "bf16_amax" or c["quotient"] != "bf16_divide"
    return c["quotient"] != "div_inplace"


SPACE = TaskSpace(
    task="fp8_quant",
    lead="Per-token-group fp8 quantisation: a bf16 (M, K) matrix to float8_e4m3fn values and one "
         "fp32 scale (absmax / 448) per row and group of 128 columns.",
    call=CALL,
    blocks=(32, 128, 1024),
    chunks=(2, 4, 16),
    compositions=(
        Composition("grouped_view_quant", {"grouping": tuple(GROUPINGS), "upcast": ("once", "per_use"),
                                           "amax": tuple(AMAX_WORDS), "floor": tuple(FLOORS),
                                           "quotient": tuple(QUOTIENT_WORDS), "clamp": tuple(CLAMPS),
                                           "fp8_max": tuple(FP8_MAX)},
                    _grouped, valid=_valid_grouped),
        Composition("column_group_loop", {"step": (1, 2, 4, 8), "amax": ("abs_amax", "max_values", "inf_norm"),
                                          "quotient": ("divide", "reciprocal"),
                                          "write": ("slice_assign", "copy_")},
                    _group_loop, compilable=False),
        Composition("full_width_scales", {"expand": ("repeat_interleave", "expand_reshape"),
                                          "amax": ("abs_amax", "bf16_amax", "max_values"),
                                          "quotient": ("divide", "reciprocal"), "clamp": tuple(CLAMPS)},
                    _full_width),
        Composition("transposed_groups", {"contiguous": (True, False),
                                          "amax": ("abs_amax", "bf16_amax", "max_values", "inf_norm"),
                                          "clamp": tuple(CLAMPS)}, _transposed),
    ),
)
