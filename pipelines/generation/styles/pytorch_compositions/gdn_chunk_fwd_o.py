"""gdn_chunk_fwd_o programs: the output stage of chunked Gated DeltaNet (chunks of 64 tokens).

For token i of chunk n: o[i] = scale * (exp(g[i]) q[i] @ h[n] + sum_{j <= i in the chunk}
(q[i] . k[j]) exp(g[i] - g[j]) v[j]). Compositions: einsums on token-major chunk views (as the
reference), batched matmuls on head-major chunk views, a Python loop over chunks (the partial
last chunk handled by its length, no padding), and a Python loop over heads. Gates: the decay
matrix masked before exp, exp then a triangular mask, or exp(g) folded into q and exp(-g) into k
(the factorised form older chunked kernels use; within a 64-token chunk exp(-g) stays below
e^7 for the task's gates). The inter-chunk and score GEMMs may run on bf16 operands (tensor
cores) when the scale is applied in fp32 afterwards and the gates are not folded into q and k;
the probabilities-times-v GEMM is always fp32: its bf16 output (|intra| up to ~4, one bf16 step
0.016) next to an inter term of opposite sign would put outputs near zero at half the 3e-2
tolerance.
"""

from __future__ import annotations

from pipelines.generation.styles.pytorch_compositions.compose import (
    Call,
    Composition,
    Core,
    TaskSpace,
)

CALL = Call(unpack="q, k, v, h, g, scale = data", args=("q", "k", "v", "h", "g", "scale"),
            split=("q", "k", "v", "h", "g"), dim=2, outputs=(("o", "torch.empty_like(v)"),),
            unit="heads")
NAME = "chunk_output"
PARAMS = ("q", "k", "v", "h", "g", "scale")
CHUNK = "CHUNK = 64  # tokens per chunk: h holds the state at the start of each"
GATES = ("masked_exp", "exp_then_mask", "factorized")
MASKS = ("tril", "masked_fill", "where")
GATE_WORDS = {"masked_exp": "the decay exp(g_i - g_j) masked to -inf above the diagonal before exp",
              "exp_then_mask": "exp(g_i - g_j) taken whole and the upper triangle zeroed after",
              "factorized": "exp(g) folded into q and exp(-g) into k (a factorised decay)"}


def _mask(kind: str, a: str, causal: str) -> str:
    return {"tril": f"({a}).tril()", "masked_fill": f"({a}).masked_fill(~{causal}, 0.0)",
            "where": f"torch.where({causal}, {a}, 0.0)"}[kind]


def _gated_lines(c: dict, g: str, scores: str, causal: str, indent: str = "") -> list[str]:
    """Lines binding `a`, the gated causal score matrix, from fp32 `scores` and log-gates `g` (..., L)."""
    if c["gate"] == "masked_exp":
        lines = [f'decay = torch.where({causal}, {g}[..., :, None] - {g}[..., None, :], float("-inf")).exp()',
                 f"a = {scores} * decay"]
    elif c["gate"] == "exp_then_mask":
        lines = [f"decay = ({g}[..., :, None] - {g}[..., None, :]).exp()",
                 f"a = {_mask(c['mask'], f'{scores} * decay', causal)}"]
    else:
        lines = [f"a = {_mask(c['mask'], scores, causal)}"]
    return [indent + line for line in lines]


def _valid(c: dict) -> bool:
    # the mask knob only matters when the mask is applied after exp
    if c["gate"] == "masked_exp" and c["mask"] != "tril":
        return False
    # bf16 GEMM operands only with the plain gates and the scale applied in fp32 at the end: on
    # K = 128, T = 1000 a bf16 q * scale reached 0.40 of the tolerance and bf16 exp(+-g)-scaled
    # operands 0.65, where fp32 scaling stayed at 0.30
    return c["precision"] == "fp32" or (c["gate"] != "factorized" and c["scale_at"] == "output")


def _operands(c: dict, q: str, k: str, g: str, gexp: str, neg_gexp: str) -> tuple[list[str], str, str]:
    """Lines preparing the GEMM operands of q and k; the names to use for them."""
    bf16 = c["precision"] == "bf16_gemm"
    if c["gate"] == "factorized":
        lines = [f"qg = {q} * {gexp}", f"kg = {k} * {neg_gexp}"]
        if bf16:
            lines = [f"qg = ({q} * {gexp}).to(torch.bfloat16)", f"kg = ({k} * {neg_gexp}).to(torch.bfloat16)"]
        return lines, "qg", "kg"
    return [], q, k


