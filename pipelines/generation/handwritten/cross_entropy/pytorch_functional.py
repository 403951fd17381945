"""cross_entropy from PyTorch's fused ops: F.cross_entropy for the per-row loss and a softmax with
an fp32 accumulation dtype for the gradient, the one-hot subtracted by index_put."""

import torch
import torch.nn.functional as F

STYLE = "native_ops"
LANGUAGE = "pytorch"


def custom_kernel(data):
    logits, targets = data
    loss = F.cross_entropy(logits.float(), targets, reduction="none")
    grad = torch.softmax(logits, dim=-1, dtype=torch.float32)
    rows = torch.arange(grad.shape[0], device=grad.device)
    grad.index_put_((rows, targets), torch.tensor(-1.0, device=grad.device), accumulate=True)
    return loss, grad.to(torch.bfloat16)
