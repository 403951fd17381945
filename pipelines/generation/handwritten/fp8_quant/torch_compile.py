"""fp8_quant through torch.compile (group max, scale and cast fused), compiled on the first call."""

import torch

STYLE = "torch_compile"
LANGUAGE = "pytorch"

GROUP = 128
FP8_MAX = 448.0
_compiled = None


def _quant(x):
    M, K = x.shape
    xg = x.view(M, K // GROUP, GROUP).float()
    scales = xg.abs().amax(dim=-1).clamp(min=1e-10) / FP8_MAX
    q = (xg / scales[..., None]).clamp(-FP8_MAX, FP8_MAX)
    return q.to(torch.float8_e4m3fn).view(M, K), scales


def custom_kernel(data):
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(_quant, dynamic=False)
    (x,) = data
    return _compiled(x)