def _padded_einsum(c: dict) -> Core:
    bf16 = c["precision"] == "bf16_gemm"
    up = "" if bf16 else ".float()"
    helper = ("def _chunks(x, nt):\n"
              "    # (B, T, H, D) -> (B, NT, 64, H, D), the last chunk zero-padded\n"
              "    B, T, H, D = x.shape\n")
    if c["pad"] == "F_pad":
        helper += (f"    x = F.pad(x{up}, (0, 0, 0, 0, 0, nt * CHUNK - T))\n"
                   "    return x.reshape(B, nt, CHUNK, H, D)")
    else:
        helper += (f"    out = x.new_zeros(B, nt * CHUNK, H, D{'' if bf16 else ', dtype=torch.float32'})\n"
                   "    out[:, :T] = x\n"
                   "    return out.view(B, nt, CHUNK, H, D)")
    q_scaled = c["scale_at"] == "q"
    body = ["B, T, H, _ = q.shape", "NT = h.shape[1]",
            "qc = _chunks(q, NT)" + (" * scale" if q_scaled else ""),
            "kc, vc = _chunks(k, NT), _chunks(v, NT)",
            "gc = F.pad(g, (0, 0, 0, NT * CHUNK - T)).reshape(B, NT, CHUNK, H).permute(0, 1, 3, 2)  # (B, NT, H, 64)",
            "causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()"]
    gexp = "gc.exp().permute(0, 1, 3, 2)[..., None]"
    ops, qn, kn = _operands(c, "qc", "kc", "gc", gexp, "(-gc).exp().permute(0, 1, 3, 2)[..., None]")
    body += ops
    hh = "h" if bf16 else "h.float()"
    inter = f'torch.einsum("bnchk,bnhkv->bnchv", {qn}, {hh})' + (".float()" if bf16 else "")
    if c["gate"] != "factorized":
        inter += f" * {gexp}"
    body.append(f"inter = {inter}  # (B, NT, 64, H, V)")
    body.append(f'scores = torch.einsum("bnihk,bnjhk->bnhij", {qn}, {kn})' + (".float()" if bf16 else ""))
    body += _gated_lines(c, "gc", "scores", "causal")
    vv = "vc.float()" if bf16 else "vc"
    body.append(f'intra = torch.einsum("bnhij,bnjhv->bnihv", a, {vv})')
    o = "(inter + intra)" if q_scaled else "((inter + intra) * scale)"
    body.append(f"o = {o}.reshape(B, NT * CHUNK, H, -1)[:, :T]")
    body.append("return o.to(torch.bfloat16)")
    return Core(NAME, PARAMS, tuple(body),
                f"The program pads the tokens to whole chunks ({'F.pad' if c['pad'] == 'F_pad' else 'a zeroed buffer'}) "
                f"and works on token-major (B, NT, 64, H, D) views with einsums: the inter-chunk term "
                f"q @ h[n] and the intra-chunk scores with {GATE_WORDS[c['gate']]}. "
                f"{_precision_words(c)} The scale goes {'on q' if q_scaled else 'on the sum'}.",
                constants=(CHUNK,), helpers=(helper,))


def _precision_words(c: dict) -> str:
    if c["precision"] == "bf16_gemm":
        return ("The inter-chunk and score GEMMs take bf16 operands; gates and the probabilities-"
                "times-v GEMM are fp32.")
    return "Everything is upcast to fp32."


