"""cross_entropy programs: per-row loss (fp32) and the gradient softmax - onehot (bf16).

Compositions: autograd through F.cross_entropy (or nll_loss of log_softmax) on an fp32 leaf,
log_softmax with the target's entry picked out, softmax then log of the picked probability,
logsumexp written out, native bf16 softmax for the gradient, and a loop over vocabulary blocks
with the logsumexp combined across blocks. The target's -1 goes in by indexed subtraction,
scatter_add_, index_put_ or a dense one_hot. Losses are never rounded through bf16 before the
subtraction that forms them (a bf16 logsumexp minus a logit loses up to 0.06 nat, the task's
tolerance at a loss of 5).
"""

from __future__ import annotations

from pipelines.generation.styles.pytorch_compositions import fragments as fr
from pipelines.generation.styles.pytorch_compositions.compose import (
    Call,
    Composition,
    Core,
    TaskSpace,
)

CALL = Call(
    unpack="logits, targets = data", args=("logits", "targets"), split=("logits", "targets"), dim=0,
    outputs=(("loss", "torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)"),
             ("grad", "torch.empty_like(logits)")),
    unit="rows",
)
NAME = "cross_entropy_rows"
PARAMS = ("logits", "targets")
GRAD_CASTS = ("to_bf16", "bfloat16", "type_as")

# picking the target's entry of a (B, V) tensor `{t}` as a (B,) tensor
PICKS = {
    "gather": "{t}.gather(1, targets.unsqueeze(1)).squeeze(1)",
    "index": "{t}[rows, targets]",
    "take_along_dim": "torch.take_along_dim({t}, targets[:, None], dim=1).squeeze(1)",
}
# subtracting 1 at the targets of `grad`
ONEHOTS = {
    "index_sub": (["grad[rows, targets] -= 1"], "an indexed subtraction"),
    "scatter_add": (["grad.scatter_add_(1, targets.unsqueeze(1), "
                     "-torch.ones(grad.shape[0], 1, dtype=grad.dtype, device=grad.device))"],
                    "scatter_add_ of -1"),
    "one_hot": (["grad = grad - F.one_hot(targets, grad.shape[-1]).to(grad.dtype)"],
                "a dense F.one_hot subtracted (a (B, V) int64 temporary)"),
    "index_put": (["grad.index_put_((rows, targets), torch.tensor(-1.0, dtype=grad.dtype, "
                   "device=grad.device), accumulate=True)"], "index_put_ with accumulate=True"),
}


def _pick(kind: str, t: str) -> str:
    return PICKS[kind].format(t=t)


def _needs_rows(*kinds: str) -> bool:
    return "index" in kinds or "index_sub" in kinds or "index_put" in kinds


def _rows_line() -> str:
    return "rows = torch.arange(logits.shape[0], device=logits.device)"


def _finish(c: dict, body: list[str]) -> None:
    """Append the target subtraction and the bf16 gradient, before or after the subtraction."""
    sub, _ = ONEHOTS[c["onehot"]]
    if c["cast_at"] == "before_onehot":
        body.append("grad = grad.to(torch.bfloat16)")
        body += sub
        body.append("return loss, grad")
    else:
        body += sub
        body.append("return loss, grad.to(torch.bfloat16)")


def _finish_doc(c: dict) -> str:
    where = "in bf16" if c["cast_at"] == "before_onehot" else "in fp32 before rounding to bf16"
    return f"The target's -1 goes in by {ONEHOTS[c['onehot']][1]} {where}."


def _autograd(c: dict) -> Core:
    leaf = ("logits.float().requires_grad_()" if c["upcast"] == "float"
            else "logits.detach().to(torch.float32).requires_grad_(True)")
    loss = ('F.cross_entropy(xf, targets, reduction="none")' if c["loss_fn"] == "cross_entropy"
            else 'F.nll_loss(F.log_softmax(xf, dim=-1), targets, reduction="none")')
    back = {"autograd_grad": ["    (grad,) = torch.autograd.grad(loss.sum(), xf)"],
            "backward_sum": ["    loss.sum().backward()", "    grad = xf.grad"],
            "backward_ones": ["    loss.backward(torch.ones_like(loss))", "    grad = xf.grad"]}[c["backward"]]
    body = ["with torch.enable_grad():  # the caller may have turned autograd off",
            f"    xf = {leaf}", f"    loss = {loss}", *back,
            f"return loss.detach(), {fr.downcast(c['grad_cast'], 'grad', 'logits')}"]
    how = {"autograd_grad": "torch.autograd.grad", "backward_sum": "loss.sum().backward()",
           "backward_ones": "loss.backward(torch.ones_like(loss))"}[c["backward"]]
    return Core(NAME, PARAMS, tuple(body),
                f"Training-loop style: the program makes an fp32 leaf of the logits, computes the "
                f"per-row loss with {loss.split('(')[0]} and lets autograd produce the gradient "
                f"({how}), rounded to bf16.")


