"""trimul: the AlphaFold3 outgoing triangle multiplicative update (GPU MODE's bioml/trimul).

data = (input (bs, N, N, dim) fp32, mask (bs, N, N), weights: dict, config: dict), the layout,
weight names, benchmark cases and tolerances of GPU MODE's problem, so unmodified GPU MODE
submissions (which define `custom_kernel(data)`) run here.

    x      = LayerNorm_dim(input)                                  (bs, N, N, dim)
    left   = (x @ left_proj^T)  * mask * sigmoid(x @ left_gate^T)  (bs, N, N, hidden)
    right  = (x @ right_proj^T) * mask * sigmoid(x @ right_gate^T)
    out    = einsum('b i k h, b j k h -> b i j h', left, right)    the triangle contraction
    output = (LayerNorm_hidden(out) * sigmoid(x @ out_gate^T)) @ to_out^T

Costs at N = 1024, dim = 384, hidden = 128: five fp32 projections (5 x 0.1 TFLOP), the
contraction (bs * hidden batched N x N x N matmuls, 0.27 TFLOP) and ~10 GB of fp32 traffic for
the unfused intermediates.

What matches GPU MODE's problem (reference-kernels, problems/bioml/trimul):
- inputs: the same calls in the same order. A torch.Generator on the input's device, seeded with
  the case seed, gives the normal input and the random mask; the Cauchy(0, 2) input comes from
  torch.distributions.Cauchy on the CPU (on a GPU: the same distribution drawn on the device,
  not GPU MODE's values) and the weights from torch.randn, both through torch's global generator. GPU MODE leaves that generator to the process's history; here it is seeded
  from the case seed inside torch.random.fork_rng, so every case is deterministic by its seed and
  the caller's generator state is left as it was;
- reference: the same module (LayerNorm, bias-free Linear layers, einsum) in fp32 with TF32 off
  in cuDNN (GPU MODE's DisableCuDNNTF32) and in cuBLAS (PyTorch's default, kept explicitly);
- check: make_match_reference(ref_kernel, rtol=2e-2, atol=2e-2), i.e. |out - ref| <= 2e-2 +
  2e-2 |ref| elementwise, NaN and infinities only where the reference has them, and the output
  a tensor of the reference's shape.

Imports only the standard library and torch (the GPU worker imports this on a bare host).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from pipelines.tasks.contract import Task, default_device, reference_check, seeded_generator
from pipelines.tasks.gpumode_utils import DisableCuDNNTF32, match_expected

# GPU MODE: check_implementation = make_match_reference(ref_kernel, rtol=2e-2, atol=2e-2).
RTOL = 2e-2
ATOL = 2e-2


def generate_input(
    seed: int, seqlen: int, bs: int, dim: int, hiddendim: int, nomask: bool, distribution: str
):
    """(input, mask, weights, config) as GPU MODE's trimul generates them; deterministic by seed.

    mask is float32 ones when `nomask`, else int64 0/1 (as torch.randint gives it).
    """
    if distribution not in ("normal", "cauchy"):
        raise ValueError(f"distribution must be 'normal' or 'cauchy', got {distribution!r}")
    device = default_device()
    gen = seeded_generator(seed, device)
    shape = (bs, seqlen, seqlen, dim)
    cuda_devices = [torch.device(device).index or 0] if device.startswith("cuda") else []
    with torch.random.fork_rng(devices=cuda_devices):
        torch.manual_seed(seed)  # GPU MODE draws Cauchy inputs and weights from the global generator
        if distribution == "cauchy" and device == "cpu":
            x = torch.distributions.Cauchy(0, 2).sample(shape).to(dtype=torch.float32)
        elif distribution == "cauchy":
            # GPU MODE samples on the CPU and copies: 800 M values took 14 s of an H200 worker's
            # start on trimul. The same distribution, drawn on the device from the seeded global
            # generator there.
            x = torch.empty(shape, device=device, dtype=torch.float32).cauchy_(0.0, 2.0)
        else:
            x = torch.randn(shape, device=device, dtype=torch.float32, generator=gen).contiguous()
        if nomask:
            mask = torch.ones(bs, seqlen, seqlen, device=device)
        else:
            mask = torch.randint(0, 2, (bs, seqlen, seqlen), device=device, generator=gen)
        h, d = hiddendim, dim

        def randn(*size):  # the global generator, as GPU MODE's weights
            return torch.randn(size, device=device, dtype=torch.float32)

        weights = {
            "norm.weight": randn(d),
            "norm.bias": randn(d),
            "left_proj.weight": randn(h, d) / math.sqrt(h),
            "right_proj.weight": randn(h, d) / math.sqrt(h),
            "left_gate.weight": randn(h, d) / math.sqrt(h),
            "right_gate.weight": randn(h, d) / math.sqrt(h),
            "out_gate.weight": randn(h, d) / math.sqrt(h),
            "to_out_norm.weight": randn(h),
            "to_out.weight": randn(d, h) / math.sqrt(d),
            "to_out_norm.bias": randn(h),
        }
    config = {"hidden_dim": h, "dim": d}
    return x, mask, weights, config


@contextmanager
def _full_fp32():
    """fp32 matmuls: no TF32 in cuDNN (GPU MODE's DisableCuDNNTF32) nor in cuBLAS."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with DisableCuDNNTF32():
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def ref_kernel(data):
    """The PyTorch module of GPU MODE's reference, written functionally (same ops, same order)."""
    x, mask, w, config = data
    dim, hidden = config["dim"], config["hidden_dim"]
    with _full_fp32():
        x = F.layer_norm(x, (dim,), w["norm.weight"], w["norm.bias"])  # (bs, N, N, dim)
        m = mask.unsqueeze(-1)  # (bs, N, N, 1); int64 or fp32, promoted to fp32 below
        left = F.linear(x, w["left_proj.weight"]) * m  # (bs, N, N, hidden)
        right = F.linear(x, w["right_proj.weight"]) * m
        left = left * F.linear(x, w["left_gate.weight"]).sigmoid()
        right = right * F.linear(x, w["right_gate.weight"]).sigmoid()
        out_gate = F.linear(x, w["out_gate.weight"]).sigmoid()
        out = torch.einsum("... i k d, ... j k d -> ... i j d", left, right)  # (bs, N, N, hidden)
        out = F.layer_norm(out, (hidden,), w["to_out_norm.weight"], w["to_out_norm.bias"])
        return F.linear(out * out_gate, w["to_out.weight"])  # (bs, N, N, dim)


def check_against(data, output, expected) -> tuple[bool, str]:
    """GPU MODE's check, make_match_reference(ref_kernel, rtol=2e-2, atol=2e-2), with the
    reference's output given."""
    if not isinstance(output, torch.Tensor):
        return False, f"output: expected a tensor, got {type(output).__name__}"
    ok, message = match_expected(output, expected, rtol=RTOL, atol=ATOL)
    return ok, "ok" if ok else f"output: {message}"


check_implementation = reference_check(ref_kernel, check_against)


def _case(seqlen, bs, dim, hiddendim, seed, nomask, distribution):
    return {
        "seqlen": seqlen,
        "bs": bs,
        "dim": dim,
        "hiddendim": hiddendim,
        "seed": seed,
        "nomask": nomask,
        "distribution": distribution,
    }


TASK = Task(
    name="trimul",
    description=(
        "The outgoing Triangle Multiplicative Update of AlphaFold3 (GPU MODE bioml/trimul), forward "
        "only. Inputs: x (bs, N, N, dim) fp32, a 0/1 mask (bs, N, N), LayerNorm and bias-free "
        "projection weights (hidden_dim = 128, dim 128-768). Compute x = LayerNorm(x); "
        "left = (x W_lp^T) * mask * sigmoid(x W_lg^T) and right likewise; "
        "out[b,i,j,h] = sum_k left[b,i,k,h] * right[b,j,k,h] (a batched N x N x N matmul per "
        "channel h); output = (LayerNorm_h(out) * sigmoid(x W_og^T)) W_out^T, shape (bs, N, N, dim). "
        "The reference runs unfused PyTorch in full fp32 (no TF32): five projections, elementwise "
        "gating, an einsum that permutes to channel-first batched matmuls, LayerNorm and a final "
        "projection, each materialising fp32 intermediates. Fusing LayerNorm, projections and gates, "
        "running the contraction on tensor cores in bf16/fp16 with fp32 accumulation (within the "
        "2e-2 tolerance) and fusing the output LayerNorm, gate and projection leave large headroom. "
        "Benchmarks: N = 256-1024, bs 1-2, dim 128 or 384, with and without mask, normal and "
        "heavy-tailed Cauchy inputs."
    ),
    generate_input=generate_input,
    ref_kernel=ref_kernel,
    check_implementation=check_implementation,
    check_against=check_against,
    correctness_cases=(
        _case(16, 1, 32, 32, 7, True, "normal"),
        _case(20, 2, 48, 32, 8, False, "normal"),  # ragged N and dim, masked
        _case(24, 1, 32, 32, 9, False, "cauchy"),  # heavy tails, masked
    ),
    # GPU MODE's seven benchmark cases, verbatim.
    benchmark_cases=(
        _case(256, 2, 128, 128, 9371, True, "normal"),
        _case(768, 1, 128, 128, 381, True, "cauchy"),
        _case(256, 2, 384, 128, 2301, False, "normal"),
        _case(512, 1, 128, 128, 12819, True, "normal"),
        _case(1024, 1, 128, 128, 381, True, "cauchy"),
        _case(768, 1, 384, 128, 481, False, "normal"),
        _case(1024, 1, 384, 128, 23291, True, "normal"),
    ),
    tolerances={"rtol": RTOL, "atol": ATOL},
    source="gpumode",
)
