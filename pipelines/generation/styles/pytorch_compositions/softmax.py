"""softmax programs: row softmax of a bf16 matrix, rounded once to bf16.

Compositions run from the fused library call (on an fp32 copy, or natively on bf16 with fp32
inside the kernel) through the textbook max / exp / sum / divide, logsumexp and log_softmax
forms, to a two-pass loop over column blocks. Manual forms always subtract the row maximum in
fp32: in bf16, x - max is off by up to 0.03 for |x - max| near 10, which moves exp(x - max) by
3%, beyond the task's 2% relative tolerance.
"""

from __future__ import annotations

from pipelines.generation.styles.pytorch_compositions import fragments as fr
from pipelines.generation.styles.pytorch_compositions.compose import (
    Call,
    Composition,
    Core,
    TaskSpace,
)

CALL = Call(unpack="(x,) = data", args=("x",), split=("x",), dim=0,
            outputs=(("out", "torch.empty_like(x)"),), unit="rows")
NAME = "softmax_rows"
PREPS = ("none", "contiguous", "clone")
DOWNCASTS = ("to_bf16", "bfloat16", "type_as")


def _upcast_fused(c: dict) -> Core:
    body = fr.prep(c["prep"])
    if c["upcast"] == "dtype_arg":
        body.append(f"y = {fr.softmax_call(c['call'], 'x', kw=', dtype=torch.float32')}")
        how = f"asks {fr.call_name(c['call'], 'softmax')} for an fp32 result (dtype=torch.float32)"
    else:
        body += [f"xf = {fr.upcast(c['upcast'], 'x')}", f"y = {fr.softmax_call(c['call'], 'xf')}"]
        how = (f"upcasts with {fr.UPCASTS[c['upcast']][1]} and applies the fused "
               f"{fr.call_name(c['call'], 'softmax')}")
    if c["downcast"] == "copy_into":
        body += ["out = torch.empty_like(x)", "out.copy_(y)  # rounds to the output's bf16", "return out"]
        back = "copies the fp32 result into a preallocated bf16 output"
    else:
        body.append(f"return {fr.downcast(c['downcast'], 'y')}")
        back = f"rounds back with {fr.DOWNCASTS[c['downcast']][1]}"
    return Core(NAME, ("x",), tuple(body),
                f"The program {how}, then {back}.{fr.prep_doc(c['prep'])}")


def _native(c: dict) -> Core:
    body = fr.prep(c["prep"])
    if c["precision"] == "autocast":
        body += ["with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):",
                 f"    y = {fr.softmax_call(c['call'], 'x')}",
                 "return y.to(torch.bfloat16)  # autocast runs softmax in fp32 on the GPU"]
        how = "under torch.autocast(bfloat16), where softmax is one of the ops kept in fp32"
    else:
        body.append(f"return {fr.softmax_call(c['call'], 'x')}")
        how = "directly on the bf16 input (the kernel accumulates in fp32 and rounds once)"
    return Core(NAME, ("x",), tuple(body),
                f"The program applies the fused {fr.call_name(c['call'], 'softmax')} {how}."
                f"{fr.prep_doc(c['prep'])}")


def _manual(c: dict) -> Core:
    up = "x.double()" if c["upcast_at"] == "float64" else "x.float()"
    max_of = {"amax": "m = {t}.amax(dim=-1, keepdim=True)",
              "max_values": "m = {t}.max(dim=-1, keepdim=True).values",
              "max_tuple": "m, _ = torch.max({t}, dim=-1, keepdim=True)"}[c["max_op"]]
    if c["upcast_at"] == "after_max":
        body = [max_of.format(t="x") + "  # exact in bf16", f"xf = {up}"]
    else:
        body = [f"xf = {up}", max_of.format(t="xf")]
    consts = []
    if c["exp"] == "exp":
        body.append("e = torch.exp(xf - m)")
    elif c["exp"] == "inplace":
        body.append("e = xf.sub_(m).exp_()  # xf is a private copy")
    else:
        consts.append("LOG2E = math.log2(math.e)")
        body.append("e = torch.exp2((xf - m) * LOG2E)")
    body.append("s = e.sum(dim=-1, keepdim=True)")
    if c["normalise"] == "div_out":
        body += ["out = torch.empty_like(x)", "torch.div(e, s, out=out)", "return out"]
    else:
        y = {"divide": "e / s", "div_inplace": "e.div_(s)", "reciprocal": "e * s.reciprocal()"}[c["normalise"]]
        body.append(f"return {fr.downcast(c['downcast'], '(' + y + ')' if ' ' in y else y)}")
    where = {"start": "upcasts to fp32 first", "after_max": "takes the row max on bf16 (exact) "
             "and upcasts to fp32 for the rest", "float64": "works in float64 throughout"}[c["upcast_at"]]
    expo = {"exp": "torch.exp", "inplace": "in-place sub_ and exp_", "exp2": "exp2 of a log2(e)-scaled "
            "argument"}[c["exp"]]
    norm = {"divide": "divides by the row sum", "div_inplace": "divides by the row sum in place",
            "reciprocal": "multiplies by the reciprocal of the row sum",
            "div_out": "divides straight into a preallocated bf16 output (out=)"}[c["normalise"]]
    return Core(NAME, ("x",), tuple(body),
                f"Softmax written out by hand: the program {where}, subtracts the row max, "
                f"exponentiates ({expo}), {norm} and rounds to bf16.", constants=tuple(consts))