def _log_softmax(c: dict) -> Core:
    body = []
    if c["logp"] == "F":
        body += ["xf = logits.float()", "logp = F.log_softmax(xf, dim=-1)"]
    elif c["logp"] == "torch_dtype":
        body.append("logp = torch.log_softmax(logits, dim=-1, dtype=torch.float32)")
    else:
        body += ["xf = logits.float()", "logp = xf - torch.logsumexp(xf, dim=-1, keepdim=True)"]
    if _needs_rows(c["pick"], c["onehot"]):
        body.append(_rows_line())
    body.append(f"loss = -{_pick(c['pick'], 'logp')}")
    body.append("grad = logp.exp()" if c["grad_exp"] == "exp" else "grad = logp.exp_()  # loss is already a copy")
    _finish(c, body)
    how = {"F": "F.log_softmax", "torch_dtype": "torch.log_softmax(dtype=torch.float32)",
           "lse_sub": "x - logsumexp(x)"}[c["logp"]]
    return Core(NAME, PARAMS, tuple(body),
                f"The program takes fp32 log-probabilities ({how}), picks the target's entry for "
                f"the loss ({c['pick']}) and exponentiates them for the gradient. {_finish_doc(c)}")


def _softmax_log(c: dict) -> Core:
    body = ["xf = logits.float()", f"probs = {fr.softmax_call(c['call'], 'xf')}"]
    if _needs_rows(c["pick"], c["onehot"]):
        body.append(_rows_line())
    body += [f"loss = -torch.log({_pick(c['pick'], 'probs')})", "grad = probs"]
    _finish(c, body)
    return Core(NAME, PARAMS, tuple(body),
                f"The program takes the fp32 softmax ({fr.call_name(c['call'], 'softmax')}), the loss "
                f"as -log of the target's probability and the gradient from the same probabilities. "
                f"{_finish_doc(c)}")


def _manual_lse(c: dict) -> Core:
    body = ["xf = logits.float()", "m = xf.amax(dim=-1, keepdim=True)"]
    body.append("e = torch.exp(xf - m)" if c["exp"] == "exp" else "e = (xf - m).exp_()")
    body += ["s = e.sum(dim=-1, keepdim=True)", "lse = (m + s.log()).squeeze(1)"]
    if _needs_rows(c["pick"], c["onehot"]):
        body.append(_rows_line())
    body.append(f"loss = lse - {_pick(c['pick'], 'xf')}")
    body.append("grad = e / s" if c["normalise"] == "divide" else "grad = e.div_(s)")
    _finish(c, body)
    return Core(NAME, PARAMS, tuple(body),
                f"logsumexp written out in fp32 (max, exp, sum, log): the loss is lse minus the "
                f"target logit and the gradient reuses the exponentials divided by their sum "
                f"({'in place' if c['normalise'] == 'div_inplace' else 'out of place'}). {_finish_doc(c)}")


def _native_bf16(c: dict) -> Core:
    body = []
    if _needs_rows(c["pick"], c["onehot"]):
        body.append(_rows_line())
    if c["loss"] == "lse_fp32":
        body.append(f"loss = torch.logsumexp(logits.float(), dim=-1) - {_pick(c['pick'], 'logits')}.float()")
        loss_words = "the loss from an fp32 logsumexp"
    else:
        body.append('loss = F.cross_entropy(logits, targets, reduction="none").float()')
        loss_words = "the loss from F.cross_entropy on the bf16 logits (upcast at the end)"
    body.append(f"grad = {fr.softmax_call(c['call'], 'logits')}  # bf16 out, fp32 inside")
    body += ONEHOTS[c["onehot"]][0]
    body.append("return loss, grad")
    return Core(NAME, PARAMS, tuple(body),
                f"The program takes the gradient from a native bf16 "
                f"{fr.call_name(c['call'], 'softmax')} (fp32 accumulation inside, one rounding) and "
                f"subtracts the target's 1 in bf16 by {ONEHOTS[c['onehot']][1]}; {loss_words}.")