def _head_major(c: dict) -> Core:
    bf16 = c["precision"] == "bf16_gemm"
    up = "" if bf16 else ".float()"
    body = ["B, T, H, _ = q.shape", "NT = h.shape[1]", "pad = NT * CHUNK - T",
            "",
            "def chunks(x):  # (B, T, H, D) -> (B, H, NT, 64, D)",
            f"    x = F.pad(x.transpose(1, 2){up}, (0, 0, 0, pad))",
            "    return x.reshape(B, H, NT, CHUNK, x.shape[-1])",
            "",
            "qc, kc, vc = chunks(q), chunks(k), chunks(v)" if c["scale_at"] != "q" else
            "qc, kc, vc = chunks(q) * scale, chunks(k), chunks(v)",
            "gc = F.pad(g.transpose(1, 2), (0, pad)).reshape(B, H, NT, CHUNK)  # (B, H, NT, 64)",
            f"hc = h.transpose(1, 2){up}  # (B, H, NT, K, V)"]
    ops, qn, kn = _operands(c, "qc", "kc", "gc", "gc.exp()[..., None]", "(-gc).exp()[..., None]")
    body += ops
    inter = f"({qn} @ hc)" + (".float()" if bf16 else "")
    if c["gate"] != "factorized":
        inter += " * gc.exp()[..., None]"
    body.append(f"inter = {inter}")
    body.append(f"scores = ({qn} @ {kn}.transpose(-1, -2))" + (".float()" if bf16 else "") + "  # (B, H, NT, 64, 64)")
    if c["gate"] != "factorized" or c["mask"] != "tril":
        body.append("causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()")
    body += _gated_lines(c, "gc", "scores", "causal")
    vv = "vc.float()" if bf16 else "vc"
    if c["combine"] == "add":
        body.append(f"o = inter + a @ {vv}")
    elif c["combine"] == "add_inplace":
        body.append(f"o = inter.add_(a @ {vv})")
    else:
        body.append(f"o = torch.baddbmm(inter.reshape(-1, CHUNK, inter.shape[-1]), a.reshape(-1, CHUNK, CHUNK),"
                    f" {vv}.reshape(-1, CHUNK, {vv}.shape[-1]))")
    if c["scale_at"] != "q":
        body.append("o = o * scale")
    body.append("o = o.reshape(B, H, NT * CHUNK, -1)[:, :, :T].transpose(1, 2)  # (B, T, H, V)")
    body.append("return o.to(torch.bfloat16).contiguous()")
    combine = {"add": "added", "add_inplace": "added in place", "baddbmm": "fused with torch.baddbmm"}[c["combine"]]
    return Core(NAME, PARAMS, tuple(body),
                f"The program transposes to head-major (B, H, NT, 64, D) chunk views and uses batched "
                f"matmuls: q @ h[n] for the inter-chunk term, the intra-chunk scores with "
                f"{GATE_WORDS[c['gate']]}, their product with v {combine}. {_precision_words(c)}",
                constants=(CHUNK,))


def _chunk_loop(c: dict) -> Core:
    bf16 = c["precision"] == "bf16_gemm"
    up = "" if bf16 else ".float()"
    q_scaled = c["scale_at"] == "q"
    body = ["B, T, H, _ = q.shape",
            "o = torch.empty_like(v)" if c["write"] == "slice_assign" else "pieces = []",
            "for n in range(h.shape[1]):",
            "    t0, t1 = n * CHUNK, min((n + 1) * CHUNK, T)",
            "    L = t1 - t0  # the last chunk may be shorter",
            f"    qn = q[:, t0:t1]{up}" + (" * scale" if q_scaled else "") + "  # (B, L, H, K)",
            f"    kn, vn = k[:, t0:t1]{up}, v[:, t0:t1].float()",
            "    gn = g[:, t0:t1].transpose(1, 2)  # (B, H, L)"]
    if c["gate"] != "factorized" or c["mask"] != "tril":
        body.append("    causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()")
    gexp = "gn.exp().transpose(1, 2)[..., None]"
    ops, qq, kk = _operands(c, "qn", "kn", "gn", gexp, "(-gn).exp().transpose(1, 2)[..., None]")
    body += ["    " + line for line in ops]
    inter = f'torch.einsum("blhk,bhkv->blhv", {qq}, h[:, n]{up})' + (".float()" if bf16 else "")
    if c["gate"] != "factorized":
        inter += f" * {gexp}"
    body.append(f"    inter = {inter}")
    body.append(f'    scores = torch.einsum("bihk,bjhk->bhij", {qq}, {kk})' + (".float()" if bf16 else ""))
    body += _gated_lines(c, "gn", "scores", "causal", indent="    ")
    body.append('    out = inter + torch.einsum("bhij,bjhv->bihv", a, vn)')
    if not q_scaled:
        body.append("    out = out * scale")
    if c["write"] == "slice_assign":
        body += ["    o[:, t0:t1] = out", "return o"]
    else:
        body += ["    pieces.append(out.to(torch.bfloat16))", "return torch.cat(pieces, dim=1)"]
    return Core(NAME, PARAMS, tuple(body),
                f"The program loops over the chunks in Python (the last one as long as it is, no "
                f"padding), with einsums per chunk: q @ h[n] and the intra-chunk scores with "
                f"{GATE_WORDS[c['gate']]}. {_precision_words(c)} Results are "
                f"{'written into a preallocated output' if c['write'] == 'slice_assign' else 'concatenated'}.",
                constants=(CHUNK,))


