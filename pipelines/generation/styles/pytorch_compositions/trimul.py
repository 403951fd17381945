"""trimul programs: AlphaFold3's outgoing triangle multiplicative update (GPU MODE bioml/trimul).

    xn = LayerNorm(x); left = (xn W_lp^T) * mask * sigmoid(xn W_lg^T), right likewise
    out[b, i, j, h] = sum_k left[b, i, k, h] * right[b, j, k, h]
    output = (LayerNorm_h(out) * sigmoid(xn W_og^T)) W_out^T                 (bs, N, N, dim) fp32

Compositions: five separate projections (F.linear, x @ W^T or einsum) as the reference module
has them, the five weights concatenated into one GEMM, the triangle contraction in Python
blocks of hidden channels or of rows i, and the whole update under torch.autocast(bfloat16).
The contraction is an einsum, a channel-first batched matmul (permuted views or contiguous
copies) or a flat torch.bmm; it may run on bf16 operands (cast explicitly or by autocast), and
the fp32 GEMMs may use TF32 for the call. Projections never run in bf16: with dim = 384 their
bf16 rounding alone took outputs to half the 2e-2 tolerance at N = 128, against a quarter for
a bf16 contraction. The mask (int64 0/1 or fp32 ones) multiplies the projection,
is applied with torch.where, or masks the normalised input of the two value projections
(bias-free: W (x m) = (W x) m).
"""

from __future__ import annotations

from pipelines.generation.styles.pytorch_compositions.compose import (
    Call,
    Composition,
    Core,
    TaskSpace,
)

CALL = Call(unpack="x, mask, weights, config = data", args=("x", "mask", "weights"), split=("x", "mask"),
            dim=0, outputs=(("out", "torch.empty_like(x)"),), unit="batches", unit_one="batch")
NAME = "triangle_update"
PARAMS = ("x", "mask", "weights")
PROJ_NAMES = ("left_proj", "right_proj", "left_gate", "right_gate", "out_gate")
PROJ_CONST = ('PROJECTIONS = ("left_proj.weight", "right_proj.weight", "left_gate.weight", '
              '"right_gate.weight", "out_gate.weight")')
CONTRACTIONS = ("einsum", "bmm_channels", "einsum_channels_first", "bmm_flat")
CONTRACTION_WORDS = {"einsum": "the reference's einsum", "bmm_channels": "a channel-first batched "
                     "matmul on permuted views", "einsum_channels_first": "an einsum on contiguous "
                     "channel-first copies", "bmm_flat": "torch.bmm over (batch * channel) matrices"}
MASKINGS = ("multiply", "where", "mask_input")
PRECISIONS = ("fp32", "tf32", "bf16_contraction", "tf32_bf16_contraction")
GATES = {"method": "{t}.sigmoid()", "torch": "torch.sigmoid({t})", "inplace": "{t}.sigmoid_()"}


def _proj(kind: str, inp: str, name: str) -> str:
    w = f'w["{name}.weight"]'
    return {"linear": f"F.linear({inp}, {w})", "matmul_t": f"{inp} @ {w}.t()",
            "einsum": f'torch.einsum("bijd,hd->bijh", {inp}, {w})'}[kind]


def _contraction(kind: str, left: str, right: str, fp32_out: bool) -> list[str]:
    up = ".float()" if fp32_out else ""
    if kind == "einsum":
        return [f'out = torch.einsum("... i k d, ... j k d -> ... i j d", {left}, {right}){up}']
    if kind == "bmm_channels":
        return [f"out = torch.matmul({left}.permute(0, 3, 1, 2), {right}.permute(0, 3, 2, 1)){up}.permute(0, 2, 3, 1)"]
    if kind == "einsum_channels_first":
        return [f"lt = {left}.permute(0, 3, 1, 2).contiguous()  # (b, h, i, k)",
                f"rt = {right}.permute(0, 3, 1, 2).contiguous()  # (b, h, j, k)",
                f'out = torch.einsum("bhik,bhjk->bhij", lt, rt){up}.permute(0, 2, 3, 1)']
    return [f"b, n, _, c = {left}.shape",
            f"lt = {left}.permute(0, 3, 1, 2).reshape(b * c, n, n)",
            f"rt = {right}.permute(0, 3, 2, 1).reshape(b * c, n, n)",
            f"out = torch.bmm(lt, rt){up}.view(b, c, n, n).permute(0, 2, 3, 1)"]


