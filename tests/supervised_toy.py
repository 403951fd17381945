"""Toy rows for the supervised trainer, where the right answer is known: the prompt names a
BLOCK knob and the knob decides the bin. Shared by the in-process and the data-parallel tests."""

from __future__ import annotations

import random

BLOCKS = (16, 32, 64, 128, 256, 512, 1024, 2048)


def toy_rows(n: int, seed: int, numbered: bool = False) -> list[dict]:
    """`n` rows {"prompt", "true_bin", "pair_id"}; `numbered` puts the pair id in the prompt, so
    that every row's tokens differ (a test can tell which rows a process trained on)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        b = rng.randint(1, 8)
        pair_id = f"{seed}-{i}"
        text = f"kernel BLOCK {BLOCKS[b - 1]} answer"
        rows.append({"prompt": [{"role": "user", "content": f"pair {pair_id}: {text}" if numbered else text}],
                     "true_bin": b, "pair_id": pair_id})
    return rows


def parallel_case():
    """(settings, training rows, calibration rows) of the data-parallel test: distinct prompts,
    batches of many rows (every process gets a share of each), three epochs, no early stop."""
    from models.training.supervised import SupervisedSettings

    settings = SupervisedSettings(base_model="tiny", learning_rate=3e-3, epochs=3, patience=0,
                                  tokens_per_batch=768, warmup_steps=2)
    return settings, toy_rows(96, 0, numbered=True), toy_rows(24, 1, numbered=True)
