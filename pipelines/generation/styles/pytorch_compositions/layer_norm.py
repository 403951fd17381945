"""layer_norm programs: (x - mean) / sqrt(var + eps) * weight + bias over the rows of a bf16 matrix.

Compositions: F.layer_norm on fp32 copies (affine inside, or as a separate epilogue), natively on
bf16 or under autocast, an nn.LayerNorm module, the statistics written out (mean and variance,
var_mean, sum and sum of squares), group_norm with one group, and a loop over column blocks.
Statistics are always fp32 (x has mean 0.5: E[x^2] - E[x]^2 in fp32 loses nothing that matters
at a 2e-2 tolerance), and the affine part is never done in bf16: rounding y, y * weight and the
sum separately (2^-8 each) puts outputs near zero at half the tolerance.
"""

from __future__ import annotations

from pipelines.generation.styles.pytorch_compositions import fragments as fr
from pipelines.generation.styles.pytorch_compositions.compose import (
    Call,
    Composition,
    Core,
    TaskSpace,
)

CALL = Call(unpack="x, weight, bias, eps = data", args=("x", "weight", "bias", "eps"), split=("x",),
            dim=0, outputs=(("out", "torch.empty_like(x)"),), unit="rows")
NAME = "layer_norm_rows"
PARAMS = ("x", "weight", "bias", "eps")
PREPS = ("none", "contiguous", "clone")
DOWNCASTS = ("to_bf16", "bfloat16", "type_as")
SHAPES = {"last_dim": "(x.shape[-1],)", "weight_shape": "weight.shape", "shape_slice": "x.shape[-1:]"}

# affine epilogue on the fp32 normalised `y`: code returning bf16, and words
AFFINE = {
    "mul_add": ("return (y * weight.float() + bias.float()).to(torch.bfloat16)",
                "applies weight and bias in fp32 as a separate epilogue"),
    "addcmul": ("return torch.addcmul(bias.float(), y, weight.float()).to(torch.bfloat16)",
                "applies weight and bias with one torch.addcmul in fp32"),
    "inplace": ("return y.mul_(weight).add_(bias).to(torch.bfloat16)",
                "applies weight and bias in place on the fp32 tensor"),
}


def _upcast_fused(c: dict) -> Core:
    shape = SHAPES[c["shape"]]
    body = fr.prep(c["prep"])
    if c["affine"] == "fused":
        body += [f"y = F.layer_norm(x.float(), {shape}, weight.float(), bias.float(), eps)",
                 f"return {fr.downcast(c['downcast'], 'y')}"]
        how = "with weight and bias inside the fused kernel"
    else:
        body += [f"y = F.layer_norm(x.float(), {shape}, eps=eps)", AFFINE[c["affine"]][0]]
        how = "without affine parameters; it then " + AFFINE[c["affine"]][1]
    return Core(NAME, PARAMS, tuple(body),
                f"The program runs F.layer_norm on an fp32 copy of x {how}.{fr.prep_doc(c['prep'])}")


def _native(c: dict) -> Core:
    shape = SHAPES[c["shape"]]
    body = fr.prep(c["prep"])
    if c["precision"] == "autocast":
        body += ["with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):",
                 f"    y = F.layer_norm(x, {shape}, weight, bias, eps)",
                 "return y.to(torch.bfloat16)  # autocast keeps layer_norm in fp32 on the GPU"]
        how = "under torch.autocast(bfloat16), which runs layer_norm in fp32"
    else:
        body.append(f"return F.layer_norm(x, {shape}, weight, bias, eps)")
        how = "directly on the bf16 tensors (fp32 statistics inside the kernel)"
    return Core(NAME, PARAMS, tuple(body), f"The program calls F.layer_norm {how}.{fr.prep_doc(c['prep'])}")


def _module(c: dict) -> Core:
    fp32 = c["dtype"] == "fp32"
    dtype = "torch.float32" if fp32 else "x.dtype"
    make = [f"norm = torch.nn.LayerNorm(x.shape[-1], eps=eps, device=x.device, dtype={dtype})"]
    helpers: tuple[str, ...] = ()
    constants: tuple[str, ...] = ()
    if c["cache"] == "cached":
        constants = ("_norms = {}  # (N, eps, device) -> nn.LayerNorm",)
        helpers = ("def _norm_for(x, eps):\n"
                   "    key = (x.shape[-1], eps, x.device)\n"
                   "    if key not in _norms:\n"
                   f"        _norms[key] = torch.nn.LayerNorm(x.shape[-1], eps=eps, device=x.device, dtype={dtype})\n"
                   "    return _norms[key]",)
        make = ["norm = _norm_for(x, eps)"]
    ctx = {"no_grad": "torch.no_grad()", "inference_mode": "torch.inference_mode()"}[c["grad"]]
    inp = "x.float()" if fp32 else "x"
    body = make + [f"with {ctx}:",
                   "    norm.weight.copy_(weight)",
                   "    norm.bias.copy_(bias)",
                   f"    y = norm({inp})",
                   "return y.to(torch.bfloat16)" if fp32 else "return y"]
    return Core(NAME, PARAMS, tuple(body),
                f"Model-code style: an nn.LayerNorm in {'fp32' if fp32 else 'bf16'} "
                f"({'built once per shape and cached' if c['cache'] == 'cached' else 'built on every call'}) "
                f"gets the weight and bias copied in and is applied under {ctx}.",
                constants=constants, helpers=helpers)