def _out_norm(kind: str) -> list[str]:
    if kind == "layer_norm":
        return ['out = F.layer_norm(out, (hidden,), w["to_out_norm.weight"], w["to_out_norm.bias"])']
    return ["var, mean = torch.var_mean(out, dim=-1, correction=0, keepdim=True)",
            'out = (out - mean) * torch.rsqrt(var + 1e-5) * w["to_out_norm.weight"] + w["to_out_norm.bias"]']


def _core(body: list[str], summary: str, constants: tuple[str, ...] = ()) -> Core:
    """The Core, without the `hidden = ...` line when nothing reads it."""
    if not any("hidden" in line for line in body if not line.lstrip().startswith("hidden =")):
        body = [line for line in body if not line.lstrip().startswith("hidden =")]
    return Core(NAME, PARAMS, tuple(body), summary, constants=constants)


def _gate(kind: str, t: str) -> str:
    return GATES[kind].format(t=t)


def _masked(c: dict, body: list[str], lp: str, rp: str, lg: str, rg: str) -> None:
    """Append the gated, masked left and right values (fp32)."""
    if c["masking"] == "multiply":
        body += [f"left = {lp} * m * {_gate(c['gate'], lg)}", f"right = {rp} * m * {_gate(c['gate'], rg)}"]
    elif c["masking"] == "where":
        body += [f"left = torch.where(keep, {lp} * {_gate(c['gate'], lg)}, 0.0)",
                 f"right = torch.where(keep, {rp} * {_gate(c['gate'], rg)}, 0.0)"]
    else:
        body += [f"left = {lp} * {_gate(c['gate'], lg)}", f"right = {rp} * {_gate(c['gate'], rg)}"]


def _mask_line(c: dict) -> str:
    if c["masking"] == "where":
        return "keep = mask.unsqueeze(-1) != 0  # (b, N, N, 1)"
    return "m = mask.unsqueeze(-1).to(xn.dtype)  # int64 0/1 or fp32 ones"


def _header() -> list[str]:
    return ["w = weights",
            'hidden = w["left_proj.weight"].shape[0]',
            'xn = F.layer_norm(x, (x.shape[-1],), w["norm.weight"], w["norm.bias"])']


def _tail(c: dict, og: str) -> list[str]:
    out = _out_norm(c["out_norm"])
    final = ('F.linear(out * og, w["to_out.weight"])' if c.get("out_proj", "linear") == "linear"
             else '(out * og) @ w["to_out.weight"].t()')
    return out + [f"og = {og}", f"return {final}"]


def _tf32(body: list[str]) -> list[str]:
    head = [line for line in body[:3]]
    rest = body[3:]
    return (head + ["previous = torch.get_float32_matmul_precision()",
                    'torch.set_float32_matmul_precision("high")  # TF32 GEMMs for this call',
                    "try:"] + ["    " + line for line in rest]
            + ["finally:", "    torch.set_float32_matmul_precision(previous)"])


def _precision_words(p: str) -> str:
    return {"fp32": "All GEMMs run in full fp32, as the reference's.",
            "tf32": "The fp32 GEMMs may use TF32 for this call (matmul precision 'high', restored after).",
            "bf16_contraction": "The triangle contraction runs on bf16 operands (fp32 accumulation).",
            "tf32_bf16_contraction": "The projections may use TF32 for this call (matmul precision "
                                     "'high', restored after) and the triangle contraction runs on bf16 "
                                     "operands."}[p]


