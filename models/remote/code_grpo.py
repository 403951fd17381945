"""(c) of the code-reading LLM's host run: GRPO with the Brier reward on top of `code-lora`.

Runs only when the trip has time left after (b) and (a) and the LoRA run has a best epoch: its
adapter is merged into the base model, the format warm-up and GRPO of models.training run on the
fit rows (reward correctness+brier, the paper's RL stage), and the GRPO adapter forecasts the
calibration, eval and external pairs with the same label-token readout as `code-lora`, so the
two are scored alike and the report gives the delta. The GRPO state stays in the scratch folder:
a trip that cannot finish it forecasts nothing for this variant.

Only torch, transformers, peft, accelerate, trl and datasets.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("kernelcast.llm_code")

GRPO_VARIANT = "code-lora-grpo"
SCORED = ("calibration", "eval", "external")


def merged_lora(base_path: Path, best: Path, target: Path) -> Path:
    """The best LoRA adapter merged into its base model, saved (once) under target."""
    if (target / "config.json").is_file():
        return target
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base_path), dtype=torch.float32), str(best))
    part = target.with_name(target.name + ".part")
    model.merge_and_unload().save_pretrained(str(part))
    PreTrainedTokenizerFast.from_pretrained(str(best)).save_pretrained(str(part))
    part.replace(target)
    return target


def run_grpo(rows_of: Any, pairs_of: Any, base_path: Path, best: Path, work: Path, stop_at: float,
             steps: int, warmup_steps: int, style: str, device: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """GRPO on the merged LoRA model until `steps` or `stop_at`; its forecasts when it finished.

    Args:
        rows_of: role -> training rows (prompts) of that role's pairs, in `style`.
        pairs_of: role -> the pairs of that role (pair ids in the rows' order).
    Returns:
        (forecast rows (empty unless finished), its record).
    """
    from models.remote.gpu_job import _load_for_eval
    from models.supervised import encode_rows, readout_probs
    from models.training import TrainingSettings, train_grpo

    t0 = time.time()
    merged = merged_lora(base_path, best, work / "merged")
    profile = "gpu" if device == "cuda" else "smoke"
    overrides = dict(base_model=str(merged), reward="correctness+brier", max_steps=steps, sft_steps=warmup_steps,
                     prompt_style=style)
    if device == "cuda":
        overrides.update(sft_lr=2e-4, max_completion_length=160, micro_batch_size=4, gradient_checkpointing=False)
    settings = TrainingSettings.profile(profile, **overrides)
    result = train_grpo(settings, rows_of("fit"), work / "grpo", checkpoint_dir=work / "grpo-ckpt", stop_at=stop_at)
    record: dict[str, Any] = {"kind": "grpo", "setting": "in_distribution", "style": style, "from": "code-lora",
                              "finished": bool(result.finished), "steps": result.steps,
                              "metrics": {k: v for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))},
                              "settings": {"reward": settings.reward, "max_steps": steps, "sft_steps": warmup_steps}}
    rows: list[dict[str, Any]] = []
    if result.finished:
        model, tokenizer = _load_for_eval(merged, work / "grpo", "lora")
        for role in SCORED:
            chosen = rows_of(role)
            if not chosen:
                continue
            enc, labels = encode_rows(tokenizer, chosen)
            probs = readout_probs(model, tokenizer, enc, labels, 32768, autocast=device == "cuda").double().numpy()
            rows += [{"variant": GRPO_VARIANT, "role": role, "pair_id": p["pair_id"], "readout": "logprob", "repeat": 0,
                      **{f"p{j + 1}": float(x) for j, x in enumerate(row)}} for p, row in zip(pairs_of(role), probs, strict=True)]
    record["seconds"] = round(time.time() - t0, 1)
    log.info("%s: finished=%s after %s steps (%.0f s)", GRPO_VARIANT, result.finished, result.steps, record["seconds"])
    return rows, record
