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
    from models.training.gpu_host.gpu_job import _load_for_eval
    from models.training.grpo import train_grpo
    from models.training.settings import TrainingSettings
    from models.training.supervised import encode_rows, readout_probs
    t0 = time.time()
    merged = merged_lora(base_path, best, work / "merged")
    profile = "gpu" if device == "cuda" else "smoke"
    overrides = dict(base_model=str(merged), reward="correctness+brier", max_steps=steps, sft_steps=warmup_steps,
                     prompt_style=style)
    if device == "cuda":
        # The warm-up goes on in rounds of `warmup_steps` until 6 of 8 probe answers parse. Merged
        # code-lora trained only the label token after the answer prefix, so it writes the JSON
        # answer no better than the base model: 40 steps at 2e-4 left the parse rate at 0 on the
        # H200 (loss 1.27 -> 0.29, the list of p never closed). Rerun on the CPU with the same
        # adapter and fit rows (user messages cut to their first and last 700 characters to
        # keep a step within seconds; 5e-4 decaying linearly over 150 steps): the answers had the
        # shape but 11 or more entries in p after 40 steps (parse 0/4), and parsed 4/4 after 80.
        overrides.update(sft_lr=5e-4, sft_parse_target=0.75, sft_max_rounds=6,
                         max_completion_length=160, micro_batch_size=4, gradient_checkpointing=False)
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


def run_grpo_bounded(job: Path, work: Path, base_model: str, style: str, steps: int, warmup_steps: int,
                     stop_at: float, kill_at: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`run_grpo` in a child process that is killed at `kill_at` (time.time()): the format
    warm-up and a GRPO step cannot be interrupted from inside, and the trip's budget must hold.
    Returns (rows, record); a killed or failed child gives no rows and says so in the record."""
    import json
    import os
    import subprocess
    import sys

    result = work / "grpo-result.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "models.training.gpu_host.code_grpo", "--job", str(job), "--work", str(work),
           "--base-model", base_model, "--style", style, "--steps", str(steps), "--warmup-steps", str(warmup_steps),
           "--stop-at", str(stop_at), "--result", str(result)]
    timeout = max(1.0, kill_at - time.time())
    with open(work / "grpo-child.log", "w") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=dict(os.environ), start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            return [], {"kind": "grpo", "finished": False, "killed": f"still running at the deadline ({timeout:.0f} s)"}
    if code != 0 or not result.is_file():
        tail = (work / "grpo-child.log").read_text()[-400:]
        return [], {"kind": "grpo", "finished": False, "failed": f"exit {code}: {tail}"}
    saved = json.loads(result.read_text())
    return saved["rows"], saved["record"]


def main(argv: list[str] | None = None) -> int:
    """The child of `run_grpo_bounded`."""
    import argparse
    import json

    import torch

    from models.base_model import resolve_base_model
    from models.training.gpu_host.job import read_job, training_rows, with_role
    from models.training.supervised import BEST_DIR

    parser = argparse.ArgumentParser(prog="python3 -m models.training.gpu_host.code_grpo")
    for name in ("--job", "--work", "--base-model", "--style", "--result"):
        parser.add_argument(name, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup-steps", type=int, required=True)
    parser.add_argument("--stop-at", type=float, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    meta, kernels, pairs = read_job(args.job, "code")
    work = Path(args.work)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows, record = run_grpo(lambda role: training_rows(meta, kernels, with_role(pairs, role), args.style),
                            lambda role: with_role(pairs, role), resolve_base_model(args.base_model),
                            work / "sft" / BEST_DIR, work, args.stop_at, args.steps, args.warmup_steps, args.style, device)
    Path(args.result).write_text(json.dumps({"rows": rows, "record": record}, default=str))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
