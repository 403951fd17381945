"""Does this GPU's attention backward return NaN gradients on left-padded batches?

GRPO trains on left-padded prompt + completion batches with an explicit attention mask, so the
query rows of the padding are fully masked. On torch 2.11 with H100/H200, cuDNN's SDPA backward
is reported to return NaN in the query gradient when a mask is given, the sequence length is 64
mod 128 and a row's logsumexp is very low (pytorch/pytorch#196678). Three SmolLM2 GRPO runs on
the H200 logged NaN gradient norms at their first step (data/training/h200/2026-11-29-grpo-bf16-nan/), and
training (models.training.grpo, models.training.supervised) turns cuDNN attention off. This checks the
premise on the host: per backend and length, the count of non-finite query-gradient entries
(torch only).

    python3 -m models.training.gpu_host.sdpa_check [--lengths 704,768,3136,3200] [--pad 1000]
"""

from __future__ import annotations

import argparse
import sys


def nonfinite_grad_q(length: int, pad: int, backend, dtype) -> int | str:
    """Non-finite entries of dQ for a causal, left-padded batch of 2 (row 0 padded by `pad`)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (2, 9, length, 64)  # SmolLM2-135M: 9 query heads of 64
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, generator=g).requires_grad_() for _ in range(3))
    keep = torch.ones(2, length, dtype=torch.bool, device="cuda")
    keep[0, : min(pad, length - 1)] = False  # left padding of row 0
    causal = torch.ones(length, length, dtype=torch.bool, device="cuda").tril()
    mask = causal[None, None] & keep[:, None, None, :]
    try:
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            out.backward(torch.randn(out.shape, device="cuda", dtype=dtype, generator=g))
    except RuntimeError as e:  # the backend does not take these inputs
        return f"n/a ({str(e).splitlines()[0][:60]})"
    torch.cuda.synchronize()
    return int((~torch.isfinite(q.grad)).sum())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="704,768,3136,3200", help="sequence lengths (64 mod 128 and not)")
    ap.add_argument("--pad", type=int, default=1000, help="left-padding tokens of the first row")
    args = ap.parse_args(argv)
    import torch
    from torch.nn.attention import SDPBackend

    if not torch.cuda.is_available():
        print("error: no CUDA GPU here", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    backends = [SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    print(f"{'length':>7} {'mod128':>6} " + " ".join(f"{b.name:>22}" for b in backends))
    for length in [int(x) for x in args.lengths.split(",")]:
        counts = [nonfinite_grad_q(length, args.pad, b, torch.bfloat16) for b in backends]
        print(f"{length:>7} {length % 128:>6} " + " ".join(f"{c!s:>22}" for c in counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
