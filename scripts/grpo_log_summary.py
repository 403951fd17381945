"""Per-variant GRPO curves from the logs of a GPU training call (gpu_train_round.sh): steps run,
warm-up probe parse rate, and first -> last (max) of the rollout parse rate, the correctness
reward, the share of groups of equal reward, the step time, and how each process ended (with
the GPU memory it held, when it ran out).

    python3 scripts/grpo_log_summary.py data/training/h200/2026-11-29-s3/call2 [more call folders]

A folder holds train-<variant>.log files (one per child process; TRL prints one dict per step)
and the parent's train.log (which says which children were killed at the deadline).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

CURVES = {"rollout parse rate": "parse_rate", "correctness reward": "rewards/correctness_reward/mean",
          "groups of equal reward": "frac_reward_zero_std", "step time (s)": "step_time"}


def read_steps(text: str) -> list[dict[str, float]]:
    """TRL's per-step log dicts (lines "{'loss': ...}"); values as floats, nan kept."""
    steps = []
    for line in text.splitlines():
        if line.startswith("{'loss'"):
            try:
                steps.append({k: float(v) for k, v in ast.literal_eval(line).items()})
            except (SyntaxError, ValueError, TypeError):
                continue  # a line cut short when the process was killed
    return steps


def outcome(text: str, parent_log: str, variant: str) -> str:
    """How the process ended: its last error line, or what it did in this call (resumed from a
    checkpoint, stopped cleanly by the clock, trained to the end) and whether the parent killed
    it at the deadline (a run trained across several GPU calls logs all of these in turn)."""
    errors = [line for line in text.splitlines() if re.match(r"^\w[\w.]*(Error|Exception)\b", line)]
    if errors:
        return errors[-1].split(". ")[0][:160]
    done = []
    if resumed := re.search(r"resuming GRPO from \S*checkpoint-(\d+)", text):
        done.append(f"resumed after step {resumed[1]}")
    if stopped := re.search(r"stopped by the clock at GRPO step (\d+) of (\d+)", text):
        done.append(f"stopped by the clock at step {stopped[1]} of {stopped[2]}")
    elif f"{variant}: trained in" in text:
        done.append("trained")
    if f"{variant}: killed at the deadline" in parent_log:
        done.append("killed at the deadline")
    return ", ".join(done) or "finished"


def summarise(folder: Path) -> list[str]:
    parent = (folder / "train.log").read_text() if (folder / "train.log").is_file() else ""
    lines = []
    for log in sorted(folder.glob("train-*.log")):
        variant = log.stem.removeprefix("train-").replace("_", "+")
        text = log.read_text()
        steps = read_steps(text)
        warm = re.findall(r"format warm-up: parse rate (\S+) -> (\S+)", text)
        evals = re.findall(r"(logprob|verbalized): (\d+) forecasts, (\d+) parsed, ([\d.]+) s", text)
        lines.append(f"{folder.name} {variant}: {len(steps)} GRPO steps; {outcome(text, parent, variant)}")
        if warm:
            lines.append(f"  warm-up probe parse rate {warm[-1][0]} -> {warm[-1][1]}")
        for label, key in CURVES.items():
            values = [s[key] for s in steps if key in s]
            if values:
                finite = [v for v in values if v == v]
                lines.append(f"  {label}: {values[0]:.3g} -> {values[-1]:.3g} "
                             f"(min {min(finite):.3g}, mean {sum(finite) / len(finite):.3g}, max {max(finite):.3g})")
        nan = [i + 1 for i, s in enumerate(steps) if s.get("grad_norm") != s.get("grad_norm")]
        if nan:
            lines.append(f"  NaN gradient norm at step(s) {nan}")
        held = re.findall(r"this process has ([\d.]+) GiB memory in use", text)
        if held:
            lines.append(f"  GPU memory held by this process when it ran out: {held[-1]} GiB")
        for readout, n, parsed, seconds in evals:
            lines.append(f"  eval {readout}: {n} forecasts, {parsed} parsed, {seconds} s")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    args = ap.parse_args(argv)
    for folder in args.folders:
        if not folder.is_dir():
            print(f"error: {folder} is not a folder", file=sys.stderr)
            return 2
        print("\n".join(summarise(folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
