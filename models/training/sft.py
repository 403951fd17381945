"""Format warm-up: supervised fine-tuning on the answer FORMAT before GRPO.

Why: zero-shot, a small base model (SmolLM2-135M, or the tiny test model) almost never writes
a parseable 8-probability JSON answer, so every GRPO group gets the same reward 0
(frac_reward_zero_std = 1) and nothing is learned. A few supervised steps on
answers of the right shape fix that.

The target completion of a training row is one JSON object

    {"predicted_bin": y, "p": [...], "reasoning": "..."}

with p a smoothed one-hot around the true bin y (`smoothed_one_hot`: 0.6 on y, 0.15 on each
neighbour, the rest spread evenly). This teaches the format and, at most, a label prior:
the model is shown confident-ish answers centred on the truth, which is NOT calibration.
Calibration is what the Brier/CRPS-shaped GRPO rewards are for; keep `sft_steps` small so
the warm-up does not fix a distribution shape GRPO then has to unlearn.

Plain torch loop (no SFTTrainer): the loss is next-token cross-entropy on the completion
tokens only (prompt tokens masked with -100), one row per step in turn, AdamW with a linearly decaying rate.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Sequence
from typing import Any

import torch

from models.bins import NUM_BINS

log = logging.getLogger(__name__)

# Fixed, short reasoning: the warm-up teaches where the reasoning goes, not what it says
# (short keeps the tiny model's target short enough to memorise in a few dozen steps).
WARMUP_REASONING = "see the diff"


def smoothed_one_hot(true_bin: int, peak: float = 0.6, neighbour: float = 0.15) -> list[float]:
    """A distribution with `peak` on the true bin, `neighbour` on each adjacent bin, the rest
    spread evenly over the other bins; rounded to 2 decimals, summing to 1.

    Args:
        true_bin: 1..8.
        peak: mass on the true bin.
        neighbour: mass on each existing neighbour (bins 1 and 8 have one).
    Returns:
        Eight probabilities.

    >>> smoothed_one_hot(1)
    [0.6, 0.15, 0.04, 0.04, 0.04, 0.04, 0.04, 0.05]
    >>> round(sum(smoothed_one_hot(4)), 6)
    1.0
    """
    if not 1 <= true_bin <= NUM_BINS:
        raise ValueError(f"true_bin must be in 1..{NUM_BINS}, got {true_bin}")
    p = [0.0] * NUM_BINS
    p[true_bin - 1] = peak
    neighbours = [b for b in (true_bin - 1, true_bin + 1) if 1 <= b <= NUM_BINS]
    for b in neighbours:
        p[b - 1] = neighbour
    rest = [i for i in range(NUM_BINS) if p[i] == 0.0]
    share = round((1.0 - peak - neighbour * len(neighbours)) / len(rest), 2)
    for i in rest:
        p[i] = share
    # Put the rounding remainder on the last "rest" bin so the written p sums to exactly 1.
    p[rest[-1]] = round(1.0 - sum(p) + p[rest[-1]], 2)
    return [round(x, 2) for x in p]


def format_target(true_bin: int) -> str:
    """The warm-up target completion for a row with this true bin (a parseable answer).

    >>> from models.parsing import parse_forecast
    >>> parse_forecast(format_target(3)).predicted_bin
    3
    """
    return json.dumps(
        {
            "predicted_bin": int(true_bin),
            "p": smoothed_one_hot(int(true_bin)),
            "reasoning": WARMUP_REASONING,
        }
    )


def _encode(
    tokenizer: Any, messages: list[dict[str, str]], target: str
) -> tuple[list[int], list[int]]:
    """(input ids, labels) for prompt + target + end of turn; prompt positions labelled -100."""
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    target_ids = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt_ids + target_ids, [-100] * len(prompt_ids) + target_ids


@torch.inference_mode()
def parse_rate(
    model: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], max_new_tokens: int = 96
) -> float:
    """Share of rows whose greedy completion parses as a forecast (one batched generate).

    Args:
        model: a causal LM (PeftModel or plain).
        tokenizer: its tokenizer, with a chat template.
        rows: training rows ({"prompt": messages, ...}).
        max_new_tokens: generation budget per row.
    Returns:
        Parse rate in [0, 1] (0.0 for no rows).
    """
    from models.backends import ForecastRequest
    from models.backends.transformers_backend import TransformersAnswerer

    if not rows:
        return 0.0
    was_training = model.training
    # One left-padded batch: on the H200 the row-by-row loop took ~2 minutes for 8 zero-shot
    # rows (each generating the full budget); a batch costs one budget's worth of steps.
    probe = TransformersAnswerer(model, tokenizer, readout="verbalized", temperature=0.0,
                                   max_new_tokens=max_new_tokens, batch_size=len(rows), model_ref="probe")
    forecasts = probe.forecast([ForecastRequest(r["prompt"]) for r in rows])
    for f in forecasts:
        if not f.parse_ok:
            log.debug("probe completion does not parse (%s)", f.parse_error)
    if was_training:
        model.train()
    return sum(f.parse_ok for f in forecasts) / len(rows)


def run_sft(
    model: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], settings: Any, start: int = 0
) -> list[float]:
    """Supervised steps on the answer format; trains the model's LoRA adapter in place.

    Args:
        model: a PeftModel (only the adapter has requires_grad) or any causal LM.
        tokenizer: its tokenizer, with a chat template.
        rows: training rows ({"prompt": messages, "true_bin": int, ...}).
        settings: a TrainingSettings (reads sft_steps, sft_lr, seed).
        start: where in the seeded row order these steps begin (a later round goes on where
            the one before stopped instead of repeating its rows).
    Returns:
        The per-step training losses; the model is left in train mode.
    """
    losses: list[float] = []
    steps = int(settings.sft_steps)
    if steps <= 0 or not rows:
        return losses
    encoded = [_encode(tokenizer, r["prompt"], format_target(int(r["true_bin"]))) for r in rows]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=float(settings.sft_lr), weight_decay=0.0)
    # Linear decay to 0: a high rate finds the format fast, the low-rate tail settles the
    # exact token sequence (greedy decoding needs every token of it right).
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / steps)
    order = list(range(len(encoded)))
    random.Random(settings.seed).shuffle(order)
    model.train()
    for step in range(steps):
        ids, labels = encoded[order[(start + step) % len(order)]]
        input_ids = torch.tensor([ids], device=model.device)  # (1, seq)
        out = model(input_ids=input_ids, labels=torch.tensor([labels], device=model.device))
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))
        if step % 10 == 0 or step == steps - 1:
            log.info("sft step %d/%d loss %.4f", step + 1, steps, losses[-1])
    return losses
