"""causal_attention programs: softmax(q k^T / sqrt(D), causal) v for bf16 (B, H, S, D) tensors.

Compositions: F.scaled_dot_product_attention with is_causal=True (backend left to PyTorch or
pinned with sdpa_kernel, bf16, fp32 copies or autocast, a (B, S, H, D) layout round trip), SDPA
with an explicit causal mask (no flash kernel then), the explicit math with its spellings
(matmul, einsum, bmm; mask by masked_fill, where or an additive mask; fp32 or native bf16
softmax), baddbmm with an additive mask, a Python loop over query blocks, a flash-attention-
style double loop with running max and sum in fp32, and a loop over (batch, head) pairs.
Backends that may be missing on a device (efficient, cuDNN) are pinned with a fallback listed,
so a program never ends up without a kernel; fp32 inputs never pin the flash kernel (bf16/fp16
only).
"""

from __future__ import annotations

from pipelines.generation.styles.pytorch_compositions.compose import (
    Call,
    Composition,
    Core,
    TaskSpace,
)

CALL = Call(unpack="q, k, v = data", args=("q", "k", "v"), split=("q", "k", "v"), dim=1,
            outputs=(("out", "torch.empty_like(q)"),), unit="heads")
NAME = "attention"
PARAMS = ("q", "k", "v")

# backend knob -> (sdpa_kernel arguments or None, words)
BACKENDS = {
    "auto": (None, "the backend PyTorch picks"),
    "flash": ("[SDPBackend.FLASH_ATTENTION]", "the flash kernel pinned"),
    "efficient": ("[SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]",
                  "the memory-efficient kernel pinned (math as the fallback)"),
    "cudnn": ("[SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION], set_priority=True",
              "cuDNN attention preferred, flash as the fallback"),
    "math": ("[SDPBackend.MATH]", "the math (unfused) backend pinned"),
}
SCALES = {"default": "", "pow": ", scale=q.shape[-1] ** -0.5", "math": ", scale=1.0 / math.sqrt(q.shape[-1])"}


def _with_backend(backend: str, lines: list[str]) -> list[str]:
    args = BACKENDS[backend][0]
    if args is None:
        return lines
    return [f"with sdpa_kernel({args}):", *("    " + line for line in lines)]


def _sdpa_causal(c: dict) -> Core:
    scale = SCALES[c["scale"]]
    body: list[str] = []
    names = "q, k, v"
    if c["layout"] == "contiguous":
        body.append("q, k, v = q.contiguous(), k.contiguous(), v.contiguous()")
    elif c["layout"] == "bshd":
        body += ["# (B, S, H, D) storage, as a model's projections produce it, viewed back as (B, H, S, D)",
                 "q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))"]
    if c["dtype"] == "bf16":
        call = [f"o = F.scaled_dot_product_attention({names}, is_causal=True{scale})"]
        ret = "return o"
        how = "on the bf16 tensors"
    elif c["dtype"] == "fp32":
        call = [f"o = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True{scale})"]
        ret = "return o.to(torch.bfloat16)"
        how = "on fp32 copies (no flash kernel for fp32), rounded back to bf16"
    else:
        call = [f"o = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True{scale})"]
        call = ["with torch.autocast(device_type=q.device.type, dtype=torch.bfloat16):",
                "    " + call[0]]
        ret = "return o.to(torch.bfloat16)"
        how = "on fp32 copies under torch.autocast(bfloat16), which casts them back for the kernel"
    body += _with_backend(c["backend"], call) + [ret]
    layout = {"plain": "", "contiguous": " The inputs are made contiguous first.",
              "bshd": " The inputs are first copied to (B, S, H, D) storage and viewed back, as in "
                      "model code that projects to (B, S, H, D) and transposes."}[c["layout"]]
    return Core(NAME, PARAMS, tuple(body),
                f"The program calls F.scaled_dot_product_attention(is_causal=True) {how}, with "
                f"{BACKENDS[c['backend']][1]}{' and an explicit scale' if scale else ''}.{layout}")


MASKS = {
    "bool_tril": ("torch.ones(S, S, dtype=torch.bool, device=q.device).tril()", "a boolean lower-triangular mask"),
    "additive": ('torch.full((S, S), float("-inf"), dtype=q.dtype, device=q.device).triu(1)',
                 "an additive -inf mask"),
    "arange": ("torch.arange(S, device=q.device)[None, :] <= torch.arange(S, device=q.device)[:, None]",
               "a boolean mask from two aranges"),
}