def _vocab_blocks(c: dict) -> Core:
    body = ["blocks = logits.split(VOCAB_PER_BLOCK, dim=1)"]
    if c["combine"] == "stack":
        body.append("lse = torch.stack([torch.logsumexp(b.float(), dim=-1) for b in blocks], dim=-1).logsumexp(dim=-1)")
    else:
        body += ['lse = torch.full((logits.shape[0],), float("-inf"), device=logits.device)',
                 "for b in blocks:",
                 "    lse = torch.logaddexp(lse, torch.logsumexp(b.float(), dim=-1))"]
    if _needs_rows(c["onehot"]):
        body.append(_rows_line())
    body.append("loss = lse - logits.gather(1, targets.unsqueeze(1)).squeeze(1).float()")
    if c["write"] == "copy_views":
        body += ["grad = torch.empty_like(logits)",
                 "for b, view in zip(blocks, grad.split(VOCAB_PER_BLOCK, dim=1)):",
                 "    view.copy_(torch.exp(b.float() - lse[:, None]))"]
    else:
        body.append("grad = torch.cat([torch.exp(b.float() - lse[:, None]).to(torch.bfloat16) for b in blocks], dim=1)")
    body += ONEHOTS[c["onehot"]][0]
    body.append("return loss, grad")
    combine = "stacked and reduced once" if c["combine"] == "stack" else "folded with torch.logaddexp"
    return Core(NAME, PARAMS, tuple(body),
                f"The program walks the vocabulary in blocks of {c['cols']}: each block's fp32 "
                f"logsumexp is {combine}, then a second pass writes exp(x - lse) per block "
                f"({'into views of a preallocated bf16 gradient' if c['write'] == 'copy_views' else 'concatenated'}); "
                f"the target's -1 goes in by {ONEHOTS[c['onehot']][1]} in bf16.",
                constants=(f"VOCAB_PER_BLOCK = {c['cols']}",))


SPACE = TaskSpace(
    task="cross_entropy",
    lead="Cross entropy forward and backward over a large vocabulary: from bf16 logits (B, V) and "
         "int64 targets, the per-row loss logsumexp(x) - x[target] in fp32 and the gradient "
         "softmax(x) - onehot(target) in bf16.",
    call=CALL,
    blocks=(128, 512, 2048),
    chunks=(2, 4, 8, 32),
    compositions=(
        Composition("autograd_cross_entropy", {"backward": ("autograd_grad", "backward_sum", "backward_ones"),
                                               "upcast": ("float", "detach_to_float32"),
                                               "loss_fn": ("cross_entropy", "nll_log_softmax"),
                                               "grad_cast": GRAD_CASTS},
                    _autograd, compilable=False),
        Composition("log_softmax_gather", {"logp": ("F", "torch_dtype", "lse_sub"), "pick": tuple(PICKS),
                                           "grad_exp": ("exp", "exp_inplace"), "onehot": tuple(ONEHOTS),
                                           "cast_at": ("before_onehot", "after_onehot")}, _log_softmax),
        Composition("softmax_log_pick", {"call": ("torch", "F", "method"), "pick": tuple(PICKS),
                                         "onehot": tuple(ONEHOTS), "cast_at": ("before_onehot", "after_onehot")},
                    _softmax_log),
        Composition("manual_logsumexp", {"exp": ("exp", "inplace"), "normalise": ("divide", "div_inplace"),
                                         "pick": tuple(PICKS), "onehot": tuple(ONEHOTS),
                                         "cast_at": ("before_onehot", "after_onehot")}, _manual_lse),
        Composition("native_bf16_softmax_grad", {"loss": ("lse_fp32", "cross_entropy_bf16"),
                                                 "call": ("torch", "F", "method"), "pick": tuple(PICKS),
                                                 "onehot": tuple(ONEHOTS)},
                    _native_bf16, valid=lambda c: c["loss"] == "lse_fp32" or c["pick"] == "gather"),
        Composition("vocab_block_logsumexp", {"cols": (1024, 4096, 8192, 16384), "combine": ("stack", "logaddexp"),
                                              "write": ("copy_views", "cat"),
                                              "onehot": ("index_sub", "scatter_add", "index_put")},
                    _vocab_blocks, compilable=False),
    ),
)
