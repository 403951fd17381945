"""causal_attention through attorch's flash attention _attention(q, k, v, causal=True, sm_scale) on (B, H, S, D).

The kernel reads whole blocks of 128 positions: the adapter pads S with zeros up to a multiple
of 128 and drops the padded rows. Causality keeps the real queries off the padded keys (they come
after every real position), so the output is the task's; the benchmark shapes need no padding."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it

import torch

BLOCK = 128


def custom_kernel(data):
    q, k, v = data
    s = q.shape[2]
    scale = q.shape[-1] ** -0.5
    pad = -s % BLOCK
    if pad:
        q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    out = _attention.apply(q, k, v, True, scale)
    return out[:, :, :s] if pad else out
