"""Whether a forecasting prompt fits the model's context: `kernelcast forecast` refuses one that
does not, in one line, rather than let the model read past the positions it was trained on.

The budget is the rendered chat prompt (the chat template with its generation prompt) plus what
the readout adds: the answer prefix and one bin label for the logprob readout, the generation
budget for the verbalized one.
"""

from __future__ import annotations

from typing import Any

LOGPROB_ANSWER_TOKENS = 16  # the answer prefix ('{"predicted_bin": ') and one bin label, with room


def context_length(config: Any) -> int | None:
    """The model's context in tokens, from an HF config (None when it does not say)."""
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_prompt_fits(tokenizer: Any, config: Any, messages: list[dict], answer_tokens: int) -> int:
    """Raise ValueError (one line) when prompt + answer do not fit; returns the prompt's tokens.

    >>> class Tok:
    ...     def apply_chat_template(self, messages, tokenize, add_generation_prompt):
    ...         return "x" * 100
    ...     def __call__(self, text, add_special_tokens):
    ...         return {"input_ids": list(text)}
    >>> class Cfg: max_position_embeddings = 110
    >>> check_prompt_fits(Tok(), Cfg(), [], 10)
    100
    >>> check_prompt_fits(Tok(), Cfg(), [], 11)
    Traceback (most recent call last):
    ...
    ValueError: the prompt is 100 tokens and the answer needs up to 11: more than the model's context of 110 tokens; use --style diff or compact, or a model with a longer context
    """
    # Rendered, then tokenized, as the transformers backend feeds it (render_chat + tokenizer).
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    limit = context_length(config)
    if limit is not None and n + answer_tokens > limit:
        raise ValueError(
            f"the prompt is {n} tokens and the answer needs up to {answer_tokens}: more than the model's context of "
            f"{limit} tokens; use --style diff or compact, or a model with a longer context"
        )
    return n
