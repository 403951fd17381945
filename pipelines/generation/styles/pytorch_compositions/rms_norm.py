"""rms_norm programs: weight * x / sqrt(mean(x^2) + eps) over the rows of a bf16 matrix.

Compositions: F.rms_norm (on an fp32 copy or natively on bf16, the weight inside or after), the
Hugging Face LlamaRMSNorm expression with its spellings, norm- and dot-product-based sums of
squares, fp32 statistics applied to the bf16 input, and a loop over column blocks. Every form
takes the mean of squares in fp32 (or inside a fused kernel that accumulates in fp32) and rounds
to bf16 at most twice, as the reference does: each bf16 rounding is up to 2^-8 relative, so a
third one (say, the scale rounded to bf16 before it multiplies) brings a program to half the
task's 2e-2 tolerance.
"""

from __future__ import annotations

from pipelines.generation.styles.pytorch_compositions import fragments as fr
from pipelines.generation.styles.pytorch_compositions.compose import (
    Call,
    Composition,
    Core,
    TaskSpace,
)

CALL = Call(unpack="x, weight, eps = data", args=("x", "weight", "eps"), split=("x",), dim=0,
            outputs=(("out", "torch.empty_like(x)"),), unit="rows")
NAME = "rms_norm_rows"
PARAMS = ("x", "weight", "eps")
PREPS = ("none", "contiguous", "clone")
DOWNCASTS = ("to_bf16", "bfloat16", "type_as")
SHAPES = {"last_dim": "(x.shape[-1],)", "weight_shape": "weight.shape", "shape_slice": "x.shape[-1:]"}

# weight application: code returning the bf16 result from the fp32 normalised `h`, and words
WEIGHTS = {
    "bf16_after": ("return weight * h.to(torch.bfloat16)",
                   "rounds to bf16 and then multiplies by the weight, as LlamaRMSNorm does"),
    "fp32_before": ("return (h * weight.float()).to(torch.bfloat16)",
                    "multiplies by the weight in fp32 and rounds once"),
    "inplace_after": ("return h.to(torch.bfloat16).mul_(weight)",
                      "rounds to bf16 and multiplies by the weight in place"),
}
NORMALISE = {
    "rsqrt_mul": ("h = h * torch.rsqrt(var + eps)", "multiplies by rsqrt(var + eps)"),
    "div_sqrt": ("h = h / torch.sqrt(var + eps)", "divides by sqrt(var + eps)"),
    "rsqrt_inplace": ("h.mul_(torch.rsqrt(var.add_(eps)))", "scales the fp32 copy in place"),
}


def _fused(c: dict) -> Core:
    shape = SHAPES[c["shape"]]
    body = fr.prep(c["prep"])
    path = c["path"]
    if path == "upcast_all":
        body += [f"y = F.rms_norm(x.float(), {shape}, weight.float(), eps)",
                 f"return {fr.downcast(c['downcast'], 'y')}"]
        how = "F.rms_norm on fp32 copies of x and the weight, rounded to bf16 at the end"
    elif path == "upcast_weight_after":
        body += [f"y = F.rms_norm(x.float(), {shape}, eps=eps)",
                 f"return weight * {fr.downcast(c['downcast'], 'y')}"]
        how = "F.rms_norm without weight on an fp32 copy, rounded to bf16, then the weight"
    elif path == "native":
        body.append(f"return F.rms_norm(x, {shape}, weight, eps)")
        how = "F.rms_norm directly on the bf16 tensors (fp32 accumulation inside)"
    else:
        body.append(f"return F.rms_norm(x, {shape}, eps=eps) * weight")
        how = "F.rms_norm without weight on the bf16 input, then a separate weight multiply"
    return Core(NAME, PARAMS, tuple(body), f"The program uses {how}.{fr.prep_doc(c['prep'])}")


