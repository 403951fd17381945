"""The `kernelcast` command line: contracts other tools rely on, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from orchestration.cli import app

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


# A correct softmax kernel in plain PyTorch: a file `kernelcast forecast` accepts.
SOFTMAX_PYTORCH = ("import torch\n\n\ndef custom_kernel(data):\n    (x,) = data\n"
                   "    return torch.softmax(x.float(), dim=-1).to(torch.bfloat16)\n")


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_help_lists_every_command():
    out = runner.invoke(app, ["--help"]).output
    for cmd in ("run", "tasks", "generate", "check", "profile", "ingest", "dataset", "evaluate", "ui"):
        assert cmd in out


def test_tasks_json_lists_nine_tasks_with_cases():
    res = runner.invoke(app, ["tasks", "--json"])
    assert res.exit_code == 0, res.output
    tasks = json.loads(res.output)
    names = {t["task"] for t in tasks}
    assert {"trimul", "cross_entropy", "fp8_quant", "gdn_chunk_fwd_o", "softmax", "rms_norm", "layer_norm",
            "matmul_bias_gelu", "causal_attention"} <= names
    for t in tasks:
        assert t["benchmark_cases"] and t["correctness_cases"] and t["description"]


def _one_line_error(res) -> str:
    lines = [line for line in res.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, res.output
    assert lines[0].startswith("error:")
    return lines[0]


def test_ingest_missing_file_is_one_line_error(tmp_path):
    res = runner.invoke(app, ["ingest", str(tmp_path / "nope.parquet")])
    assert res.exit_code == 2
    assert "no such file" in _one_line_error(res)


def test_ingest_corrupt_file_writes_nothing(tmp_path, home):
    bad = tmp_path / "results-bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    res = runner.invoke(app, ["ingest", str(bad)])
    assert res.exit_code == 2
    _one_line_error(res)
    from warehouse.db import connect

    with connect(home / "warehouse.duckdb", read_only=True) as con:
        assert con.execute("SELECT count(*) FROM measurements").fetchone()[0] == 0


def test_ingest_is_idempotent_and_dataset_reports_counts(home):
    data = REPO / "data" / "measurements" / "h200"
    first = runner.invoke(app, ["ingest", str(data), "--json"])
    assert first.exit_code == 0, first.output
    added = sum(f["added"] for f in json.loads(first.output)["files"])
    second = runner.invoke(app, ["ingest", str(data), "--json"])
    assert sum(f["added"] for f in json.loads(second.output)["files"]) == 0
    rows = sum(pl.read_parquet(f).height for f in data.glob("*.parquet"))
    assert added == rows
    ds = runner.invoke(app, ["dataset", "--json"])
    assert ds.exit_code == 0, ds.output
    summary = json.loads(ds.output)
    assert summary["n_tasks"] == 9 and summary["by_status"]["ok"] > 500


def test_dataset_without_warehouse_is_one_line_error():
    res = runner.invoke(app, ["dataset"])
    assert res.exit_code == 2
    assert "no warehouse" in _one_line_error(res)


def test_unknown_task_is_one_line_error(tmp_path):
    res = runner.invoke(app, ["generate", "--task", "nope", "--out", str(tmp_path / "b.parquet")])
    assert res.exit_code == 2
    assert "unknown task" in _one_line_error(res)


def test_unknown_profile_is_one_line_error():
    res = runner.invoke(app, ["run", "--profile", "huge"])
    assert res.exit_code == 2
    assert "unknown profile" in _one_line_error(res)


def test_profile_without_gpu_says_so(tmp_path):
    batch = tmp_path / "b.parquet"
    pl.DataFrame({"kernel_id": ["x"], "task": ["softmax"], "source": ["x = 1"]}).write_parquet(batch)
    res = runner.invoke(app, ["profile", "--batch", str(batch), "--out", str(tmp_path / "o.parquet")])
    assert res.exit_code == 2
    assert "no CUDA GPU" in _one_line_error(res)


def test_check_flags_a_wrong_kernel_and_passes_the_seed(tmp_path):
    from pipelines.generation import registry

    good = tmp_path / "good.py"
    good.write_text(registry.render_point(registry.seed_point("softmax")))
    res = runner.invoke(app, ["check", "--task", "softmax", "--kernel", str(good), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["ok"] is True
    wrong = tmp_path / "wrong.py"
    wrong.write_text("import torch\n\ndef custom_kernel(data):\n    (x,) = data\n    return torch.zeros_like(x)\n")
    res = runner.invoke(app, ["check", "--task", "softmax", "--kernel", str(wrong), "--json"])
    assert res.exit_code == 1
    assert json.loads(res.output)["failure_kind"] == "incorrect"


def test_evaluate_json_contract(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    n = 40
    p = rng.dirichlet(np.ones(8), size=n)
    frame = pl.DataFrame({"pair_id": [f"p{i}" for i in range(n)], "task": ["a", "b"] * (n // 2),
                          "true_speedup": rng.lognormal(0, 1, n), **{f"p{i + 1}": p[:, i] for i in range(8)}})
    path = tmp_path / "f.parquet"
    frame.write_parquet(path)
    res = runner.invoke(app, ["evaluate", "--forecasts", str(path), "--json", "--n-boot", "20"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    for key in ("n", "parse_rate", "brier", "crps", "nll", "accuracy", "off_by_one", "ece", "aurc",
                "selective_risk_at_50", "recovered_mean", "recovered_at_10", "within_20", "recovered_random_mean", "per_task"):
        assert key in out
    assert set(out["per_task"]) == {"a", "b"}
    assert out["n"] == n


@pytest.mark.slow
def test_forecast_answers_a_distribution_from_a_local_model(tmp_path):
    from models.tiny import build_tiny_model
    from pipelines.generation import registry

    model_dir = build_tiny_model(tmp_path / "tiny")
    anchor, cand = tmp_path / "a.py", tmp_path / "c.py"
    seed = registry.seed_point("softmax")
    anchor.write_text(registry.render_point(seed))
    from pipelines.generation.mutations import neighbours

    child, _ = neighbours(seed)[0]
    cand.write_text(registry.render_point(child))
    res = runner.invoke(app, ["forecast", "--task", "softmax", "--anchor", str(anchor), "--candidate", str(cand),
                              "--model", str(model_dir), "--json"])
    assert res.exit_code == 0, res.output
    (out,) = json.loads(res.stdout[res.stdout.index("["):])
    assert out["parse_ok"] is True and len(out["p"]) == 8
    assert abs(sum(out["p"]) - 1) < 1e-6 and 1 <= out["predicted_bin"] <= 8


def test_forecast_unknown_model_is_one_line_error(tmp_path):
    a = tmp_path / "a.py"
    a.write_text("x = 1\n")
    res = runner.invoke(app, ["forecast", "--task", "softmax", "--anchor", str(a), "--candidate", str(a),
                              "--model", str(tmp_path / "missing")])
    assert res.exit_code == 2
    assert "no such checkpoint" in res.output


@pytest.mark.slow
@pytest.mark.parametrize("mode, bin_", [("text", 6), ("tool", 2)])
def test_forecast_through_an_openai_endpoint(tmp_path, monkeypatch, mode, bin_):
    """--endpoint: the chat-completions server answers (a real local HTTP server)."""
    from tests.models.test_models_openai_backend import FakeServer

    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    a = tmp_path / "a.py"
    a.write_text(SOFTMAX_PYTORCH)
    server = FakeServer()
    try:
        args = ["forecast", "--task", "softmax", "--anchor", str(a), "--candidate", str(a), "--endpoint", server.base_url,
                "--readout", "verbalized", "--answer-mode", mode, "--json"]
        res = runner.invoke(app, [*args, "--model", "tool" if mode == "tool" else "good"])
        missing = runner.invoke(app, args)
    finally:
        server.close()
    assert res.exit_code == 0, res.output
    (out,) = json.loads(res.stdout[res.stdout.index("["):])
    assert out["predicted_bin"] == bin_ and out["source"].startswith("OpenAI-compatible endpoint")
    assert out["style"] == "full" and server.requests[0]["messages"][0]["role"] == "system"
    assert missing.exit_code == 2 and "--model" in missing.output


def test_run_headline_prints_the_dataset_and_each_forecasters_numbers(tmp_path):
    from orchestration.cli import _run_headline, headline_lines
    from orchestration.settings import load_settings

    lines = headline_lines("ds-1", {"n_measurements": 9, "n_pairs": 4}, {
        "baseline:uniform": {"n": 4, "brier": 0.4375, "ece": 0.02, "recovered_mean": 0.9, "parse_rate": 1.0},
        "models:/kernelcast-surrogate/1": {"n": 2, "brier": 0.5, "parse_rate": 0.5}})
    assert lines == [
        "dataset ds-1: 9 measurements, 4 pairs",
        "forecaster                         n   Brier     ECE recovered  parse",
        "baseline:uniform                   4  0.4375  0.0200    0.9000 1.0000",
        "models:/kernelcast-surrogate/1     2  0.5000       -         - 0.5000",
    ]
    assert all(len(line) <= 80 for line in lines)
    assert _run_headline(load_settings("smoke", tmp_path / "empty-home")) == []  # nothing run yet


def test_run_headline_reports_a_broken_report_in_one_line(tmp_path):
    """A corrupt metrics.json after a finished run: one line, not a crash."""
    import json

    from orchestration.cli import _run_headline
    from orchestration.settings import load_settings
    from warehouse.db import connect

    settings = load_settings("smoke", tmp_path / "home")
    settings.home.mkdir(parents=True)
    with connect(settings.warehouse_path) as con:
        con.execute("INSERT INTO dataset_versions (dataset_version, content_digest, counts, n_measurements, created_at) "
                    "VALUES ('ds-x', 'd', ?, 0, now())", [json.dumps({"n_measurements": 0, "n_pairs": 0})])
    (settings.reports_dir / "ds-x").mkdir(parents=True)
    (settings.reports_dir / "ds-x" / "metrics.json").write_text('{"baseline:uniform": {"n": 4,')
    lines = _run_headline(settings)
    assert len(lines) == 1 and lines[0].startswith("(no summary: JSONDecodeError")


def _commands() -> list[list[str]]:
    """Every command and group of the command line, as its words (`train code embed-head` included)."""
    import typer

    def walk(group, path: list[str]) -> list[list[str]]:
        out = []
        for name, cmd in group.commands.items():
            out.append([*path, name])
            if getattr(cmd, "commands", None):
                out += walk(cmd, [*path, name])
        return out

    return walk(typer.main.get_command(app), [])


def test_version():
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.startswith("kernelcast ")


@pytest.mark.parametrize("command", _commands(), ids=" ".join)
def test_help_is_readable(command):
    """No Python type names or range brackets; every --json says what it prints; fits 100 columns."""
    res = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "100"}, terminal_width=100)
    assert res.exit_code == 0, res.output
    out = res.output
    for ugly in ("<bool>", "<str>", "<int", "<float", "<path>", "<list[", "[x>=", "[x<="):
        assert ugly not in out, f"{ugly} in {command} help:\n{out}"
    for line in out.splitlines():
        if "--json" in line:
            assert line.split("--json", 1)[1].strip(" │"), f"--json without help in {command}:\n{out}"
    assert all(len(line) <= 100 for line in out.splitlines())


def test_help_reflows_sentences():
    """A docstring's line breaks do not cut a command's summary in the command list."""
    out = runner.invoke(app, ["--help"], terminal_width=100).output
    ingest = next(i for i, line in enumerate(out.splitlines()) if "│ ingest " in line)
    assert "good files go in" in " ".join(out.splitlines()[ingest:ingest + 2])


@pytest.mark.parametrize("args, words", [
    (["check", "--task", "softmax", "--kernel", "/no/such/kernel.py"], "does not exist"),
    (["generate", "--task", "softmax", "--count", "0", "--out", "x.parquet"], "--count"),
    (["generate", "--out", "x.parquet"], "--task"),
    (["no-such-command"], "no-such-command"),
])
def test_usage_errors_are_one_line(args, words):
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    assert words in _one_line_error(res)


def test_tasks_and_dataset_tables_fit_100_columns(home):
    from orchestration.cli import dataset_lines

    res = runner.invoke(app, ["tasks"])
    assert res.exit_code == 0, res.output
    assert all(len(line) <= 100 for line in res.output.splitlines())
    summary = {"n_measurements": 10, "n_kernels": 6, "n_tasks": 1, "n_hardware": 1, "by_status": {"ok": 9, "failed": 1},
               "by_failure_kind": {"timeout": 1},
               "dataset_version": {"dataset_version": "ds-1", "n_measurements": 7, "n_pairs": 5},
               "by_task_hardware": [{"task": "matmul_bias_gelu", "hardware_id": "nvidia-h200-sm90", "measurements": 10,
                                     "failed": 1, "correct_kernels": 5, "by_bin": [1, 2, 0, 0, 1, 1, 0, 0]}]}
    lines = dataset_lines(summary)
    assert lines[0].startswith("warehouse: 10 measurements (9 ok, 1 failed)")
    assert lines[1].startswith("dataset ds-1 (current): 7 of them make its 5 pairs")
    header = next(line for line in lines if line.startswith("task"))
    assert header.split()[:5] == ["task", "hardware", "measured", "failed", "correct"]
    assert all(len(line) <= 100 for line in lines)


def test_the_entry_point_turns_library_progress_bars_off(monkeypatch):
    """`forecast --model models:/.../N` downloads artifacts (MLflow) and loads weights
    (transformers): their bars are off for every command, before any of them is imported."""
    from orchestration.cli_common import QUIET_LIBRARIES_ENV

    for key in QUIET_LIBRARIES_ENV:
        monkeypatch.delenv(key, raising=False)
    assert runner.invoke(app, ["tasks", "--json"]).exit_code == 0
    import os

    assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "error"


def test_the_report_names_each_champion_with_its_brier_pairs_and_split(tmp_path):
    """The decision lines come first in `kernelcast report` and at the end of a run: the version
    each champion alias names, its kind, its Brier on how many pairs of which split."""
    from orchestration.cli_report import promotion_lines
    from orchestration.settings import load_settings
    from warehouse.db import connect
    from warehouse.promotions import record_promotion_decision

    settings = load_settings("smoke", tmp_path / "home")
    settings.home.mkdir(parents=True)
    assert promotion_lines(settings) == ([], {})  # nothing decided yet
    score = {"kind": "cost_model", "n_pairs": 2952, "parse_rate": 1.0, "uniform_brier": 0.4375, "failed_gates": []}
    with connect(settings.warehouse_path) as con:
        record_promotion_decision(con, "kernelcast-surrogate", "ds-1", "kept", "no gain", 788, {},
                                  [{**score, "model_version": 5, "kind": "llm", "role": "champion", "n_pairs": 788,
                                    "brier": 0.2881}], champion_before=5, champion_after=5, challenger_after=1)
        record_promotion_decision(con, "kernelcast-surrogate", "ds-1", "promoted", "lowest Brier", 2952, {},
                                  [{**score, "model_version": 1, "role": "challenger", "brier": 0.2461}],
                                  champion_after=1, alias="champion-external", split="held_out_styles")
    lines, aliases = promotion_lines(settings)
    assert lines == ["@champion: surrogate/5 (llm), Brier 0.288 on 788 pairs of in_distribution; kept",
                     "@champion-external: surrogate/1 (cost_model), Brier 0.246 on 2,952 pairs of held_out_styles; "
                     "promoted"]
    assert aliases == {"models:/kernelcast-surrogate/5": ["champion"],
                       "models:/kernelcast-surrogate/1": ["challenger", "champion-external"]}