def _separate(c: dict) -> Core:
    body = _header() + [_mask_line(c)]
    p = c["proj"]
    value_in = "xm" if c["masking"] == "mask_input" else "xn"
    if c["masking"] == "mask_input":
        body.append("xm = xn * m  # masking the input of a bias-free projection masks its output")
    body += [f"lp = {_proj(p, value_in, 'left_proj')}", f"rp = {_proj(p, value_in, 'right_proj')}",
             f"lg = {_proj(p, 'xn', 'left_gate')}", f"rg = {_proj(p, 'xn', 'right_gate')}",
             f"og = {_proj(p, 'xn', 'out_gate')}"]
    _masked(c, body, "lp", "rp", "lg", "rg")
    bf16 = c["precision"].endswith("bf16_contraction")
    left, right = ("left.to(torch.bfloat16)", "right.to(torch.bfloat16)") if bf16 else ("left", "right")
    if bf16 and c["contraction"] != "einsum":
        body += ["left, right = left.to(torch.bfloat16), right.to(torch.bfloat16)"]
        left, right = "left", "right"
    body += _contraction(c["contraction"], left, right, bf16)
    body += _tail(c, _gate(c["gate"], "og"))
    if c["precision"].startswith("tf32"):
        body = _tf32(body)
    proj_words = {"linear": "F.linear", "matmul_t": "x @ W.t()", "einsum": "einsum"}[p]
    return _core(body,
                f"The reference module's structure: five separate bias-free projections ({proj_words}), "
                f"masked gates, the triangle contraction as {CONTRACTION_WORDS[c['contraction']]}, the "
                f"output LayerNorm ({'F.layer_norm' if c['out_norm'] == 'layer_norm' else 'var_mean'}) "
                f"and the gated output projection. {_precision_words(c['precision'])}")


def _fused(c: dict) -> Core:
    body = _header() + [_mask_line(c)]
    body.append("proj = F.linear(xn, torch.cat([w[name] for name in PROJECTIONS], dim=0))  # (b, N, N, 5 * hidden)")
    if c["split"] == "split":
        body.append("lp, rp, lg, rg, og = proj.split(hidden, dim=-1)")
    elif c["split"] == "chunk":
        body.append("lp, rp, lg, rg, og = proj.chunk(5, dim=-1)")
    else:
        body.append("lp, rp, lg, rg, og = proj.unflatten(-1, (5, hidden)).unbind(-2)")
    _masked(c, body, "lp", "rp", "lg", "rg")
    bf16 = c["precision"].endswith("bf16_contraction")
    if bf16:
        body.append("left, right = left.to(torch.bfloat16), right.to(torch.bfloat16)")
    body += _contraction(c["contraction"], "left", "right", bf16)
    body += _tail(c, _gate(c["gate"], "og"))
    if c["precision"].startswith("tf32"):
        body = _tf32(body)
    return _core(body,
                f"The program concatenates the five projection weights and runs one GEMM "
                f"(split with {c['split']}), then the masked gates, the contraction as "
                f"{CONTRACTION_WORDS[c['contraction']]} and the gated output projection. "
                f"{_precision_words(c['precision'])}",
                constants=(PROJ_CONST,))


def _blocked(c: dict) -> Core:
    bf16 = c["precision"] == "bf16_contraction"
    body = _header() + [_mask_line(c)]
    if c["proj"] == "fused":
        body += ["proj = F.linear(xn, torch.cat([w[name] for name in PROJECTIONS], dim=0))",
                 "lp, rp, lg, rg, og = proj.split(hidden, dim=-1)"]
        _masked(c, body, "lp", "rp", "lg", "rg")
        og = "og.sigmoid()"
    else:
        _masked(c, body, 'F.linear(xn, w["left_proj.weight"])', 'F.linear(xn, w["right_proj.weight"])',
                'F.linear(xn, w["left_gate.weight"])', 'F.linear(xn, w["right_gate.weight"])')
        og = 'F.linear(xn, w["out_gate.weight"]).sigmoid()'
    if bf16:
        body.append("left, right = left.to(torch.bfloat16), right.to(torch.bfloat16)")
    body.append("out = torch.empty(left.shape, dtype=torch.float32, device=x.device)")
    if c["axis"] == "channels":
        body += ["for c0 in range(0, hidden, CHANNELS_PER_BLOCK):",
                 "    c1 = c0 + CHANNELS_PER_BLOCK"]
        if c["inner"] == "einsum":
            body.append('    out[..., c0:c1] = torch.einsum("bikd,bjkd->bijd", left[..., c0:c1], right[..., c0:c1])')
        else:
            body.append("    out[..., c0:c1] = torch.matmul(left[..., c0:c1].permute(0, 3, 1, 2),"
                        " right[..., c0:c1].permute(0, 3, 2, 1)).permute(0, 2, 3, 1)")
        const = f"CHANNELS_PER_BLOCK = {c['size']}"
        what = f"blocks of {c['size']} hidden channels"
    else:
        body += ["for i0 in range(0, left.shape[1], ROWS_PER_BLOCK):",
                 "    i1 = i0 + ROWS_PER_BLOCK"]
        if c["inner"] == "einsum":
            body.append('    out[:, i0:i1] = torch.einsum("bikd,bjkd->bijd", left[:, i0:i1], right)')
        else:
            body.append("    out[:, i0:i1] = torch.matmul(left[:, i0:i1].permute(0, 3, 1, 2),"
                        " right.permute(0, 3, 2, 1)).permute(0, 2, 3, 1)")
        const = f"ROWS_PER_BLOCK = {c['size']}"
        what = f"blocks of {c['size']} rows i"
    body += _tail({"out_norm": "layer_norm"}, og)
    return _core(body,
                f"The program computes the gated values with {'one concatenated' if c['proj'] == 'fused' else 'separate'} "
                f"projection GEMM{'' if c['proj'] == 'fused' else 's'}, then the triangle contraction in a "
                f"Python loop over {what} ({'einsum' if c['inner'] == 'einsum' else 'batched matmul'}) into "
                f"a preallocated fp32 buffer. {_precision_words(c['precision'])}",
                constants=(const, PROJ_CONST) if c["proj"] == "fused" else (const,))


