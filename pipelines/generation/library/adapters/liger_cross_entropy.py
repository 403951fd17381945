"""cross_entropy through Liger's cross_entropy_forward with reduction "none": one fused pass gives
the per-row loss and writes d(sum of losses)/d(logits) into its input (it does so when the input
requires grad). The adapter hands it a copy, so the task's logits are left as they were."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it


def custom_kernel(data):
    logits, targets = data
    x = logits.detach().clone().requires_grad_(True)
    loss, _, _, _, grad = cross_entropy_forward(x, targets, None, -100, 0.0, 0.0, "none", None, False)
    return loss.float(), grad.detach()
