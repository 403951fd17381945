"""cross_entropy through torch.compile (loss and gradient in one Inductor graph), compiled on
the first call."""

import torch

STYLE = "torch_compile"
LANGUAGE = "pytorch"

_compiled = None


def _xent(logits, targets):
    x = logits.float()
    m = x.amax(-1, keepdim=True)
    e = torch.exp(x - m)
    s = e.sum(-1, keepdim=True)
    lse = (m + torch.log(s)).squeeze(1)
    loss = lse - x.gather(1, targets[:, None]).squeeze(1)
    cols = torch.arange(x.shape[1], device=x.device)
    grad = e / s - (cols[None, :] == targets[:, None]).float()
    return loss, grad.to(torch.bfloat16)


def custom_kernel(data):
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(_xent, dynamic=False)
    logits, targets = data
    return _compiled(logits, targets)
