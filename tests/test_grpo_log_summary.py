"""scripts/grpo_log_summary.py reads the committed H200 training logs into the README's figures."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOGS = REPO / "data" / "training" / "h200" / "2026-11-29-s3"
sys.path.insert(0, str(REPO / "scripts"))

import grpo_log_summary  # noqa: E402  (scripts/ is not a package)


def test_the_committed_h200_logs_give_the_readme_figures():
    lines = "\n".join(grpo_log_summary.summarise(LOGS / "call2") + grpo_log_summary.summarise(LOGS / "call3"))
    assert "call2 correctness+brier: 20 GRPO steps; killed at the deadline" in lines
    assert "call3 correctness: 20 GRPO steps; killed at the deadline" in lines
    assert "call3 correctness+brier: 12 GRPO steps; torch.AcceleratorError" in lines
    assert "NaN gradient norm at step(s) [12]" in lines
    assert "groups of equal reward: 0.25 -> 0.25 (min 0, mean 0.419, max 0.75)" in lines
    assert "rollout parse rate: 0.359 -> 0.797 (min 0.359, mean" in lines
    assert "GPU memory held by this process when it ran out: 75.35 GiB" in lines


def test_read_steps_keeps_nan_and_skips_other_lines():
    text = "noise\n{'loss': '0.1', 'grad_norm': 'nan', 'parse_rate': '0.5'}\n{'train_runtime': '3'}\n{'loss': '0.2', 'gr"
    steps = grpo_log_summary.read_steps(text)
    assert len(steps) == 1 and steps[0]["parse_rate"] == 0.5 and steps[0]["grad_norm"] != steps[0]["grad_norm"]


def test_a_missing_folder_is_one_line(tmp_path, capsys):
    assert grpo_log_summary.main([str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.startswith("error:")


def test_a_run_trained_across_three_calls_reads_as_such():
    """Session 5's logs: stopped by the clock, resumed from the checkpoint, trained, then killed
    at the deadline inside the verbalized evaluation."""
    s5 = REPO / "data" / "training" / "h200" / "2026-11-29-s5"
    lines = "\n".join(line for call in ("call2", "call3", "call4") for line in grpo_log_summary.summarise(s5 / call))
    assert "call2 correctness: 11 GRPO steps; stopped by the clock at step 11 of 20" in lines
    assert "call3 correctness: 7 GRPO steps; resumed after step 11, stopped by the clock at step 18 of 20" in lines
    assert "call4 correctness: 2 GRPO steps; resumed after step 18, trained, killed at the deadline" in lines
    assert "call3 correctness+brier: 14 GRPO steps; resumed after step 6, trained, killed at the deadline" in lines
    assert "eval verbalized: 1568 forecasts, 1177 parsed, 415.8 s" in lines
    assert "NaN gradient" not in lines