def _manual(c: dict) -> Core:
    body = [f"h = {fr.upcast(c['upcast'], 'x')}"]
    stats = c["stats"]
    if stats == "mean_var":
        body += ["mean = h.mean(dim=-1, keepdim=True)", "var = ((h - mean) ** 2).mean(dim=-1, keepdim=True)"]
        words = "the mean, then the mean squared deviation"
    elif stats == "var_mean":
        body.append("var, mean = torch.var_mean(h, dim=-1, correction=0, keepdim=True)")
        words = "torch.var_mean (correction=0)"
    elif stats == "var_unbiased_false":
        body += ["mean = h.mean(-1, keepdim=True)", "var = h.var(-1, unbiased=False, keepdim=True)"]
        words = "h.mean and h.var(unbiased=False)"
    else:
        body += ["mean = h.mean(dim=-1, keepdim=True)",
                 "var = (h * h).mean(dim=-1, keepdim=True) - mean * mean  # E[x^2] - E[x]^2"]
        words = "one pass of sum and sum of squares (E[x^2] - E[x]^2)"
    norm = {"rsqrt": "y = (h - mean) * torch.rsqrt(var + eps)",
            "div_sqrt": "y = (h - mean) / torch.sqrt(var + eps)",
            "inplace": "y = h.sub_(mean).mul_(torch.rsqrt(var + eps))"}[c["normalise"]]
    body += [norm, AFFINE[c["affine"]][0]]
    return Core(NAME, PARAMS, tuple(body),
                f"LayerNorm written out: the program upcasts to fp32, takes {words}, normalises "
                f"({c['normalise'].replace('_', ' ')}) and {AFFINE[c['affine']][1]}.")


def _group_norm(c: dict) -> Core:
    if c["dtype"] == "fp32":
        body = ["y = F.group_norm(x.float().unsqueeze(1), 1, eps=eps).squeeze(1)  # one group = the whole row"]
    else:
        body = ["y = F.group_norm(x.unsqueeze(1), 1, eps=eps).squeeze(1).float()  # one group = the whole row"]
    body.append(AFFINE[c["affine"]][0])
    return Core(NAME, PARAMS, tuple(body),
                f"The program treats each row as one sample of one channel and calls F.group_norm with "
                f"a single group ({'on an fp32 copy' if c['dtype'] == 'fp32' else 'on bf16, upcasting its result'}); "
                f"it then {AFFINE[c['affine']][1]}.")


def _columns(c: dict) -> Core:
    f = "" if c["upcast"] == "whole" else ".float()"
    src = "h" if c["upcast"] == "whole" else "x"
    body = (["h = x.float()"] if c["upcast"] == "whole" else []) + [
        f"blocks = {src}.split(COLS_PER_BLOCK, dim=-1)",
        "n = x.shape[-1]",
        "total = torch.zeros(x.shape[0], 1, device=x.device)",
        "total_sq = torch.zeros(x.shape[0], 1, device=x.device)",
        "for blk in blocks:",
        *(["    blk = blk.float()"] if f else []),
        "    total += blk.sum(dim=-1, keepdim=True)",
        "    total_sq += (blk * blk).sum(dim=-1, keepdim=True)",
        "mean = total / n",
        "inv = torch.rsqrt(total_sq / n - mean * mean + eps)",
    ]
    term = f"((blk{f} - mean) * inv * w.float() + b.float()).to(torch.bfloat16)"
    pieces = "zip(blocks, weight.split(COLS_PER_BLOCK), bias.split(COLS_PER_BLOCK))"
    if c["write"] == "copy_views":
        body += ["out = torch.empty_like(x)",
                 f"for (blk, w, b), view in zip({pieces}, out.split(COLS_PER_BLOCK, dim=-1)):",
                 f"    view.copy_({term})", "return out"]
    else:
        body.append(f"return torch.cat([{term} for blk, w, b in {pieces}], dim=-1)")
    return Core(NAME, PARAMS, tuple(body),
                f"The program walks each row in blocks of {c['cols']} columns: one pass accumulates "
                f"sum and sum of squares, a second normalises and applies weight and bias per block "
                f"({'into views of a preallocated output' if c['write'] == 'copy_views' else 'concatenated'}).",
                constants=(f"COLS_PER_BLOCK = {c['cols']}",))


SPACE = TaskSpace(
    task="layer_norm",
    lead="LayerNorm of a bf16 (M, N) matrix with bf16 weight and bias (biased variance, eps from "
         "the input), returned in bf16.",
    call=CALL,
    blocks=(128, 512, 2048),
    chunks=(2, 4, 8, 32),
    compositions=(
        Composition("upcast_fused_layer_norm", {"affine": ("fused", *AFFINE), "shape": tuple(SHAPES),
                                                "downcast": DOWNCASTS, "prep": PREPS},
                    _upcast_fused, valid=lambda c: c["affine"] == "fused" or c["downcast"] == "to_bf16"),
        Composition("native_layer_norm", {"precision": ("native", "autocast"), "shape": tuple(SHAPES),
                                          "prep": PREPS}, _native),
        Composition("nn_module_layer_norm", {"dtype": ("fp32", "bf16"), "cache": ("per_call", "cached"),
                                             "grad": ("no_grad", "inference_mode")},
                    _module, compilable=False),
        Composition("manual_mean_var", {"stats": ("mean_var", "var_mean", "var_unbiased_false", "sum_sumsq"),
                                        "normalise": ("rsqrt", "div_sqrt", "inplace"), "affine": tuple(AFFINE),
                                        "upcast": ("float", "to_float32")}, _manual),
        Composition("group_norm_one_group", {"dtype": ("fp32", "bf16"), "affine": tuple(AFFINE)},
                    _group_norm),
        Composition("column_block_layer_norm", {"cols": (256, 512, 1024, 2048), "write": ("copy_views", "cat"),
                                                "upcast": ("whole", "per_block")},
                    _columns, compilable=False),
    ),
)
