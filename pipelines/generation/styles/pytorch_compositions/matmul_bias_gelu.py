"""matmul_bias_gelu programs: gelu(A @ B + bias) with bf16 inputs and output.

Compositions: torch.addmm (bias in the GEMM epilogue), F.linear on B's transpose (a view, or a
contiguous copy made on every call), the unfused matmul + add + gelu with several matmul
spellings, a full fp32 GEMM (strict, or with TF32 allowed for the call), bf16 GEMMs under
autocast from fp32 copies, torch.baddbmm with a batch of one, an fp32 accumulator over K slices,
and a loop over column blocks of B. GELU is the exact erf form from F.gelu, an nn.GELU module,
erf or the normal CDF written out in fp32, or the tanh approximation (at most 5e-4 from the erf
form, far inside the 2e-2 tolerance).
"""

from __future__ import annotations

from pipelines.generation.styles.pytorch_compositions.compose import (
    Call,
    Composition,
    Core,
    TaskSpace,
)

CALL = Call(
    unpack="a, b, bias = data", args=("a", "b", "bias"), split=("a",), dim=0,
    outputs=(("out", "torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)"),),
    unit="rows",
)
NAME = "linear_gelu"
PARAMS = ("a", "b", "bias")
GELUS = ("F_gelu", "F_gelu_none", "F_gelu_tanh", "erf_fp32", "ndtr_fp32", "module")
FP32_GELUS = ("F_gelu", "F_gelu_tanh", "erf_fp32", "ndtr_fp32")
GELU_WORDS = {
    "F_gelu": "F.gelu (exact erf form)", "F_gelu_none": 'F.gelu(approximate="none")',
    "F_gelu_tanh": 'F.gelu(approximate="tanh")', "erf_fp32": "0.5 x (1 + erf(x / sqrt 2)) in fp32",
    "ndtr_fp32": "x * Phi(x) with torch.special.ndtr in fp32", "module": "an nn.GELU module",
}


def _gelu_expr(kind: str, y: str, fp32: bool) -> tuple[list[str], str, tuple[str, ...]]:
    """gelu(`y`) as bf16 (`y` is fp32 when `fp32`): lines before, the expression, constants."""
    down = ".to(torch.bfloat16)" if fp32 else ""
    if kind in ("F_gelu", "F_gelu_none", "F_gelu_tanh", "module"):
        call = {"F_gelu": f"F.gelu({y})", "F_gelu_none": f'F.gelu({y}, approximate="none")',
                "F_gelu_tanh": f'F.gelu({y}, approximate="tanh")', "module": f"_GELU({y})"}[kind]
        consts = ("_GELU = torch.nn.GELU()",) if kind == "module" else ()
        return [], call + down, consts
    pre = [] if fp32 else [f"{y} = {y}.float()"]
    if kind == "erf_fp32":
        return pre, f"(0.5 * {y} * (1.0 + torch.erf({y} * INV_SQRT2))).to(torch.bfloat16)", (
            "INV_SQRT2 = 1.0 / math.sqrt(2.0)",)
    return pre, f"({y} * torch.special.ndtr({y})).to(torch.bfloat16)", ()


def _gelu(kind: str, y: str, fp32: bool, indent: str = "") -> tuple[list[str], tuple[str, ...]]:
    """Lines that return gelu(`y`) as bf16, and the constants they need."""
    pre, expr, consts = _gelu_expr(kind, y, fp32)
    return [indent + line for line in [*pre, f"return {expr}"]], consts


def _core(body: list[str], gelu: str, y: str, fp32: bool, summary: str,
          constants: tuple[str, ...] = ()) -> Core:
    lines, consts = _gelu(gelu, y, fp32)
    return Core(NAME, PARAMS, tuple(body + lines), f"{summary} GELU: {GELU_WORDS[gelu]}.",
                constants=constants + consts)


def _addmm(c: dict) -> Core:
    if c["out"] == "prealloc":
        body = ["y = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)",
                "torch.addmm(bias, a, b, out=y)"]
    else:
        body = ["y = torch.addmm(bias, a, b)  # bias added in the GEMM epilogue"]
    return _core(body, c["gelu"], "y", False,
                 f"The program runs one torch.addmm (bias fused into the GEMM"
                 f"{', written into a preallocated output with out=' if c['out'] == 'prealloc' else ''}), then GELU.")