def _autocast(c: dict) -> Core:
    body = _header() + ["m = mask.unsqueeze(-1)  # int64 0/1 or fp32 ones"]
    if c["proj"] == "fused":
        body += ["proj = F.linear(xn, torch.cat([w[name] for name in PROJECTIONS], dim=0))",
                 "lp, rp, lg, rg, og = proj.split(hidden, dim=-1)"]
    else:
        body += [f'{n} = F.linear(xn, w["{full}.weight"])' for n, full in zip(("lp", "rp", "lg", "rg", "og"), PROJ_NAMES)]
    body += ["left = lp * m * lg.sigmoid()", "right = rp * m * rg.sigmoid()",
             "with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):  # bf16 triangle GEMMs"]
    body += ["    " + line for line in _contraction(c["contraction"], "left", "right", True)]
    body += _tail(c, "og.sigmoid()")
    return _core(body,
                f"Mixed-precision style: fp32 {'concatenated projection' if c['proj'] == 'fused' else 'projections'}, "
                f"then the triangle contraction ({CONTRACTION_WORDS[c['contraction']]}) under "
                f"torch.autocast(bfloat16), which runs it as bf16 GEMMs; the output norm, gate and "
                f"projection follow in fp32.",
                constants=(PROJ_CONST,) if c["proj"] == "fused" else ())


SPACE = TaskSpace(
    task="trimul",
    lead="Outgoing triangle multiplicative update (AlphaFold3, GPU MODE trimul): LayerNorm, masked and "
         "gated left/right projections, the triangle contraction over k, an output LayerNorm, gate and "
         "projection; fp32 (bs, N, N, dim) in and out.",
    call=CALL,
    blocks=(1,),
    chunks=(2,),
    compositions=(
        Composition("separate_projections", {"proj": ("linear", "matmul_t", "einsum"), "masking": MASKINGS,
                                             "gate": tuple(GATES), "contraction": CONTRACTIONS,
                                             "out_norm": ("layer_norm", "var_mean"),
                                             "out_proj": ("linear", "matmul_t"),
                                             "precision": PRECISIONS},
                    _separate),
        Composition("fused_projection_gemm", {"split": ("split", "chunk", "unflatten"), "masking": MASKINGS,
                                              "gate": tuple(GATES), "contraction": CONTRACTIONS,
                                              "out_norm": ("layer_norm", "var_mean"),
                                              "precision": PRECISIONS},
                    _fused, valid=lambda c: c["masking"] != "mask_input"),
        Composition("blocked_contraction", {"axis": ("channels", "rows"), "size": (16, 32, 64, 256),
                                            "inner": ("einsum", "matmul"), "proj": ("separate", "fused"),
                                            "masking": ("multiply", "where"), "gate": ("method", "torch"),
                                            "precision": ("fp32", "bf16_contraction")},
                    _blocked, compilable=False,
                    valid=lambda c: (c["axis"] == "channels") == (c["size"] < 256) or c["size"] in (32, 64)),
        Composition("autocast_trimul", {"proj": ("separate", "fused"), "contraction": CONTRACTIONS,
                                        "out_norm": ("layer_norm", "var_mean")}, _autocast),
    ),
)
