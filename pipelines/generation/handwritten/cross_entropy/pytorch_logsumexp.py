"""cross_entropy written out in PyTorch: logsumexp once, the loss from a gather, the gradient as
exp(x - lse) with the target column decremented by a scatter."""

import torch

STYLE = "pytorch_decomposed"
LANGUAGE = "pytorch"


def custom_kernel(data):
    logits, targets = data
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    loss = lse - x.gather(1, targets[:, None]).squeeze(1)
    grad = torch.exp(x.sub_(lse[:, None]))  # x is our own fp32 copy: shifted in place
    grad.scatter_add_(1, targets[:, None], torch.full_like(lse[:, None], -1.0))
    return loss, grad.to(torch.bfloat16)