def _mask_source(kind: str, cache: str) -> tuple[list[str], tuple[str, ...], tuple[str, ...]]:
    """Lines that bind `mask` for sequence length S, and the constants and helpers they use."""
    expr = MASKS[kind][0]
    if cache == "per_call":
        return [f"mask = {expr}"], (), ()
    helper = ("def _causal_mask(S, q):\n"
              "    key = (S, q.device, q.dtype)\n"
              "    if key not in _masks:\n"
              f"        _masks[key] = {expr}\n"
              "    return _masks[key]")
    return ["mask = _causal_mask(S, q)"], ("_masks = {}  # (S, device, dtype) -> causal mask",), (helper,)


def _sdpa_mask(c: dict) -> Core:
    lines, consts, helpers = _mask_source(c["mask"], c["cache"])
    scale = SCALES["pow"] if c["scale"] == "explicit" else ""
    body = ["S = q.shape[-2]", *lines]
    body += _with_backend(c["backend"], [f"o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask{scale})"])
    body.append("return o")
    return Core(NAME, PARAMS, tuple(body),
                f"The program passes {MASKS[c['mask']][1]} "
                f"({'built on every call' if c['cache'] == 'per_call' else 'cached per length'}) to "
                f"F.scaled_dot_product_attention instead of is_causal, with {BACKENDS[c['backend']][1]}; "
                f"a masked call cannot use the flash kernel.",
                constants=consts, helpers=helpers)


def _explicit(c: dict) -> Core:
    body = ["S, D = q.shape[-2], q.shape[-1]"]
    qq = "q"
    if c["scale"] == "q_prescaled":
        body.append("q = q * D ** -0.5  # scale folded into q (bf16)")
    kt = "k.transpose(-2, -1)"
    if c["scores"] == "matmul":
        s = f"torch.matmul({qq}, {kt})"
    elif c["scores"] == "einsum":
        s = f'torch.einsum("bhqd,bhkd->bhqk", {qq}, k)'
    else:
        s = f"torch.bmm({qq}.reshape(-1, S, D), k.reshape(-1, S, D).transpose(1, 2)).view(q.shape[:-1] + (S,))"
    if c["scale"] == "fp32_after":
        body.append(f"scores = {s}.float() * D ** -0.5  # (B, H, S, S) fp32")
    elif c["scale"] == "div_sqrt":
        body.append(f"scores = {s}.float() / math.sqrt(D)")
    else:
        body.append(f"scores = {s}  # (B, H, S, S) bf16")
    if c["mask"] == "masked_fill":
        body += ["future = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1)",
                 'scores = scores.masked_fill(future, float("-inf"))']
    elif c["mask"] == "masked_fill_inplace":
        body += ["future = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1)",
                 'scores.masked_fill_(future, float("-inf"))']
    elif c["mask"] == "where":
        body += ["past = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()",
                 'scores = torch.where(past, scores, float("-inf"))']
    else:
        body += ['bias = torch.full((S, S), float("-inf"), dtype=scores.dtype, device=q.device).triu(1)',
                 "scores = scores + bias"]
    if c["softmax"] == "fp32":
        body.append("probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)")
    else:
        body.append("probs = torch.softmax(scores, dim=-1)  # bf16 in and out, fp32 inside")
    if c["pv"] == "matmul":
        body.append("return torch.matmul(probs, v)")
    elif c["pv"] == "einsum":
        body.append('return torch.einsum("bhqk,bhkd->bhqd", probs, v)')
    else:
        body.append("return torch.bmm(probs.reshape(-1, S, S), v.reshape(-1, S, D)).view(q.shape)")
    scale_words = {"fp32_after": "scaled in fp32", "div_sqrt": "divided by sqrt(D) in fp32",
                   "q_prescaled": "with the scale folded into q beforehand"}[c["scale"]]
    mask_words = {"masked_fill": "masked_fill", "masked_fill_inplace": "in-place masked_fill_",
                  "where": "torch.where", "additive": "an additive -inf matrix"}[c["mask"]]
    return Core(NAME, PARAMS, tuple(body),
                f"Explicit attention: the program materialises the (S, S) scores with {c['scores']} "
                f"({scale_words}), masks the future with {mask_words}, takes the softmax "
                f"{'in fp32' if c['softmax'] == 'fp32' else 'natively on the bf16 scores'} and multiplies "
                f"the bf16 probabilities by v ({c['pv']}).")


def _valid_explicit(c: dict) -> bool:
    # a bf16 softmax only on the bf16 scores the matmul gave (rounding scaled fp32 scores to
    # bf16 again would move the logits by up to 0.4%)
    return c["softmax"] == "fp32" or c["scale"] == "q_prescaled"