def _logsumexp(c: dict) -> Core:
    up = "x.double()" if c["upcast"] == "float64" else fr.upcast(c["upcast"], "x")
    body = fr.prep(c["prep"]) + [f"xf = {up}", "lse = torch.logsumexp(xf, dim=-1, keepdim=True)"]
    y = "torch.exp(xf - lse)" if c["exp"] == "exp" else "xf.sub_(lse).exp_()"
    body.append(f"return {fr.downcast(c['downcast'], y)}")
    prec = "float64" if c["upcast"] == "float64" else "fp32"
    return Core(NAME, ("x",), tuple(body),
                f"The program computes each row's logsumexp in {prec} and returns exp(x - lse) "
                f"({'in place' if c['exp'] == 'inplace' else 'out of place'}), rounded to bf16."
                f"{fr.prep_doc(c['prep'])}")


def _log_softmax_exp(c: dict) -> Core:
    if c["dtype"] == "dtype_arg":
        body = [f"logp = {fr.softmax_call(c['call'], 'x', kw=', dtype=torch.float32', log=True)}"]
    else:
        body = ["xf = x.float()", f"logp = {fr.softmax_call(c['call'], 'xf', log=True)}"]
    y = "logp.exp()" if c["exp"] == "exp" else "logp.exp_()"
    body.append(f"return {fr.downcast(c['downcast'], y)}")
    return Core(NAME, ("x",), tuple(body),
                f"The program takes {fr.call_name(c['call'], 'log_softmax')} in fp32 ("
                f"{'dtype=torch.float32' if c['dtype'] == 'dtype_arg' else 'on an fp32 copy'}) and "
                f"exponentiates it{' in place' if c['exp'] == 'inplace' else ''}, rounding to bf16.")


def _column_blocks(c: dict) -> Core:
    whole = c["upcast"] == "whole"
    f = "" if whole else ".float()"
    body = ["xf = x.float()" if whole else "", f"blocks = {'xf' if whole else 'x'}.split(COLS_PER_BLOCK, dim=-1)"]
    body = [b for b in body if b]
    if c["passes"] == "online":
        body += ['m = torch.full((x.shape[0], 1), float("-inf"), device=x.device)',
                 "s = torch.zeros(x.shape[0], 1, device=x.device)",
                 "for blk in blocks:",
                 f"    m_new = torch.maximum(m, blk.amax(dim=-1, keepdim=True){f})",
                 f"    s = s * torch.exp(m - m_new) + torch.exp(blk{f} - m_new).sum(dim=-1, keepdim=True)",
                 "    m = m_new"]
        stats = "a running max and a rescaled running sum (online softmax)"
    else:
        body += [f"m = torch.stack([blk.amax(dim=-1) for blk in blocks], dim=-1).amax(dim=-1, keepdim=True){f}",
                 f"s = sum(torch.exp(blk{f} - m).sum(dim=-1, keepdim=True) for blk in blocks)"]
        stats = "one pass for the row max and one for the sum of exponentials"
    if c["write"] == "copy_views":
        body += ["out = torch.empty_like(x)",
                 "for blk, view in zip(blocks, out.split(COLS_PER_BLOCK, dim=-1)):",
                 f"    view.copy_(torch.exp(blk{f} - m) / s)",
                 "return out"]
        write = "writes each block into a view of a preallocated output"
    else:
        body.append(f"return torch.cat([(torch.exp(blk{f} - m) / s).to(torch.bfloat16) for blk in blocks], dim=-1)")
        write = "concatenates the normalised blocks"
    return Core(NAME, ("x",), tuple(body),
                f"The program walks each row in blocks of {c['cols']} columns: {stats}, then a final "
                f"pass that {write}; {'the whole input is upcast once' if whole else 'each block is upcast when read'}.",
                constants=(f"COLS_PER_BLOCK = {c['cols']}",))


SPACE = TaskSpace(
    task="softmax",
    lead="Row softmax of a bf16 (M, N) matrix, returned in bf16.",
    call=CALL,
    blocks=(128, 512, 2048),
    chunks=(2, 4, 8, 32),
    compositions=(
        Composition("upcast_fused_softmax", {"upcast": ("float", "to_float32", "dtype_arg"),
                                             "call": ("torch", "F", "method"),
                                             "downcast": (*DOWNCASTS, "copy_into"), "prep": PREPS},
                    _upcast_fused),
        Composition("native_bf16_softmax", {"call": ("torch", "F", "method"),
                                            "precision": ("native", "autocast"), "prep": PREPS},
                    _native),
        Composition("manual_max_exp_sum", {"upcast_at": ("start", "after_max", "float64"),
                                           "max_op": ("amax", "max_values", "max_tuple"),
                                           "exp": ("exp", "inplace", "exp2"),
                                           "normalise": ("divide", "div_inplace", "reciprocal", "div_out"),
                                           "downcast": DOWNCASTS},
                    _manual, valid=lambda c: c["normalise"] != "div_out" or c["downcast"] == "to_bf16"),
        Composition("logsumexp_softmax", {"upcast": ("float", "to_float32", "float64"),
                                          "exp": ("exp", "inplace"), "downcast": DOWNCASTS,
                                          "prep": PREPS}, _logsumexp),
        Composition("log_softmax_exp", {"call": ("torch", "F", "method"), "dtype": ("upcast", "dtype_arg"),
                                        "exp": ("exp", "inplace"), "downcast": DOWNCASTS},
                    _log_softmax_exp),
        Composition("column_block_softmax", {"cols": (256, 512, 1024, 2048), "passes": ("online", "max_then_sum"),
                                             "upcast": ("whole", "per_block"), "write": ("copy_views", "cat")},
                    _column_blocks, compilable=False),
    ),
)
