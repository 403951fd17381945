"""Reading prompts with their shared token runs prefilled once (models.training.head.
embed_prompts_shared) gives the rows of one full, padded prefill a batch (embed_prompts) up to
float round-off, for every way prompts can share: one long prefix, a family's run under it, a
prompt that ends where another goes on, the same prompt twice, nothing shared."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch

LAYERS = (0, 1, -1)
LABELS = list(range(10, 18))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from models.backends.transformers_backend import load_model_and_tokenizer
    from models.base_model import resolve_base_model

    model, tokenizer = load_model_and_tokenizer(resolve_base_model("tiny", tmp_path_factory.mktemp("home")), "cpu",
                                                "float32")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def prompts_sharing_runs(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(5, 400) for _ in range(n)]

    anchor, family = tokens(70), tokens(12)
    out = [anchor + family + tokens(rng.randint(1, 30)) for _ in range(4)]  # one family under the anchor
    out += [anchor + tokens(rng.randint(1, 30)) for _ in range(3)]  # other candidates of the anchor
    out += [anchor[:25], anchor + family]  # prompts another one goes on from
    out += [tokens(40), out[0]]  # nothing shared; the same prompt twice
    return out


def test_shared_runs_give_the_full_prefills_rows(tiny):
    from models.training.head import embed_prompts, embed_prompts_shared, prefix_tree

    model, tokenizer = tiny
    prompts = prompts_sharing_runs()
    full = embed_prompts(model, tokenizer, prompts, LABELS, LAYERS, tokens_per_batch=4096)
    shared = embed_prompts_shared(model, prompts, LABELS, LAYERS)
    assert shared.shape == full.shape and shared.dtype == np.float32
    assert np.allclose(shared, full, rtol=1e-5, atol=1e-5), np.abs(shared - full).max()
    assert np.array_equal(shared[0], shared[-1])
    # each shared run is read once: far fewer tokens than the prompts hold
    read = sum(end - start for _, start, end, _, _ in prefix_tree(prompts))
    assert read < 0.6 * sum(map(len, prompts))


def test_in_bfloat16_the_shared_runs_stay_near_the_float32_full_prefills_rows(tiny):
    """The reading a CPU with bfloat16 instructions uses (pipelines.forecasting.embed.
    cpu_reading_dtype): the weights in bfloat16, shared runs once. Its rows are the bfloat16 full
    prefill's, and the float32 full prefill's, up to bfloat16's round-off (8 bits of mantissa),
    far above float32's."""
    from models.training.head import embed_prompts, embed_prompts_shared

    model, tokenizer = tiny
    prompts = prompts_sharing_runs()
    full = embed_prompts(model, tokenizer, prompts, LABELS, LAYERS, tokens_per_batch=4096)
    half = copy.deepcopy(model).to(torch.bfloat16)
    shared = embed_prompts_shared(half, prompts, LABELS, LAYERS)
    full_half = embed_prompts(half, tokenizer, prompts, LABELS, LAYERS, tokens_per_batch=4096)
    assert shared.dtype == np.float32 and np.array_equal(shared[0], shared[-1])
    spread = np.maximum(full.std(axis=0), 1e-6)

    def gap(a: np.ndarray, b: np.ndarray) -> float:
        return float((np.abs(a - b).max(axis=0) / spread).max())  # the worst column, in its spread

    # Measured on this model, prompts_sharing_runs(0..3): shared vs full in bfloat16 0.007-0.015
    # of a column's spread; bfloat16 vs float32 0.05-0.10; float32 shared vs full 1e-6 to 3e-6.
    assert gap(shared, full_half) < 0.05
    assert 1e-3 < gap(shared, full) < 0.2


def test_the_prefix_tree_spells_every_prompt_once():
    """Each prompt ends at one row, and the runs from the root down to it spell it."""
    from models.training.head import prefix_tree

    prompts = prompts_sharing_runs(1)
    tree = prefix_tree(prompts)
    assert sorted(i for *_, ending, _ in tree for i in ending) == list(range(len(prompts)))
    for row, (parent, start, end, ending, holder) in enumerate(tree):
        assert parent < row and start == (tree[parent][2] if parent >= 0 else 0) and end <= len(prompts[holder])
        for i in ending:
            spelled, r = [], row
            while r >= 0:
                p, s, e, _, h = tree[r]
                spelled = prompts[h][s:e] + spelled
                r = p
            assert spelled == prompts[i]
    assert prefix_tree([]) == []


def test_an_empty_prompt_is_one_line(tiny):
    from models.training.head import embed_prompts_shared

    with pytest.raises(ValueError, match="an empty prompt has no last token to read"):
        embed_prompts_shared(tiny[0], [[5, 6], []], LABELS)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_prefix_then_causal_is_the_masked_attention_over_prefix_and_row(monkeypatch, dtype, tol):
    """The two flash passes a CPU takes (prefix once for all rows, own keys causal), combined by
    their log-sum-exps, give each row what one masked attention over its whole sequence gives,
    with grouped-query heads; and the masked pass other devices take is that same attention."""
    from models.training import prefix_attention

    g = torch.Generator().manual_seed(0)
    rows, heads, kv_heads, n, p, dim = 3, 6, 2, 37, 50, 16

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    q, k, v = randn(rows, heads, n, dim), randn(rows, kv_heads, n, dim), randn(rows, kv_heads, n, dim)
    pk, pv = randn(1, kv_heads, p, dim), randn(1, kv_heads, p, dim)
    expected = torch.stack([
        torch.nn.functional.scaled_dot_product_attention(
            q[r:r + 1].float(), torch.cat([pk, k[r:r + 1]], 2).float().repeat_interleave(3, 1),
            torch.cat([pv, v[r:r + 1]], 2).float().repeat_interleave(3, 1),
            attn_mask=torch.ones(n, p + n, dtype=torch.bool).tril(p))[0] for r in range(rows)])
    split = prefix_attention.prefix_then_causal(q, k, v, pk, pv)
    assert split.shape == q.shape and split.dtype == dtype
    assert torch.allclose(split.float(), expected, atol=tol)
    monkeypatch.setattr(prefix_attention, "_FLASH_CPU", None)
    assert torch.allclose(prefix_attention.prefix_then_causal(q, k, v, pk, pv).float(), expected, atol=tol)
    no_prefix = prefix_attention.prefix_then_causal(q, k, v, None, None).float()
    causal = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(3, 1), v.float().repeat_interleave(3, 1), is_causal=True)
    assert torch.allclose(no_prefix, causal, atol=tol)


def test_reads_from_several_threads_at_once_give_each_its_own_rows(tiny):
    """A served model may be asked from several threads: the prefix each pass reads is its own."""
    from concurrent.futures import ThreadPoolExecutor

    from models.training.head import embed_prompts_shared

    model, _ = tiny
    batches = [prompts_sharing_runs(seed) for seed in (2, 3, 4, 5)]
    alone = [embed_prompts_shared(model, b, LABELS, LAYERS) for b in batches]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda b: embed_prompts_shared(model, b, LABELS, LAYERS), batches))
    for a, t in zip(alone, together, strict=True):
        assert np.array_equal(a, t)