def _baddbmm(c: dict) -> Core:
    lines, consts, helpers = _mask_source("additive", c["cache"])
    body = ["B, H, S, D = q.shape", *lines,
            "scores = torch.baddbmm(mask.expand(B * H, S, S), q.reshape(B * H, S, D),",
            "                       k.reshape(B * H, S, D).transpose(1, 2), alpha=D ** -0.5)"]
    if c["softmax"] == "fp32":
        body.append("probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)")
    else:
        body.append("probs = torch.softmax(scores, dim=-1)")
    if c["pv"] == "bmm":
        body.append("return torch.bmm(probs, v.reshape(B * H, S, D)).view(B, H, S, D)")
    else:
        body.append("return torch.matmul(probs.view(B, H, S, S), v)")
    return Core(NAME, PARAMS, tuple(body),
                f"The program adds the additive causal mask and the scaled scores in one torch.baddbmm "
                f"over the flattened (batch * head) axis, takes the softmax "
                f"{'in fp32' if c['softmax'] == 'fp32' else 'in bf16'} and multiplies by v "
                f"({c['pv']}); the mask is {'built on every call' if c['cache'] == 'per_call' else 'cached per length'}.",
                constants=consts, helpers=helpers)


def _query_blocks(c: dict) -> Core:
    body = ["S = q.shape[-2]"]
    if c["write"] == "slice_assign":
        body.append("out = torch.empty_like(q)")
    else:
        body.append("pieces = []")
    body += ["for start in range(0, S, QUERIES_PER_BLOCK):",
             "    stop = min(start + QUERIES_PER_BLOCK, S)",
             "    # query i of this block sees keys 0..i: the keys up to `stop`, the diagonal block masked",
             "    allowed = torch.arange(stop, device=q.device)[None, :] <= torch.arange(start, stop, device=q.device)[:, None]"]
    if c["inner"] == "sdpa":
        body.append("    o = F.scaled_dot_product_attention(q[:, :, start:stop], k[:, :, :stop], v[:, :, :stop], "
                    "attn_mask=allowed)")
    else:
        body += ["    scores = (q[:, :, start:stop] @ k[:, :, :stop].transpose(-2, -1)).float() * q.shape[-1] ** -0.5",
                 '    scores = scores.masked_fill(~allowed, float("-inf"))',
                 "    o = torch.softmax(scores, dim=-1).to(v.dtype) @ v[:, :, :stop]"]
    if c["write"] == "slice_assign":
        body += ["    out[:, :, start:stop] = o", "return out"]
    else:
        body += ["    pieces.append(o)", "return torch.cat(pieces, dim=2)"]
    return Core(NAME, PARAMS, tuple(body),
                f"The program loops over blocks of {c['queries']} queries; each block attends to the keys "
                f"up to its end ({'SDPA with a mask' if c['inner'] == 'sdpa' else 'explicit fp32 softmax'}), "
                f"so the masked upper triangle beyond the block is never computed.",
                constants=(f"QUERIES_PER_BLOCK = {c['queries']}",))


def _flash(c: dict) -> Core:
    fp32_in = c["upcast"] == "inputs_fp32"
    body = ["B, H, S, D = q.shape", "scale = D ** -0.5"]
    if fp32_in:
        body.append("qf, kf, vf = q.float(), k.float(), v.float()")
    qn, kn, vn = ("qf", "kf", "vf") if fp32_in else ("q", "k", "v")
    body += ["out = torch.empty_like(q)",
             "for qs in range(0, S, BLOCK):",
             "    qe = min(qs + BLOCK, S)",
             f"    q_blk = {qn}[:, :, qs:qe]",
             '    m = torch.full((B, H, qe - qs, 1), float("-inf"), device=q.device)  # running max',
             "    l = torch.zeros(B, H, qe - qs, 1, device=q.device)  # running sum",
             "    acc = torch.zeros(B, H, qe - qs, D, device=q.device)",
             "    for ks in range(0, qe, BLOCK):  # key blocks up to the diagonal",
             "        ke = min(ks + BLOCK, S)",
             (f"        s = q_blk @ {kn}[:, :, ks:ke].transpose(-2, -1) * scale" if fp32_in else
              f"        s = (q_blk @ {kn}[:, :, ks:ke].transpose(-2, -1)).float() * scale"),
             "        if ke > qs:  # the diagonal block: hide keys after each query",
             "            rows = torch.arange(qs, qe, device=q.device)[:, None]",
             "            cols = torch.arange(ks, ke, device=q.device)[None, :]",
             '            s = s.masked_fill(cols > rows, float("-inf"))',
             "        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))",
             "        p = torch.exp(s - m_new)",
             "        alpha = torch.exp(m - m_new)",
             "        l = l * alpha + p.sum(dim=-1, keepdim=True)"]
    if c["pv"] == "bf16":
        body.append("        acc = acc * alpha + (p.to(v.dtype) @ v[:, :, ks:ke]).float()")
    elif fp32_in:
        body.append(f"        acc = acc * alpha + p @ {vn}[:, :, ks:ke]")
    else:
        body.append("        acc = acc * alpha + p @ v[:, :, ks:ke].float()")
    body += ["        m = m_new",
             "    out[:, :, qs:qe] = (acc / l).to(out.dtype)",
             "return out"]
    return Core(NAME, PARAMS, tuple(body),
                f"Flash attention in Python: for each block of {c['block_size']} queries the program walks the "
                f"key blocks up to the diagonal, keeping a running max, a running sum and an fp32 "
                f"accumulator ({'fp32 inputs' if fp32_in else 'bf16 score GEMMs upcast to fp32'}, "
                f"{'bf16' if c['pv'] == 'bf16' else 'fp32'} probabilities times v), and normalises once at the end.",
                constants=(f"BLOCK = {c['block_size']}",))


