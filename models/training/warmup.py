"""The supervised format warm-up before GRPO, and its record beside the GRPO checkpoints.

The warm-up itself is models.training.sft's (`run_sft`, `parse_rate`); here it is measured (greedy parse
rate of a few probe rows before and after), logged, and kept, so that a run resumed from a GRPO
checkpoint reports the warm-up it had instead of running it again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.training.settings import TrainingSettings
from models.training.tracking import TrainingRun

log = logging.getLogger(__name__)

WARMUP_RECORD = "warmup.json"  # beside the checkpoints: the warm-up's figures, for a resumed run


@dataclass
class WarmUp:
    """What the warm-up left behind.

    Attributes:
        metrics: parse_rate_before_sft, train_rows_used, parse_rate_after_sft, and
            sft_loss_first / sft_loss_last when it ran any step.
        sft_losses: its per-step losses.
    """

    metrics: dict[str, float]
    sft_losses: list[float] = field(default_factory=list)

    def save(self, folder: Path) -> None:
        """Write the record into `folder`, whole or not at all (a resume reads it)."""
        folder.mkdir(parents=True, exist_ok=True)
        part = folder / (WARMUP_RECORD + ".part")
        part.write_text(json.dumps({"metrics": self.metrics, "sft_losses": self.sft_losses}))
        part.replace(folder / WARMUP_RECORD)

    @classmethod
    def load(cls, folder: Path) -> WarmUp:
        record = json.loads((folder / WARMUP_RECORD).read_text())
        return cls(record["metrics"], record["sft_losses"])


def warm_up(model: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], settings: TrainingSettings,
            run: TrainingRun, stop_at: float | None = None) -> WarmUp:
    """Supervised steps on the answer format (the adapter trains in place), with the greedy parse
    rate of the first `parse_probe_rows` rows before and after each round of `settings.sft_steps`.

    Rounds go on until the parse rate reaches `settings.sft_parse_target`, `sft_max_rounds` have
    run, or (with `stop_at`, a time.time() value) another round would likely end past it.
    """
    from models.training.sft import parse_rate, run_sft

    probe = list(rows[: settings.parse_probe_rows])
    probe_tokens = settings.max_completion_length
    metrics = {
        "parse_rate_before_sft": parse_rate(model, tokenizer, probe, probe_tokens),
        "train_rows_used": float(len(rows)),
    }
    sft_losses: list[float] = []
    rates: list[float] = []
    while True:
        t0 = time.time()
        sft_losses += run_sft(model, tokenizer, rows, settings, start=len(sft_losses))
        rates.append(parse_rate(model, tokenizer, probe, probe_tokens))
        seconds = time.time() - t0
        log.info("format warm-up round %d: %d steps, parse rate %.2f (%.0f s)", len(rates), len(sft_losses),
                 rates[-1], seconds)
        if (settings.sft_steps <= 0 or rates[-1] >= settings.sft_parse_target
                or len(rates) >= settings.sft_max_rounds
                or (stop_at is not None and time.time() + seconds > stop_at)):
            break
    run.log_sft(sft_losses)
    metrics["parse_rate_after_sft"] = rates[-1]
    metrics["sft_rounds"] = float(len(rates))
    if sft_losses:
        metrics["sft_loss_first"], metrics["sft_loss_last"] = sft_losses[0], sft_losses[-1]
    log.info(
        "format warm-up: parse rate %.2f -> %.2f over %d probe rows in %d round(s) (%s)",
        metrics["parse_rate_before_sft"],
        metrics["parse_rate_after_sft"],
        len(probe),
        len(rates),
        ", ".join(f"{r:.2f}" for r in rates),
    )
    return WarmUp(metrics, sft_losses)


def last_checkpoint(folder: Path) -> Path | None:
    """The newest complete checkpoint-N in `folder` (its trainer_state.json, written last, is
    there), or None; a checkpoint cut while being written is passed over."""
    if not folder.is_dir() or not (folder / WARMUP_RECORD).is_file():
        return None
    steps = {p: p.name.removeprefix("checkpoint-") for p in folder.glob("checkpoint-*")}
    whole = [p for p, n in steps.items() if n.isdigit() and (p / "trainer_state.json").is_file()]
    return max(whole, key=lambda p: int(steps[p]), default=None)