def _hf(c: dict) -> Core:
    sq = {"pow": "h.pow(2)", "square": "h.square()", "mul": "(h * h)"}[c["square"]]
    red = (f"var = {sq}.mean(-1, keepdim=True)" if c["reduce"] == "mean"
           else f"var = {sq}.sum(-1, keepdim=True) / h.shape[-1]")
    body = [f"h = {fr.upcast(c['upcast'], 'x')}", red, NORMALISE[c["normalise"]][0],
            WEIGHTS[c["weight"]][0]]
    return Core(NAME, PARAMS, tuple(body),
                f"The LlamaRMSNorm expression: the program upcasts to fp32, takes the mean of "
                f"squares ({sq.strip('()')}, {'mean' if c['reduce'] == 'mean' else 'sum / N'}), "
                f"{NORMALISE[c['normalise']][1]} and {WEIGHTS[c['weight']][1]}.")


def _norm(c: dict) -> Core:
    norm = {"linalg": "torch.linalg.vector_norm(h, dim=-1, keepdim=True)",
            "method": "h.norm(dim=-1, keepdim=True)",
            "torch_norm": "torch.norm(h, p=2, dim=-1, keepdim=True)"}[c["norm"]]
    body = [f"h = {fr.upcast(c['upcast'], 'x')}", f"norm = {norm}"]
    if c["formula"] == "rsqrt":
        body.append("h = h * torch.rsqrt(norm.square() / h.shape[-1] + eps)")
    else:
        body.append("h = h / torch.sqrt(norm.pow(2) / h.shape[-1] + eps)")
    body.append(WEIGHTS[c["weight"]][0])
    return Core(NAME, PARAMS, tuple(body),
                f"The program gets the mean of squares from the row's L2 norm ({norm.split('(')[0]}) "
                f"squared over N, normalises in fp32 and {WEIGHTS[c['weight']][1]}.")


def _dot(c: dict) -> Core:
    dot = {"einsum": 'torch.einsum("...d,...d->...", h, h).unsqueeze(-1)',
           "matmul": "(h.unsqueeze(-2) @ h.unsqueeze(-1)).squeeze(-1)",
           "vecdot": "torch.linalg.vecdot(h, h, dim=-1).unsqueeze(-1)"}[c["dot"]]
    body = [f"h = {fr.upcast(c['upcast'], 'x')}", f"var = {dot} / h.shape[-1]",
            NORMALISE[c["normalise"]][0], WEIGHTS[c["weight"]][0]]
    what = {"einsum": "an einsum", "matmul": "a batched (1 x N) @ (N x 1) matmul per row",
            "vecdot": "torch.linalg.vecdot"}[c["dot"]]
    return Core(NAME, PARAMS, tuple(body),
                f"The program takes each row's sum of squares as a dot product with itself "
                f"({what}), {NORMALISE[c['normalise']][1]} and {WEIGHTS[c['weight']][1]}.")


def _mixed_apply(c: dict) -> Core:
    stats = {"pow_mean": "var = x.float().pow(2).mean(-1, keepdim=True)",
             "square_mean": "var = x.float().square().mean(dim=-1, keepdim=True)",
             "vector_norm": "var = torch.linalg.vector_norm(x.float(), dim=-1, keepdim=True).square() / x.shape[-1]"}
    inv = "torch.rsqrt(var + eps)" if c["inv"] == "rsqrt" else "1.0 / torch.sqrt(var + eps)"
    apply = {"cast_then_weight": "return (x * inv).to(torch.bfloat16) * weight",
             "cast_then_weight_inplace": "return (x * inv).to(torch.bfloat16).mul_(weight)",
             "weight_fp32": "return (x * inv * weight.float()).to(torch.bfloat16)"}[c["apply"]]
    body = [stats[c["stats"]], f"inv = {inv}  # (rows, 1) fp32", apply]
    return Core(NAME, PARAMS, tuple(body),
                "The program takes the fp32 statistics from an upcast it does not keep, then scales "
                "the bf16 input by the fp32 factor (type promotion makes the product fp32) and "
                + ("rounds once with the weight applied in fp32." if c["apply"] == "weight_fp32"
                   else "rounds to bf16 before the weight, as LlamaRMSNorm does."))