def _valid_flash(c: dict) -> bool:
    return not (c["upcast"] == "inputs_fp32" and c["pv"] == "bf16")


def _per_head(c: dict) -> Core:
    body = ["B, H, S, D = q.shape"]
    if c["write"] == "slice_assign":
        body.append("out = torch.empty_like(q)")
    else:
        body.append("heads = []")
    body += ["for b in range(B):", "    for h in range(H):"]
    if c["inner"] == "sdpa":
        body.append("        o = F.scaled_dot_product_attention(q[b, h], k[b, h], v[b, h], is_causal=True)")
    else:
        body += ["        scores = (q[b, h] @ k[b, h].T).float() * D ** -0.5  # (S, S)",
                 "        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float('-inf'))"
                 if c["mask"] == "triu" else
                 "        scores = torch.where(torch.ones_like(scores, dtype=torch.bool).tril(), scores, float('-inf'))",
                 "        o = scores.softmax(dim=-1).to(v.dtype) @ v[b, h]"]
    if c["write"] == "slice_assign":
        body += ["        out[b, h] = o", "return out"]
    else:
        body += ["        heads.append(o)", "return torch.stack(heads).view(B, H, S, D)"]
    return Core(NAME, PARAMS, tuple(body),
                f"The program loops over every (batch, head) pair in Python and attends on 2-D (S, D) "
                f"matrices ({'SDPA with is_causal' if c['inner'] == 'sdpa' else 'explicit fp32 softmax'}), "
                f"{'writing into a preallocated output' if c['write'] == 'slice_assign' else 'stacking the results'}.")


SPACE = TaskSpace(
    task="causal_attention",
    lead="Causal self-attention forward: softmax(q k^T / sqrt(D) with future keys masked) v for bf16 "
         "(B, H, S, D) tensors, returned in bf16.",
    call=CALL,
    blocks=(1, 4, 8),
    chunks=(2, 4, 8),
    compositions=(
        Composition("sdpa_is_causal", {"backend": tuple(BACKENDS), "scale": tuple(SCALES),
                                       "layout": ("plain", "contiguous", "bshd"),
                                       "dtype": ("bf16", "fp32", "autocast")},
                    _sdpa_causal, valid=lambda c: c["dtype"] != "fp32" or c["backend"] in ("auto", "efficient", "math")),
        Composition("sdpa_explicit_mask", {"mask": tuple(MASKS), "cache": ("per_call", "cached"),
                                           "backend": ("auto", "efficient", "math"),
                                           "scale": ("default", "explicit")}, _sdpa_mask),
        Composition("explicit_attention", {"scores": ("matmul", "einsum", "bmm"),
                                           "scale": ("fp32_after", "div_sqrt", "q_prescaled"),
                                           "mask": ("masked_fill", "masked_fill_inplace", "where", "additive"),
                                           "softmax": ("fp32", "native_bf16"), "pv": ("matmul", "einsum", "bmm")},
                    _explicit, valid=_valid_explicit),
        Composition("baddbmm_additive_mask", {"softmax": ("fp32", "native_bf16"), "pv": ("bmm", "matmul"),
                                              "cache": ("per_call", "cached")}, _baddbmm),
        Composition("query_block_loop", {"queries": (32, 128, 256, 512), "inner": ("sdpa", "explicit"),
                                         "write": ("slice_assign", "cat")},
                    _query_blocks, compilable=False),
        Composition("python_flash_attention", {"block_size": (32, 64, 128, 256),
                                               "upcast": ("scores_fp32", "inputs_fp32"), "pv": ("bf16", "fp32")},
                    _flash, drivers=False, compilable=False, valid=_valid_flash),
        Composition("per_head_loop", {"inner": ("sdpa", "explicit"), "mask": ("triu", "tril_where"),
                                      "write": ("slice_assign", "stack")},
                    _per_head, drivers=False, compilable=False,
                    valid=lambda c: c["inner"] == "explicit" or c["mask"] == "triu"),
    ),
)
