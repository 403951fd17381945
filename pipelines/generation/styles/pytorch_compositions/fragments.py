"""Spellings shared by several tasks' programs: how people upcast, round back, prepare the input
and pick a softmax call. Each knob value maps to the code it writes and a few words for the
docstring, so that a knob never changes the docstring without changing the code."""

from __future__ import annotations

# knob value -> (expression with {t} for the tensor, words)
UPCASTS = {
    "float": ("{t}.float()", "x.float()"),
    "to_float32": ("{t}.to(torch.float32)", "x.to(torch.float32)"),
}
DOWNCASTS = {
    "to_bf16": ("{t}.to(torch.bfloat16)", ".to(torch.bfloat16)"),
    "bfloat16": ("{t}.bfloat16()", ".bfloat16()"),
    "type_as": ("{t}.type_as({x})", ".type_as on the input"),
    "to_dtype": ("{t}.to({x}.dtype)", ".to on the input's dtype"),
}
# lines at the top of the core, and what they add
PREPS = {
    "none": ((), ""),
    "contiguous": (("{x} = {x}.contiguous()",), " The input is made contiguous first (a no-op "
                   "for the contiguous task input)."),
    "clone": (("{x} = {x}.clone()  # a private copy of the input",), " The input is cloned first, "
              "an extra read and write of the whole block."),
}
# softmax-like calls: knob value -> format with {t}, {dim}, {kw} (extra keywords, ", dtype=...")
SOFTMAX_CALLS = {
    "torch": "torch.softmax({t}, dim={dim}{kw})",
    "F": "F.softmax({t}, dim={dim}{kw})",
    "method": "{t}.softmax(dim={dim}{kw})",
}
LOG_SOFTMAX_CALLS = {
    "torch": "torch.log_softmax({t}, dim={dim}{kw})",
    "F": "F.log_softmax({t}, dim={dim}{kw})",
    "method": "{t}.log_softmax(dim={dim}{kw})",
}


def call_name(kind: str, op: str) -> str:
    """How the docstring names a call spelled `kind` ("torch", "F", "method") of `op`."""
    return {"torch": f"torch.{op}", "F": f"F.{op}", "method": f"Tensor.{op}"}[kind]


def upcast(kind: str, t: str) -> str:
    return UPCASTS[kind][0].format(t=t)


def downcast(kind: str, t: str, x: str = "x") -> str:
    return DOWNCASTS[kind][0].format(t=t, x=x)


def prep(kind: str, x: str = "x") -> list[str]:
    return [line.format(x=x) for line in PREPS[kind][0]]


def prep_doc(kind: str) -> str:
    return PREPS[kind][1]


def softmax_call(kind: str, t: str, dim: int | str = -1, kw: str = "", log: bool = False) -> str:
    table = LOG_SOFTMAX_CALLS if log else SOFTMAX_CALLS
    return table[kind].format(t=t, dim=dim, kw=kw)