def _linear(c: dict) -> Core:
    w = {"t_view": "b.t()", "T_contiguous": "b.T.contiguous()", "mT": "b.mT"}[c["weight"]]
    body = [f"y = F.linear(a, {w}, bias)"]
    how = ("a transposed copy of B made on every call" if c["weight"] == "T_contiguous"
           else "a transposed view of B (cuBLAS reads it as is)")
    return _core(body, c["gelu"], "y", False,
                 f"Layer style: the program calls F.linear with {how} as the (N, K) weight, then GELU.")


def _unfused(c: dict) -> Core:
    mm = {"matmul": "torch.matmul(a, b)", "at": "a @ b", "mm": "a.mm(b)",
          "einsum": 'torch.einsum("mk,kn->mn", a, b)'}[c["mm"]]
    fp32 = c["add"] == "add_fp32"
    if fp32 and c["mm"] == "at":
        mm = "(a @ b)"
    if c["add"] == "plus":
        body = [f"y = {mm} + bias"]
    elif c["add"] == "add_inplace":
        body = [f"y = {mm}", "y.add_(bias)"]
    else:
        body = [f"y = {mm}.float() + bias.float()"]
    add = {"plus": "adds the bias out of place", "add_inplace": "adds the bias in place",
           "add_fp32": "adds the bias in fp32"}[c["add"]]
    return _core(body, c["gelu"], "y", fp32,
                 f"Unfused: the program multiplies with {'the @ operator' if c['mm'] == 'at' else mm.split('(')[0]}, "
                 f"{add}, then applies GELU as a separate pass.")


def _fp32(c: dict) -> Core:
    mm = {"matmul": "torch.matmul(a.float(), b.float()) + bias.float()",
          "at": "a.float() @ b.float() + bias.float()",
          "addmm": "torch.addmm(bias.float(), a.float(), b.float())"}[c["mm"]]
    return _core([f"y = {mm}"], c["gelu"], "y", True,
                 "The program upcasts A, B and the bias to fp32 and runs the GEMM in full fp32 "
                 "(no tensor cores without TF32), then GELU in fp32.")


def _tf32(c: dict) -> Core:
    mm = {"matmul": "torch.matmul(a.float(), b.float()) + bias.float()",
          "addmm": "torch.addmm(bias.float(), a.float(), b.float())"}[c["mm"]]
    lines, consts = _gelu(c["gelu"], "y", True, indent="    ")
    body = ["previous = torch.get_float32_matmul_precision()",
            'torch.set_float32_matmul_precision("high")  # TF32 tensor cores for this call',
            "try:", f"    y = {mm}", *lines,
            "finally:", "    torch.set_float32_matmul_precision(previous)"]
    return Core(NAME, PARAMS, tuple(body),
                f"The program upcasts to fp32 and allows TF32 for the GEMM (float32 matmul precision "
                f"'high', restored afterwards), then GELU: {GELU_WORDS[c['gelu']]}.",
                constants=consts)


def _autocast(c: dict) -> Core:
    inner = {"linear": "F.linear(a.float(), b.float().t(), bias.float())",
             "addmm": "torch.addmm(bias.float(), a.float(), b.float())",
             "matmul_add": "a.float() @ b.float() + bias"}[c["inner"]]
    body = ["with torch.autocast(device_type=a.device.type, dtype=torch.bfloat16):",
            f"    y = {inner}  # autocast runs the GEMM in bf16"]
    return _core(body, c["gelu"], "y", False,
                 "Mixed-precision style: the program upcasts the operands to fp32 and lets "
                 "torch.autocast(bfloat16) cast them back down for the GEMM.")


def _baddbmm(c: dict) -> Core:
    body = ["y = torch.baddbmm(bias.view(1, 1, -1), a.unsqueeze(0), b.unsqueeze(0)).squeeze(0)"]
    return _core(body, c["gelu"], "y", False,
                 "The program runs the GEMM as torch.baddbmm over a batch of one with the bias as "
                 "the broadcast input, then GELU.")


