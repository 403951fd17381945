"""gdn_chunk_fwd_o through GPU MODE's reference ref_kernel((q, k, v_new, h, g)): the same maths (its
scale is K**-0.5, the task's), computed in fp32 and returned in q's dtype. It reshapes T into
chunks of 64, so the adapter pads a partial last chunk with zeros (padded tokens come after every
real one: causality keeps them out) and drops them from the output."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it

import torch

CHUNK = 64


def custom_kernel(data):
    q, k, v, h, g, scale = data
    t = q.shape[1]
    pad = -t % CHUNK
    if pad:
        q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
        g = torch.nn.functional.pad(g, (0, 0, 0, pad))
    out = ref_kernel((q, k, v, h, g))
    return out[:, :t] if pad else out
