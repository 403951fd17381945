"""causal_attention through kernl's attention_forward(q, k, v, output, sm_scale, is_causal=True) on
(B, H, S, D); the caller allocates the output, as kernl's own callers do."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it

import torch


def custom_kernel(data):
    q, k, v = data
    out = torch.empty_like(q)
    attention_forward(q, k, v, out, q.shape[-1] ** -0.5, is_causal=True)
    return out
