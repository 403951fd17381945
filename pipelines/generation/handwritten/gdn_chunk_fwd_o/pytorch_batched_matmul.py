"""gdn_chunk_fwd_o as batched matmuls on (B, NT, H, 64, .) chunk views in fp32: q @ h for the
inter-chunk term, (q @ k^T) * decay @ v for the intra-chunk term, one permute back at the end."""

import torch

STYLE = "pytorch_decomposed"
LANGUAGE = "pytorch"

CHUNK = 64


def _chunked(x, nt, pad):
    # (B, T, H, D) -> (B, NT, H, 64, D) fp32, the tail chunk zero-padded
    B, _, H, D = x.shape
    x = torch.nn.functional.pad(x.float(), (0, 0, 0, 0, 0, pad))
    return x.view(B, nt, CHUNK, H, D).permute(0, 1, 3, 2, 4)


def custom_kernel(data):
    q, k, v, h, g, scale = data
    B, T, H, _ = q.shape
    V = v.shape[-1]
    nt = h.shape[1]
    pad = nt * CHUNK - T
    qc = _chunked(q, nt, pad) * scale
    kc, vc = _chunked(k, nt, pad), _chunked(v, nt, pad)
    gc = torch.nn.functional.pad(g, (0, 0, 0, pad)).view(B, nt, CHUNK, H).permute(0, 1, 3, 2)  # (B,NT,H,64)
    inter = torch.matmul(qc, h.float()) * gc.exp()[..., None]
    causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    decay = torch.where(causal, gc[..., :, None] - gc[..., None, :], float("-inf")).exp()
    intra = torch.matmul(torch.matmul(qc, kc.transpose(-1, -2)) * decay, vc)
    o = (inter + intra).permute(0, 1, 3, 2, 4).reshape(B, nt * CHUNK, H, V)[:, :T]
    return o.to(torch.bfloat16)