def _k_split(c: dict) -> Core:
    body = ["acc = bias.float().expand(a.shape[0], -1).clone()  # (M, N) fp32 accumulator",
            "for k0 in range(0, a.shape[1], K_PER_STEP):",
            "    k1 = k0 + K_PER_STEP"]
    if c["accumulate"] == "addmm_fp32":
        body.append("    acc.addmm_(a[:, k0:k1].float(), b[k0:k1].float())")
        how = "fp32 addmm_ of upcast slices"
    else:
        body.append("    acc += (a[:, k0:k1] @ b[k0:k1]).float()")
        how = "bf16 GEMMs of the slices added into it"
    return _core(body, c["gelu"], "acc", True,
                 f"The program accumulates A @ B in an fp32 (M, N) buffer over slices of "
                 f"{c['k_step']} along K ({how}), starting from the bias.",
                 constants=(f"K_PER_STEP = {c['k_step']}",))


def _columns(c: dict) -> Core:
    pre, expr, consts = _gelu_expr(c["gelu"], "y", False)
    if c["op"] == "addmm":
        prod = "torch.addmm(bias[n0:n1], a, b[:, n0:n1])"
    else:
        prod = "a @ b[:, n0:n1] + bias[n0:n1]"
    slice_assign = c["write"] == "slice_assign"
    body = (["out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)"] if slice_assign
            else ["pieces = []"])
    body += ["for n0 in range(0, b.shape[1], COLS_PER_BLOCK):",
             "    n1 = n0 + COLS_PER_BLOCK",
             f"    y = {prod}",
             *("    " + line for line in pre),
             f"    out[:, n0:n1] = {expr}" if slice_assign else f"    pieces.append({expr})",
             "return out" if slice_assign else "return torch.cat(pieces, dim=1)"]
    return Core(NAME, PARAMS, tuple(body),
                f"The program loops over blocks of {c['cols']} output columns: a GEMM against a "
                f"column slice of B ({'torch.addmm' if c['op'] == 'addmm' else 'matmul plus bias'}) and "
                f"GELU ({GELU_WORDS[c['gelu']]}) per block, "
                f"{'written into a preallocated output' if slice_assign else 'joined with torch.cat'}.",
                constants=(f"COLS_PER_BLOCK = {c['cols']}", *consts))


SPACE = TaskSpace(
    task="matmul_bias_gelu",
    lead="Linear layer with exact GELU: gelu(A @ B + bias) for bf16 A (M, K), B (K, N) and bias "
         "(N,), returned in bf16.",
    call=CALL,
    blocks=(512, 2048, 4096),
    chunks=(2, 4, 8),
    compositions=(
        Composition("addmm_gelu", {"out": ("return", "prealloc"), "gelu": GELUS}, _addmm),
        Composition("linear_gelu", {"weight": ("t_view", "T_contiguous", "mT"), "gelu": GELUS}, _linear),
        Composition("matmul_add_gelu", {"mm": ("matmul", "at", "mm", "einsum"),
                                        "add": ("plus", "add_inplace", "add_fp32"), "gelu": GELUS},
                    _unfused, valid=lambda c: c["add"] != "add_fp32" or c["gelu"] in FP32_GELUS),
        Composition("fp32_matmul_gelu", {"mm": ("matmul", "at", "addmm"), "gelu": FP32_GELUS}, _fp32),
        Composition("tf32_matmul_gelu", {"mm": ("matmul", "addmm"), "gelu": FP32_GELUS}, _tf32,
                    compilable=False),
        Composition("autocast_linear_gelu", {"inner": ("linear", "addmm", "matmul_add"), "gelu": GELUS},
                    _autocast),
        Composition("baddbmm_gelu", {"gelu": GELUS}, _baddbmm),
        Composition("k_split_accumulate", {"k_step": (32, 128, 512, 1024),
                                           "accumulate": ("addmm_fp32", "bf16_partials"), "gelu": FP32_GELUS},
                    _k_split, compilable=False),
        Composition("column_block_gemm", {"cols": (256, 1024, 2048), "op": ("addmm", "matmul_add"),
                                          "gelu": GELUS, "write": ("slice_assign", "cat")},
                    _columns, compilable=False),
    ),
)
