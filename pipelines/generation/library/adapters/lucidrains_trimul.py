"""trimul through lucidrains' TriangleMultiplicativeModule(dim, hidden_dim, mix="outgoing"), the
module GPU MODE's problem is based on. Its projections carry biases, which the task has not: the
adapter sets them to zero and loads the task's weights (built once per config and device,
inference without grad)."""
# ruff: noqa: F821 - the names this adapter calls are defined by the published code above it

import torch

_modules = {}


def custom_kernel(data):
    x, mask, weights, config = data
    key = (config["dim"], config["hidden_dim"], x.device)
    module = _modules.get(key)
    if module is None:
        module = TriangleMultiplicativeModule(dim=config["dim"], hidden_dim=config["hidden_dim"], mix="outgoing")
        module = _modules[key] = module.to(x.device)
        for name, param in module.named_parameters():
            if name.endswith(".bias") and name not in weights:
                param.data.zero_()
    params = dict(module.named_parameters())
    for name, value in weights.items():
        params[name].data = value
    with torch.no_grad():
        return module(x, mask)