def _head_loop(c: dict) -> Core:
    bf16 = c["precision"] == "bf16_gemm"
    up = "" if bf16 else ".float()"
    body = ["B, T, H, _ = q.shape", "NT = h.shape[1]", "pad = NT * CHUNK - T",
            "causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()",
            "o = torch.empty_like(v)",
            "for i in range(H):",
            f"    qi = F.pad(q[:, :, i]{up}, (0, 0, 0, pad)).reshape(B, NT, CHUNK, -1)"
            + (" * scale" if c["scale_at"] == "q" else ""),
            f"    ki = F.pad(k[:, :, i]{up}, (0, 0, 0, pad)).reshape(B, NT, CHUNK, -1)",
            "    vi = F.pad(v[:, :, i].float(), (0, 0, 0, pad)).reshape(B, NT, CHUNK, -1)",
            "    gi = F.pad(g[:, :, i], (0, pad)).reshape(B, NT, CHUNK)"]
    ops, qq, kk = _operands(c, "qi", "ki", "gi", "gi.exp()[..., None]", "(-gi).exp()[..., None]")
    body += ["    " + line for line in ops]
    inter = f"({qq} @ h[:, :, i]{up})" + (".float()" if bf16 else "")
    if c["gate"] != "factorized":
        inter += " * gi.exp()[..., None]"
    body.append(f"    inter = {inter}")
    body.append(f"    scores = ({qq} @ {kk}.transpose(-1, -2))" + (".float()" if bf16 else ""))
    body += _gated_lines(c, "gi", "scores", "causal", indent="    ")
    body += ["    out = inter + a @ vi  # (B, NT, 64, V)" if c["scale_at"] == "q" else
             "    out = (inter + a @ vi) * scale  # (B, NT, 64, V)",
             "    o[:, :, i] = out.reshape(B, NT * CHUNK, -1)[:, :T]",
             "return o"]
    return Core(NAME, PARAMS, tuple(body),
                f"The program loops over the heads in Python; per head it pads to whole chunks and uses "
                f"batched matmuls on (B, NT, 64, D) views, the intra-chunk scores with "
                f"{GATE_WORDS[c['gate']]}. {_precision_words(c)}",
                constants=(CHUNK,))


SPACE = TaskSpace(
    task="gdn_chunk_fwd_o",
    lead="Gated DeltaNet chunked output (chunks of 64 tokens): the inter-chunk term q @ h[n] plus the "
         "causal, gated intra-chunk attention, for bf16 q, k, v, h and fp32 cumulated log-gates g, "
         "returned in bf16 (B, T, H, V).",
    call=CALL,
    blocks=(1, 4, 8),
    chunks=(2, 4),
    compositions=(
        Composition("padded_chunk_einsum", {"gate": GATES, "mask": MASKS, "pad": ("F_pad", "new_zeros"),
                                            "scale_at": ("q", "output"), "precision": ("fp32", "bf16_gemm")},
                    _padded_einsum, valid=_valid),
        Composition("head_major_matmul", {"gate": GATES, "mask": MASKS, "combine": ("add", "add_inplace", "baddbmm"),
                                          "scale_at": ("q", "output"), "precision": ("fp32", "bf16_gemm")},
                    _head_major, valid=_valid),
        Composition("chunk_loop", {"gate": GATES, "mask": MASKS, "write": ("slice_assign", "cat"),
                                   "scale_at": ("q", "output"), "precision": ("fp32", "bf16_gemm")},
                    _chunk_loop, valid=_valid, compilable=False),
        Composition("head_loop", {"gate": GATES, "mask": MASKS, "scale_at": ("q", "output"),
                                  "precision": ("fp32", "bf16_gemm")},
                    _head_loop, valid=_valid, drivers=False, compilable=False),
    ),
)
