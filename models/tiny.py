"""A tiny, deterministic chat model for tests: LlamaConfig causal LM + in-process BPE tokenizer.

Nothing is downloaded. The tokenizer is a byte-level BPE trained here on a small corpus of
our own prompts and JSON answers, with digits split one per token (so the bin labels "1".."8"
are single tokens in every context), ChatML special tokens and a ChatML chat template. The
model is a randomly initialised LlamaForCausalLM; its answers are noise, which is the point:
tests see the plumbing (batching, readouts, parse failures recorded), not skill.

Same seed and settings -> byte-identical files (tested). A LlamaConfig is used on purpose:
with other configs AutoTokenizer may swap in a different tokenizer class; load
the tokenizer with PreTrainedTokenizerFast.

>>> TINY_SPECIAL_TOKENS
('<|endoftext|>', '<|im_start|>', '<|im_end|>')
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# ChatML, as SmolLM2 uses; no default system message.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _corpus() -> list[str]:
    """Training text for the BPE merges: our prompt wording, answers and some kernel code."""
    from models.prompts import build_prompt

    kernel = (
        "import triton\nimport triton.language as tl\n\n@triton.jit\n"
        "def kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):\n"
        "    pid = tl.program_id(0)\n    offs = pid * BLOCK + tl.arange(0, BLOCK)\n"
        "    mask = offs < n\n    x = tl.load(x_ptr + offs, mask=mask)\n"
        "    tl.store(y_ptr + offs, x * 2.0, mask=mask)\n"
    )
    texts = []
    for style in ("full", "diff"):
        for m in build_prompt(
            "softmax", "Row-wise softmax.", kernel, kernel.replace("2.0", "3.0"), {}, style
        ):
            texts.append(m["content"])
    for b in range(1, 9):
        texts.append(
            f'The candidate uses fewer loads. {{"predicted_bin": {b}, "p": [0.1, 0.2, 0.05, 0.05, 0.3, 0.1, 0.1, 0.1], '
            f'"reasoning": "memory traffic is lower"}}'
        )
    return texts


def build_tokenizer(vocab_size: int = 1024):
    """A byte-level BPE PreTrainedTokenizerFast with ChatML special tokens and template.

    Args:
        vocab_size: target vocabulary size (the 256 bytes and 3 special tokens included);
            the small corpus saturates near 950, which shortens prompts ~40% against 512.
    Returns:
        A PreTrainedTokenizerFast (pad = eos = "<|im_end|>", bos = "<|im_start|>").
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Digits alone, then bytes: "3" is one token whatever surrounds it (the logprob readout
    # reads the label token after '{"predicted_bin": ').
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(
    out_dir: str | Path,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    vocab_size: int = 1024,
) -> Path:
    """Write a tiny causal LM and its tokenizer to `out_dir` (save_pretrained layout).

    Args:
        out_dir: created if missing; overwritten.
        seed: weight initialisation seed (same seed -> same bytes).
        hidden_size: model width; 64 gives ~0.1M parameters, 256 with 4 layers ~3.4M.
        num_layers: decoder layers.
        num_heads: attention heads (2 key/value heads when divisible, to exercise GQA).
        vocab_size: BPE vocabulary target.
    Returns:
        The directory, loadable with AutoModelForCausalLM and PreTrainedTokenizerFast.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=2 if num_heads % 2 == 0 else num_heads,
        max_position_embeddings=8192,  # full-style prompts with real kernels run to thousands of tokens
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # fork_rng: seeding must not disturb the caller's global RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "kernelcast_tiny.json").write_text(
        json.dumps(
            {
                "seed": seed,
                "hidden_size": hidden_size,
                "num_layers": num_layers,
                "vocab_size": len(tokenizer),
            }
        )
    )
    log.info(
        "tiny model (%d parameters) written to %s", sum(p.numel() for p in model.parameters()), out
    )
    return out
