"""Attention for a batch of continuations of one prefix whose keys and values are known.

embed_prompts_shared reads the runs that go on from one run together: every row of the batch
attends to the same prefix (the parent run's keys and values) and, causally, to its own tokens.
Through a cache that is one masked attention over prefix + own keys per row: the prefix's keys
copied into every row, and the whole (own x own) block computed, the half above the diagonal
only to be masked away. On a CPU this module makes it two flash passes, combined by their
log-sum-exps:

- the queries of all rows against the prefix held once (one unmasked pass over rows x tokens);
- each row's queries against its own keys, causal (blocks above the diagonal are skipped).

softmax over the union of two key sets is the two partial softmaxes weighted by their shares of
the mass, exp(lse_part - lse_all), so the result is the masked attention's up to round-off (in
bfloat16, the partial outputs' rounding: the forecasts move within what bfloat16 moves them,
docs/results/forecasting-speed.md). Why: on a CPU, attention over the anchor's long prefix is
most of a code-embed prefill. Elsewhere (a GPU) the same inputs go through one masked
scaled_dot_product_attention.

The model's own cache holds the batch's own keys only; `PrefixAttention.use` hands each pass its
prefix. Right padding needs no mask: a real token never attends to the padding after it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch

NAME = "kernelcast_shared_prefix"
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def prefix_then_causal(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, prefix_key: torch.Tensor | None,
                       prefix_value: torch.Tensor | None, scale: float | None = None) -> torch.Tensor:
    """Each row's queries (B, H, n, D) over the prefix's keys (1, H_kv, p, D), then causally over
    its own (B, H_kv, n, D). Returns (B, H, n, D)."""
    rows, heads, n, dim = query.shape
    p = 0 if prefix_key is None else prefix_key.shape[2]
    if p and (_FLASH_CPU is None or query.device.type != "cpu"):  # one masked pass over the prefix and the row
        keys = torch.cat([prefix_key.expand(rows, -1, -1, -1), key], 2)
        values = torch.cat([prefix_value.expand(rows, -1, -1, -1), value], 2)
        mask = torch.ones(n, p + n, dtype=torch.bool, device=query.device).tril(p)
        return torch.nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scale,
                                                                enable_gqa=True)
    if not p:
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale,
                                                                enable_gqa=True)
    # the CPU flash kernel shares each key head among its group of query heads itself
    own, own_lse = _FLASH_CPU(query, key, value, 0.0, True, scale=scale)[:2]
    flat = query.transpose(0, 1).reshape(1, heads, rows * n, dim)
    pre, pre_lse = _FLASH_CPU(flat, prefix_key, prefix_value, 0.0, False, scale=scale)[:2]
    pre = pre.reshape(heads, rows, n, dim).transpose(0, 1)
    pre_lse = pre_lse.reshape(heads, rows, n).transpose(0, 1)
    own_share = torch.sigmoid(own_lse - pre_lse).unsqueeze(-1)  # exp(own_lse - logaddexp(own_lse, pre_lse))
    return torch.lerp(pre, own, own_share.to(query.dtype))


class PrefixAttention:
    """The prefix of the pass under way, per layer: (keys, values), one row each, or none.

    Process-wide, as the attention implementation a model's config names is, so reads take turns
    (a served model may be asked from several threads at once)."""

    kv: Sequence[tuple[torch.Tensor, torch.Tensor]] = ()
    _turn = threading.Lock()

    @classmethod
    @contextlib.contextmanager
    def use(cls, model: Any) -> Iterator[type[PrefixAttention]]:
        """The model's attention reads `cls.kv` inside the block, its own attention again after."""
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(NAME, _attention)
        AttentionMaskInterface.register(NAME, _no_mask)
        with cls._turn:
            config = model.config
            before = config._attn_implementation
            config._attn_implementation = NAME
            try:
                yield cls
            finally:
                config._attn_implementation, cls.kv = before, ()


def _attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
    """A transformers attention function: (B, n, H, D) as the stock ones return it."""
    prefix = PrefixAttention.kv[module.layer_idx] if PrefixAttention.kv else (None, None)
    return prefix_then_causal(query, key, value, *prefix, scale=scaling).transpose(1, 2).contiguous(), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    return None
