"""The report's links: every registered version's MLflow run and the Dagster run that made it, on
the ports `kernelcast ui` serves now (ui.json), and footnotes that say what the page shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from orchestration.cli_report import relinked, table_lines
from orchestration.links import UI_STATE, dagster_run_url, live_ports, served_ports
from pipelines.evaluation.report import footnotes, write_report


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_links_follow_the_ui_serving_the_home_and_fall_back_when_it_is_gone(tmp_path, monkeypatch):
    monkeypatch.delenv("KERNELCAST_MLFLOW_PORT", raising=False)
    monkeypatch.delenv("KERNELCAST_DAGSTER_PORT", raising=False)
    assert served_ports(tmp_path) is None and live_ports(tmp_path) == {"dagster": 3000, "mlflow": 5000}
    state = tmp_path / UI_STATE
    state.write_text(json.dumps({"pid": os.getpid(), "dagster_port": 3101, "mlflow_port": 5101}))
    assert live_ports(tmp_path) == {"dagster": 3101, "mlflow": 5101}
    state.write_text(json.dumps({"pid": _dead_pid(), "dagster_port": 3101, "mlflow_port": 5101}))
    assert served_ports(tmp_path) is None  # left behind by a ui that is gone
    state.write_text("{not json")
    assert live_ports(tmp_path) == {"dagster": 3000, "mlflow": 5000}
    monkeypatch.setenv("KERNELCAST_MLFLOW_PORT", "5202")  # a child of `kernelcast ui` itself
    assert live_ports(tmp_path)["mlflow"] == 5202


def _table() -> dict:
    row = {"name": "models:/kernelcast-surrogate/2", "kind": "cost_model", "split": "in_distribution", "n": 4,
           "brier": 0.2, "brier_lo": 0.1, "brier_hi": 0.3, "ece": 0.1, "recovered_mean": 0.9,
           "run_id": "abc", "mlflow_url": "http://127.0.0.1:5000/#/experiments/1/runs/abc",
           "dagster_run_id": "d-123", "dagster_url": dagster_run_url("d-123")}
    return {"dataset_version": "ds-1", "report": "/h/reports/ds-1/index.html",
            "pages": {"in_distribution": "/h/reports/ds-1/index.html", "external": "/h/reports/ds-1/external/index.html"},
            "evaluation_run_id": "ev", "evaluation_run_url": "http://127.0.0.1:5000/#/runs/ev",
            "evaluation_dagster_run_id": "d-9", "evaluation_dagster_run_url": dagster_run_url("d-9"),
            "forecasters": [row, {**row, "split": "external"}]}


def test_the_text_report_names_every_run_and_page_on_the_live_ports():
    table = relinked(_table(), {"dagster": 3101, "mlflow": 5101})
    assert table["forecasters"][0]["mlflow_url"] == "http://127.0.0.1:5101/#/experiments/1/runs/abc"
    assert table["evaluation_dagster_run_url"] == "http://127.0.0.1:3101/runs/d-9"
    text = "\n".join(table_lines(table, links=True))
    assert "  external: /h/reports/ds-1/external/index.html" in text
    assert "evaluation run: ev http://127.0.0.1:5101/#/runs/ev\n  made by Dagster run d-9 http://127.0.0.1:3101/runs/d-9" in text
    # one line per version although it has rows on two splits, then the Dagster run that made it
    assert text.count("run surrogate/2: abc http://127.0.0.1:5101/#/experiments/1/runs/abc\n"
                      "  made by Dagster run d-123 http://127.0.0.1:3101/runs/d-123") == 1
    assert ":5000" not in text and ":3000" not in text


def _result(n: int, brier: float, interval: tuple[float, float]) -> dict:
    return {"n": n, "brier": brier, "intervals": {"brier": list(interval)}, "interval_level": 0.95}


def _evaluated(n: int, peak: float) -> dict:
    """A real evaluation of n pairs (figures need its curves), forecasting the true bin with `peak`."""
    import polars as pl

    from pipelines.evaluation.evaluate import evaluate_forecasts

    rows = []
    for i in range(n):
        y = i % 8 + 1
        p = [(1 - peak) / 7] * 8
        p[y - 1] = peak
        rows.append({"pair_id": f"p{i}", "task": "softmax", "true_speedup": 2.0 ** (y - 4.5),
                     **{f"p{k + 1}": v for k, v in enumerate(p)}})
    return evaluate_forecasts(pl.DataFrame(rows), n_boot=0)


def test_the_html_report_links_both_runs_and_its_footnotes_match_the_table(tmp_path):
    oracle, version = _evaluated(10, 1.0), _evaluated(8, 0.6)
    # the page's numbers as a bootstrap of small pools can give them: a value outside its bracket
    version["intervals"] = {"brier": [version["brier"] + 0.01, version["brier"] + 0.05]}
    results = {"baseline:oracle|held_out_task": {**oracle, "recovered_mean": 0.971},
               "models:/kernelcast-surrogate/2": version}
    runs = {"models:/kernelcast-surrogate/2": {"run_id": "abc", "mlflow_url": "http://127.0.0.1:5101/#/runs/abc",
                                               "dagster_run_id": "d-1234567890", "dagster_url": dagster_run_url("d-1234567890", 3101)}}
    html = write_report(results, tmp_path, runs=runs, made_by=("d-9", dagster_run_url("d-9", 3101))).read_text()
    assert '<a data-ui="mlflow" href="http://127.0.0.1:5101/#/runs/abc" title="abc">abc</a>' in html
    assert '<a data-ui="dagster" href="http://127.0.0.1:3101/runs/d-1234567890" title="d-1234567890">d-123456</a>' in html
    assert 'made by Dagster run <a data-ui="dagster" href="http://127.0.0.1:3101/runs/d-9">d-9</a>' in html
    notes = footnotes(results)
    assert notes[0].startswith("Oracle (knows the true bin) recovered = 0.971: below 1")  # the held-out twin too
    assert "forecasts: 8 for models:/kernelcast-surrogate/2; 10 for baseline:oracle|held_out_task" in notes[1]
    assert notes[2].startswith("Outside their bracket: models:/kernelcast-surrogate/2: Brier.")
    assert all(n in html for n in notes)
    # a table of equal n, each value within its bracket: no such note
    assert footnotes({"a": _result(8, 0.3, (0.2, 0.4)), "b": _result(8, 0.35, (0.3, 0.4))}) == []
