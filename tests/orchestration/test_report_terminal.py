"""What `kernelcast report` shows in a real terminal of 100 columns: the champions' decisions
first, then one table per split (a split that repeats another's numbers in one line), then where
the report is and how to get the run links; no line wider than the terminal. The end of
`kernelcast run` prints the same lines (orchestration.cli._run_headline), then the search
comparison, which is held to the same width here."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from test_run_terminal import ANSI, run_in_terminal

REPO = Path(__file__).resolve().parents[2]
WIDTH = 100
NAME = "kernelcast-surrogate"


def _rows(split: str, names: list[tuple[str, str]], n: int) -> list[dict]:
    out = []
    for i, (name, kind) in enumerate(names):
        b = 0.30 + 0.02 * i
        out.append({"name": name, "kind": kind, "split": split, "source": "", "n": n, "brier": b, "brier_lo": b - 0.015,
                    "brier_hi": b + 0.016, "crps": 0.1, "ece": 0.05, "accuracy": 0.5, "recovered_mean": 0.97,
                    "recovered_lo": 0.95, "recovered_hi": 0.99, "recovered_random": 0.6, "parse_rate": 1.0,
                    "run_id": "a" * 32 if name.startswith("models:/") else None,
                    "mlflow_url": f"http://127.0.0.1:5000/#/runs/{'a' * 32}" if name.startswith("models:/") else None,
                    "dagster_run_id": None, "dagster_url": None,
                    "selective_coverage": 0.95 if split == "external" else None})
    return out


def _home(home: Path) -> None:
    """A home as a run leaves it: a dataset version, both promotion decisions, the report table
    with four splits (source only repeating in distribution) and names as long as real ones."""
    from pipelines.evaluation.forecaster_table import TABLE_FILE
    from warehouse.datasets import register_dataset_version
    from warehouse.db import connect
    from warehouse.promotions import record_promotion_decision

    home.mkdir(parents=True)
    score = {"kind": "cost_model", "parse_rate": 1.0, "uniform_brier": 0.4375, "failed_gates": []}
    with connect(home / "warehouse.duckdb") as con:
        register_dataset_version(con, "ds-93b74df39f94", "c" * 64, {"n_measurements": 10947, "n_pairs": 12731}, [])
        record_promotion_decision(con, NAME, "ds-93b74df39f94", "promoted", "lowest Brier", 12, {},
                                  [{**score, "model_version": 1, "role": "challenger", "n_pairs": 12, "brier": 0.3504}],
                                  champion_after=1, challenger_after=3)
        record_promotion_decision(con, NAME, "ds-93b74df39f94", "promoted", "lowest Brier", 12, {},
                                  [{**score, "model_version": 3, "kind": "ensemble", "role": "challenger", "n_pairs": 12,
                                    "brier": 0.3154}], champion_after=3, challenger_after=1,
                                  alias="champion-external", split="external")
    names = [("baseline:bin_prior", "baseline"), ("baseline:uniform", "baseline"),
             ("h200:code-head-features-held-out", "llm"), (f"models:/{NAME}/1", "cost_model"),
             (f"models:/{NAME}/3", "ensemble"), (f"models:/{NAME}-held-out/12", "text_model")]
    rows = [r for split, n in (("in_distribution", 207), ("source_only", 207), ("held_out_task", 289),
                               ("external", 2952)) for r in _rows(split, names, n)]
    folder = home / "reports" / "ds-93b74df39f94"
    folder.mkdir(parents=True)
    pages = {s: f"reports/ds-93b74df39f94/{'' if s == 'in_distribution' else s + '/'}index.html"
             for s in ("in_distribution", "held_out_task", "external")}
    (folder / TABLE_FILE).write_text(json.dumps({
        "dataset_version": "ds-93b74df39f94", "held_out_task": "gdn_chunk_fwd_o", "report": pages["in_distribution"],
        "pages": pages, "evaluation_run_id": "e" * 32, "evaluation_run_url": f"http://127.0.0.1:5000/#/runs/{'e' * 32}",
        "evaluation_dagster_run_id": "d" * 36, "evaluation_dagster_run_url": f"http://127.0.0.1:3000/runs/{'d' * 36}",
        "empty_splits": {}, "same_as": {"source_only": "in_distribution"},
        "selective_external": {"target_brier": 0.313, "best": "h200:code-head-features-held-out"},
        "forecasters": rows}))


def _screen(raw: str) -> list[str]:
    """The lines as the terminal shows them, leading spaces kept (what a width is measured on)."""
    text = ANSI.sub("", raw).replace("\r\n", "\n")
    return [line.split("\r")[-1].rstrip() for line in text.split("\n") if line.strip()]


@pytest.fixture
def short_home():
    """A home path of a usual length (pytest's own folders are twice as long)."""
    folder = Path(tempfile.mkdtemp(prefix="kc-", dir="/tmp"))
    yield folder / "home"
    shutil.rmtree(folder)


def test_report_in_a_100_column_terminal_decisions_first_one_table_per_split(short_home):
    home = short_home
    _home(home)
    env = {**os.environ, "PYTHONPATH": str(REPO), "KERNELCAST_HOME": str(home)}
    for key in ("KERNELCAST_MLFLOW_PORT", "KERNELCAST_DAGSTER_PORT", "KERNELCAST_PROFILE"):
        env.pop(key, None)
    code, raw = run_in_terminal([sys.executable, "-m", "orchestration.cli", "report", "--profile", "smoke"], env, 300)
    lines = _screen(raw)
    assert code == 0, "\n".join(lines)
    assert max(len(line) for line in lines) <= WIDTH, [line for line in lines if len(line) > WIDTH]

    def at(pattern: str) -> int:
        return next(i for i, line in enumerate(lines) if re.match(pattern, line))

    order = [at(r"dataset ds-93b74df39f94$"),
             at(r"@champion: surrogate/1 \(cost_model\), Brier 0\.350 on 12 pairs of in_distribution; promoted"),
             at(r"@champion-external: surrogate/3 \(ensemble\), Brier 0\.315 on 12 pairs of external; promoted"),
             at(r"in distribution \(eval set\):"),
             at(r"source only \(generator metadata withheld\): the same numbers as in distribution"),
             at(r"held-out task gdn_chunk_fwd_o:"), at(r"external "),
             at(rf"report: {re.escape(str(home))}/reports/ds-93b74df39f94/index\.html"),
             at(r"MLflow and Dagster runs of each forecaster: kernelcast report --links")]
    assert order == sorted(order) and order[-1] == len(lines) - 1, "\n".join(lines)
    assert sum(line.startswith("forecaster") for line in lines) == 3  # source only is one line, not a table
    champion = next(line for line in lines[order[3]:order[4]] if line.startswith("surrogate/1 "))
    assert champion.endswith("@champ @chall-ext")
    assert not any("a" * 32 in line for line in lines)  # run ids only behind --links


def test_the_search_comparison_fits_100_columns():
    from pipelines.search.config import MODES
    from pipelines.search.report import comparison_lines

    cell = {"final_best_mean": 10.298, "final_best_lo": 9.81, "final_best_hi": 11.27}
    report = {"tasks": {t: {m: cell for m in MODES} for t in ("matmul_bias_gelu", "causal_attention", "softmax")},
              "summary": {"filtered_beats_standard": 9, "filtered_beats_random": 9, "n_tasks": 9},
              "coverage": {"coverage": 0.895, "measured_coverage": 0.92}, "forecaster": "kind:cost_model",
              "plan": {"seeds": 3, "budget": 12}}
    lines = comparison_lines(report)
    assert max(len(line) for line in lines) <= WIDTH, lines
    assert lines[0].split() == ["task", *MODES] and lines[1].startswith("matmul_bias_gelu")
    cells = lines[1][16:]
    assert len(cells.split()) == 2 * len(MODES)  # every value and interval apart from the next
    cell = {"final_best_mean": 10.987, "final_best_lo": 10.62, "final_best_hi": 11.27}  # the widest a cell gets
    wide = comparison_lines({**report, "tasks": {"rms_norm": {m: cell for m in MODES}}})[1]
    assert len(wide.split()) == 1 + 2 * len(MODES) and len(wide) <= WIDTH
    assert lines[-2] == "filtered beats standard on 9/9 tasks, random-filtered on 9/9 (3 seeds, budget 12)"
    assert lines[-1] == "forecaster kind:cost_model: coverage 0.895 of proposed children, 0.920 of measured ones"