def _columns(c: dict) -> Core:
    whole = c["upcast"] == "whole"
    f = "" if whole else ".float()"
    src = "h" if whole else "x"
    body = (["h = x.float()"] if whole else []) + [
        f"blocks = {src}.split(COLS_PER_BLOCK, dim=-1)",
        "sum_sq = torch.zeros(x.shape[0], 1, device=x.device)",
        "for blk in blocks:",
        f"    sum_sq += blk{f}.square().sum(dim=-1, keepdim=True)",
        "inv = torch.rsqrt(sum_sq / x.shape[-1] + eps)",
    ]
    term = (f"weight_blk * (blk{f} * inv).to(torch.bfloat16)" if c["weight"] == "bf16_after"
            else f"(blk{f} * inv * weight_blk.float()).to(torch.bfloat16)")
    if c["write"] == "copy_views":
        body += ["out = torch.empty_like(x)",
                 "for blk, weight_blk, view in zip(blocks, weight.split(COLS_PER_BLOCK), "
                 "out.split(COLS_PER_BLOCK, dim=-1)):",
                 f"    view.copy_({term})", "return out"]
    else:
        body.append(f"return torch.cat([{term} for blk, weight_blk in zip(blocks, "
                    "weight.split(COLS_PER_BLOCK))], dim=-1)")
    return Core(NAME, PARAMS, tuple(body),
                f"The program walks each row in blocks of {c['cols']} columns twice: once to "
                f"accumulate the sum of squares, once to scale and weight each block "
                f"({'copied into views of a preallocated output' if c['write'] == 'copy_views' else 'concatenated'}).",
                constants=(f"COLS_PER_BLOCK = {c['cols']}",))


SPACE = TaskSpace(
    task="rms_norm",
    lead="RMSNorm of a bf16 (M, N) matrix with a bf16 weight: weight * x / sqrt(mean(x^2) + eps), "
         "returned in bf16.",
    call=CALL,
    blocks=(128, 512, 2048),
    chunks=(2, 4, 8, 32),
    compositions=(
        Composition("fused_rms_norm", {"path": ("upcast_all", "upcast_weight_after", "native", "native_weight_after"),
                                       "shape": tuple(SHAPES), "downcast": DOWNCASTS, "prep": PREPS},
                    _fused, valid=lambda c: c["path"].startswith("upcast") or c["downcast"] == "to_bf16"),
        Composition("llama_rms_norm", {"square": ("pow", "square", "mul"), "reduce": ("mean", "sum_div"),
                                       "normalise": tuple(NORMALISE), "weight": tuple(WEIGHTS),
                                       "upcast": ("float", "to_float32")}, _hf),
        Composition("norm_based_rms", {"norm": ("linalg", "method", "torch_norm"), "formula": ("rsqrt", "div"),
                                       "weight": tuple(WEIGHTS), "upcast": ("float", "to_float32")}, _norm),
        Composition("dot_product_rms", {"dot": ("einsum", "matmul", "vecdot"),
                                        "normalise": ("rsqrt_mul", "div_sqrt"), "weight": tuple(WEIGHTS),
                                        "upcast": ("float", "to_float32")}, _dot),
        Composition("stats_then_mixed_apply", {"stats": ("pow_mean", "square_mean", "vector_norm"),
                                               "inv": ("rsqrt", "reciprocal_sqrt"),
                                               "apply": ("cast_then_weight", "cast_then_weight_inplace",
                                                         "weight_fp32")}, _mixed_apply),
        Composition("column_block_rms", {"cols": (256, 512, 1024, 2048), "write": ("copy_views", "cat"),
                                         "weight": ("bf16_after", "fp32_before"), "upcast": ("whole", "per_block")},
                    _columns, compilable=False),
    ),
)
