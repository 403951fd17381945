"""The report's links: every registered version's MLflow run and the Dagster run that made it, on
the ports `kernelcast ui` serves now (ui.json), and footnotes that say what the page shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

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


def test_a_home_keeps_the_ports_it_was_last_served_on(tmp_path, monkeypatch):
    """Links made while no UI serves name the ports the home was last served on (ui.json stays
    after the UI stops), and `kernelcast ui` without ports serves there again."""
    from orchestration.links import home_ports, record_ports
    from orchestration.ui import default_ports

    monkeypatch.delenv("KERNELCAST_MLFLOW_PORT", raising=False)
    monkeypatch.delenv("KERNELCAST_DAGSTER_PORT", raising=False)
    assert home_ports(tmp_path) is None and default_ports(tmp_path) == {"dagster": 3000, "mlflow": 5000}
    record_ports(tmp_path, {"dagster": 3001, "mlflow": 5001}, os.getpid())  # serving
    assert served_ports(tmp_path) == live_ports(tmp_path) == {"dagster": 3001, "mlflow": 5001}
    record_ports(tmp_path, {"dagster": 3001, "mlflow": 5001}, None)  # stopped
    assert served_ports(tmp_path) is None
    assert live_ports(tmp_path) == default_ports(tmp_path) == {"dagster": 3001, "mlflow": 5001}
    table = relinked(_table(), live_ports(tmp_path))
    assert table["evaluation_run_url"] == "http://127.0.0.1:5001/#/runs/ev"
    assert table["forecasters"][0]["dagster_url"] == "http://127.0.0.1:3001/runs/d-123"


def _pages(tmp_path, ports_script: str | None = "ui-ports.js"):
    """The split pages of a small evaluation under <tmp>/home/reports/ds-1, written with links on
    the default ports and no promotion decision."""
    from pipelines.evaluation.suite import write_split_reports

    results = {"in_distribution": {"baseline:uniform": _evaluated(8, 0.125), "models:/kernelcast-surrogate/2": _evaluated(8, 0.6)},
               "external": {"baseline:uniform": _evaluated(8, 0.125), "models:/kernelcast-surrogate/2": _evaluated(8, 0.5)}}
    runs = {"models:/kernelcast-surrogate/2": {"run_id": "abcdef123456", "mlflow_url": "http://127.0.0.1:5000/#/runs/abcdef123456",
                                               "dagster_run_id": "d-1234567890", "dagster_url": dagster_run_url("d-1234567890")}}
    out = tmp_path / "home" / "reports" / "ds-1"
    return write_split_reports(results, out, "ds-1", runs, {}, ("d-9", dagster_run_url("d-9")),
                               {"models:/kernelcast-surrogate/2": "cost_model"}, None, ports_script), out


def test_the_pages_read_the_served_ports_and_the_champions_when_opened(tmp_path):
    """What changes after a page is written is read from beside it: the ports from
    reports/ui-ports.js, the champions from promotion.js; each page names the files relative to
    itself, so a moved home keeps them."""
    from orchestration.links import PORTS_SCRIPT, ports_script
    from pipelines.promotion.summary import (
        PROMOTION_SCRIPT,
        Decision,
        PromotionSummary,
        write_promotion_script,
    )

    pages, out = _pages(tmp_path)
    for page in pages.values():
        html = page.read_text()
        here = page.parent
        assert f'<script src="{os.path.relpath(out.parent / PORTS_SCRIPT, here)}"></script>' in html
        assert f'<script src="{os.path.relpath(out / PROMOTION_SCRIPT, here)}"></script>' in html
        assert "No promotion decision yet" in html and "$KERNELCAST_HOME/reports/ds-1/" in html
    (out.parent / PORTS_SCRIPT).write_text(ports_script({"dagster": 3123, "mlflow": 5123}))
    summary = PromotionSummary([Decision("champion", 2, "cost_model", 0.31, 8, "in_distribution", "promoted", "")],
                               {"models:/kernelcast-surrogate/2": ["champion"]})
    assert write_promotion_script(out, summary) == out / PROMOTION_SCRIPT
    assert json.loads((out / PROMOTION_SCRIPT).read_text().split(" = ", 1)[1].rstrip(";\n"))["aliases"] == summary.aliases
    assert write_promotion_script(tmp_path / "no-report", summary) is None


playwright_api = None
try:  # the browser half runs where Debian's chromium and the playwright package are installed
    from playwright import sync_api as playwright_api
except ImportError:
    pass
CHROMIUM = "/usr/bin/chromium"


def _open(page_path, fn):
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--no-first-run",
                                           "--disable-background-networking"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(page_path.as_uri())
            page.wait_for_load_state("load")
            return fn(page)
        finally:
            browser.close()


def _hrefs(page) -> list[str]:
    return page.eval_on_selector_all("a[data-ui]", "els => els.map(e => e.href)")


@pytest.mark.browser
@pytest.mark.skipif(playwright_api is None or not os.path.exists(CHROMIUM), reason="needs playwright and /usr/bin/chromium")
def test_in_a_browser_the_links_follow_the_served_ports_and_a_moved_home_shows_its_path(tmp_path):
    import shutil

    from orchestration.links import PORTS_SCRIPT, ports_script
    from pipelines.promotion.summary import Decision, PromotionSummary, write_promotion_script

    pages, out = _pages(tmp_path)
    page = pages["in_distribution"]
    # no UI serving: the links as written (the home's ports then), no champion
    hrefs, text = _open(page, lambda p: (_hrefs(p), p.inner_text("body")))
    assert hrefs and all(h.startswith(("http://127.0.0.1:5000/", "http://127.0.0.1:3000/")) for h in hrefs)
    assert "No promotion decision yet" in text

    # `kernelcast ui --dagster-port 3123 --mlflow-port 5123` serves; promotion decided after the page
    (out.parent / PORTS_SCRIPT).write_text(ports_script({"dagster": 3123, "mlflow": 5123}))
    write_promotion_script(out, PromotionSummary(
        [Decision("champion", 2, "cost_model", 0.31, 8, "in_distribution", "promoted", "")],
        {"models:/kernelcast-surrogate/2": ["champion", "challenger-external"]}))
    moved = tmp_path / "elsewhere" / "home"
    shutil.copytree(tmp_path / "home", moved)
    shutil.rmtree(tmp_path / "home")
    for split in ("in_distribution", "external"):
        at = moved / pages[split].relative_to(tmp_path / "home")

        def read(p):
            return (_hrefs(p), p.inner_text("#decisions"), p.inner_text("#report-path"),
                    p.eval_on_selector_all('tr[data-ref="models:/kernelcast-surrogate/2"] td.alias span',
                                           "els => els.map(e => e.textContent)"),
                    p.evaluate("document.documentElement.scrollWidth"),
                    p.evaluate("document.querySelector('table.headline').getBoundingClientRect().right"))
        hrefs, decisions, shown, badges, width, table_right = _open(at, read)
        assert len(hrefs) == 3  # the version's MLflow and Dagster runs, the Dagster run that wrote the page
        assert {h.split("/")[2] for h in hrefs} == {"127.0.0.1:5123", "127.0.0.1:3123"}, hrefs
        assert "surrogate/2 (cost_model) @champion Brier 0.310 on the 8 in_distribution pairs" in decisions
        assert badges == ["champion", "challenger (files)"]
        assert shown == str(at)  # the page's own place, not the home it was written in
        assert width <= 1400 and table_right <= 1400  # the first screen: no sideways scroll


def test_a_moved_home_reports_the_pages_where_they_now_are(tmp_path, monkeypatch):
    """The table names its pages under the home it was written in; `kernelcast report`, its
    --json and the pages themselves (above) give the paths of the home they are read from."""
    import shutil

    from typer.testing import CliRunner

    from orchestration.cli import app
    from pipelines.evaluation.forecaster_table import TABLE_FILE
    from pipelines.evaluation.version_report import home_relative
    from warehouse.datasets import register_dataset_version
    from warehouse.db import connect

    pages, out = _pages(tmp_path)
    home = tmp_path / "home"
    with connect(home / "warehouse.duckdb") as con:
        register_dataset_version(con, "ds-1", "c" * 64, {}, [])
    (out / TABLE_FILE).write_text(json.dumps({**_table(), "report": home_relative(pages["in_distribution"], home),
                                              "pages": {s: home_relative(p, home) for s, p in pages.items()}}))
    assert json.loads((out / TABLE_FILE).read_text())["pages"]["external"] == "reports/ds-1/external/index.html"
    moved = tmp_path / "moved" / "home"
    shutil.copytree(home, moved)
    shutil.rmtree(home)
    monkeypatch.setenv("KERNELCAST_HOME", str(moved))
    monkeypatch.delenv("KERNELCAST_MLFLOW_PORT", raising=False)
    monkeypatch.delenv("KERNELCAST_DAGSTER_PORT", raising=False)
    text = CliRunner().invoke(app, ["report", "--profile", "smoke", "--links"])
    assert text.exit_code == 0, text.output
    assert f"report: {moved}/reports/ds-1/index.html" in text.output  # with "(one page per split)" when short
    assert f"  external: {moved}/reports/ds-1/external/index.html" in text.output
    assert str(tmp_path / "home") + "/" not in text.output
    got = json.loads(CliRunner().invoke(app, ["report", "--profile", "smoke", "--json"]).stdout)
    assert got["report"] == str(moved / "reports" / "ds-1" / "index.html")
    assert got["pages"] == {s: str(moved / "reports" / "ds-1" / p.relative_to(out)) for s, p in pages.items()}
