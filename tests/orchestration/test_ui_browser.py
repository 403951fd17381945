"""The UIs as a user sees them, in headless Chromium: `kernelcast ui` on free ports over a small
home made here (one MLflow training run, two registered versions, the reports and promotion
materialised on the home's Dagster instance), then MLflow's experiment list (the project's
experiments, no GenAI welcome page, no Default), the registered model with its aliases, a run
page reached through the HTML report's link, Dagster's asset page and the run that made the
report, and the report's pages. Assertions read the pages' text (DOM), never pixels.

The same `kernelcast ui`, started on a new home, is then stopped with SIGTERM: it served Dagster
(through `dg dev`) and MLflow on 127.0.0.1, quietly (their own output goes to a log file under
$KERNELCAST_HOME/logs), and stops both cleanly. One start serves both checks: starting the two
UIs is most of either's time.

The browser tests run where /usr/bin/chromium and the playwright package exist (Debian's
`chromium` package; playwright drives it, its own browser download is not used); skipped
elsewhere, where the serving test still runs. The screenshots go to $KERNELCAST_UI_SHOTS when set
(docs/images/ for docs/ui.md), else to the test's folder.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from orchestration.links import answers, free_port

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]
NAME = "kernelcast-surrogate"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]

try:
    from playwright import sync_api as playwright_api
except ImportError:  # the browser tests skip; the serving test does not need it
    playwright_api = None


def in_browser(test):
    """Mark a test that drives Chromium: skipped where playwright or /usr/bin/chromium is missing."""
    for mark in (pytest.mark.browser,
                 pytest.mark.skipif(playwright_api is None, reason="the playwright package drives Chromium"),
                 pytest.mark.skipif(not CHROMIUM.is_file(), reason="needs /usr/bin/chromium")):
        test = mark(test)
    return test


def _peaked(y: int, peak: float) -> list[float]:
    p = [(1 - peak) / 7] * 8
    p[y - 1] = peak
    return p


def _fill_home(settings) -> None:
    """What a run leaves, made small: a training run and two versions with eval forecasts, then the
    report and promotion materialised on the home's Dagster instance (the one the UI reads)."""
    import dagster as dg
    import mlflow
    import polars as pl
    from asset_runs import materialize

    from models.bins import speedup_to_bin
    from models.registry.tracking import mlflow_experiment
    from models.registry.versions import register_logged_model
    from orchestration.definitions import build_defs
    from warehouse.datasets import write_dataset
    from warehouse.db import connect
    from warehouse.forecasts import write_forecast_listing, write_forecasts

    uri = settings.mlflow_uri
    mlflow.set_tracking_uri(uri)
    experiment = mlflow_experiment(mlflow.MlflowClient(uri), uri, "kernelcast-training")
    versions = []
    for i, kind in enumerate(("cost_model", "text_model")):
        with mlflow.start_run(experiment_id=experiment, run_name=f"fit-{kind}",
                              tags={"dagster_run_id": f"fit-run-{i}", "kind": kind}) as run:
            mlflow.log_metric("calibration_nll", 1.5 - i / 10)
            model = mlflow.create_external_model(name=f"{kind}-{i}", experiment_id=experiment)
        versions.append(register_logged_model(uri, f"models:/{model.model_id}", NAME, run_id=run.info.run_id, kind=kind))
    pairs = []
    for i in range(32):
        s = 2.0 ** ((i % 8) - 3.5)
        pairs.append({"pair_id": f"p{i:02d}", "task": "softmax" if i % 2 else "rms_norm", "hardware_id": "h",
                      "anchor_kernel_id": "ref", "candidate_kernel_id": f"k{i}", "speedup": s,
                      "true_bin": speedup_to_bin(s), "pair_type": "reference", "split": "eval"})
    pairs = pl.DataFrame(pairs)
    rows = []
    for pid, y in pairs.select("pair_id", "true_bin").rows():
        for ref, p in (("baseline:uniform", [1 / 8] * 8), ("baseline:oracle", _peaked(y, 1.0)),
                       (f"models:/{NAME}/{versions[0]}", _peaked(y, 0.7)),
                       (f"models:/{NAME}/{versions[0]}|source_only", _peaked(y, 0.5)),
                       (f"models:/{NAME}/{versions[1]}", _peaked(y, 0.5)),
                       (f"models:/{NAME}/{versions[1]}|source_only", _peaked(y, 0.4))):
            rows.append({"pair_id": pid, "model_ref": ref, "parse_ok": True, "p": p, "raw_sum": 1.0,
                         "predicted_bin": int(max(range(8), key=p.__getitem__)) + 1})
    with connect(settings.warehouse_path) as con:
        write_dataset(con, "ds-ui", "d", {}, [], pairs)
        write_forecasts(con, pl.DataFrame(rows))
    ids = pairs["pair_id"].to_list()
    listing = {"held_out_task": None,
               "pairs": {"in_distribution": ids, "source_only": ids, "held_out_task": [], "external": []},
               "empty": {"held_out_task": "no held-out task", "external": "no kernel outside the templates"},
               "forecasters": [{"model_ref": r, "kind": "baseline", "split": s, "source": "reference", "run_id": ""}
                               for r in ("baseline:uniform", "baseline:oracle") for s in ("in_distribution", "source_only")]
               + [{"model_ref": f"models:/{NAME}/{v}", "kind": k, "split": "in_distribution", "source": "registry",
                   "run_id": mlflow.MlflowClient(uri).get_model_version(NAME, str(v)).run_id}
                  for v, k in zip(versions, ("cost_model", "text_model"), strict=True)]}
    with connect(settings.warehouse_path) as con:
        write_forecast_listing(con, "ds-ui", listing)
    run = materialize(build_defs(settings),
                      dg.AssetSelection.assets("calibration_report", "utility_report", "model_promotion"),
                      dg.DagsterInstance.get())
    assert run.success, [e.message for e in run.all_events if e.is_failure]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`kernelcast ui` on free ports, started on a new home: (settings, dagster port, mlflow port,
    the process). Both UIs answer when it is handed out."""
    from orchestration.settings import load_settings

    home = tmp_path_factory.mktemp("ui") / "home"
    saved = {k: os.environ.get(k) for k in ("KERNELCAST_HOME", "KERNELCAST_PROFILE", "DAGSTER_HOME",
                                            "KERNELCAST_LIBRARY_DIR", "KERNELCAST_MLFLOW_PORT")}
    os.environ.pop("KERNELCAST_LIBRARY_DIR", None)
    os.environ.pop("KERNELCAST_MLFLOW_PORT", None)
    settings = load_settings("smoke", home)
    dport, mport = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "orchestration.cli", "ui", "--profile", "smoke",
                             "--dagster-port", str(dport), "--mlflow-port", str(mport)],
                            cwd=REPO, env={**os.environ, "KERNELCAST_HOME": str(home), "KERNELCAST_PROFILE": "smoke"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 420  # starting took over 3 minutes on a busy shared 2-core machine
        while not ((home / "ui.json").is_file() and answers(f"http://127.0.0.1:{mport}/health")
                   and answers(f"http://127.0.0.1:{dport}/server_info")):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "kernelcast ui did not start"
            time.sleep(0.5)
        yield settings, dport, mport, proc
    finally:
        if proc.poll() is None:  # the last test stops it itself
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def filled(served):
    """The served home filled while the UI serves (the report's links name its ports, ui.json):
    (settings, dagster port, mlflow port)."""
    from orchestration.runner import prepare_home

    settings, dport, mport, _ = served
    prepare_home(settings)  # DAGSTER_HOME: the instance the UI serves, here too
    _fill_home(settings)
    return settings, dport, mport


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    with playwright_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM), headless=True,
            args=FLAGS, viewport={"width": 1280, "height": 800})
        yield context.new_page()
        context.close()


def _shot(page, tmp_path: Path, name: str) -> None:
    folder = Path(os.environ.get("KERNELCAST_UI_SHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"))


def _dismiss(page, selector: str) -> bool:
    """Close a first-visit panel the way a user does (MLflow's assistant, Dagster's community
    dialog); True when there was one."""
    try:
        page.locator(selector).first.click(timeout=5000)
    except playwright_api.Error:
        return False
    page.wait_for_timeout(300)
    return True


def _text_when(page, needle: str, timeout_s: float = 30) -> str:
    """The page's text once it contains `needle` (single-page apps render after load)."""
    page.wait_for_function("n => document.body && document.body.innerText.includes(n)", arg=needle,
                           timeout=timeout_s * 1000)
    return page.inner_text("body")


@in_browser
def test_mlflow_opens_on_the_project_and_shows_the_aliases_and_runs(filled, page, tmp_path):
    from models.registry.tracking import experiments_url, model_url

    settings, dport, mport = filled
    page.goto(experiments_url(mport))
    text = _text_when(page, "kernelcast-training")
    # the assistant panel opens once on a first visit to localhost (no server option turns it off)
    _dismiss(page, '[data-component-id="mlflow.assistant.chat_panel.close"], button[aria-label="Close"]')
    _shot(page, tmp_path, "mlflow-experiments")
    assert "kernelcast-evaluation" in text and "Default" not in text.split()
    assert "#/experiments" in page.url  # not redirected to the GenAI home page

    page.goto(model_url(NAME, mport))
    text = _text_when(page, "challenger-external")
    page.mouse.wheel(0, 600)  # to the versions table and its aliases column
    page.wait_for_timeout(500)
    _shot(page, tmp_path, "mlflow-model-aliases")
    for alias in ("champion", "challenger", "champion-external", "challenger-external"):
        assert re.search(rf"@\s*{alias}(\s|$)", text), alias  # promotion set both pairs

    table = json.loads((settings.reports_dir / "ds-ui" / "forecasters.table.json").read_text())
    row = next(r for r in table["forecasters"] if r.get("run_id"))
    assert row["mlflow_url"].startswith(f"http://127.0.0.1:{mport}/")  # the report links this server
    page.goto(row["mlflow_url"])
    text = _text_when(page, "dagster_run_id")
    _shot(page, tmp_path, "mlflow-run")
    assert row["dagster_run_id"] in text and row["run_id"] in page.url
    assert "Evaluation runs" not in text  # the classic-ML view of a training run, not GenAI's


@in_browser
def test_dagster_shows_the_assets_and_the_run_that_made_the_report(filled, page, tmp_path):
    settings, dport, _ = filled
    page.goto(f"http://127.0.0.1:{dport}/assets/model_promotion")
    _text_when(page, "model_promotion", timeout_s=60)
    _dismiss(page, 'button:has-text("Skip")')  # Dagster's "Join the community" dialog, first visit only
    text = _text_when(page, "champion_external_decision_id", timeout_s=60)  # the latest materialisation
    _shot(page, tmp_path, "dagster-asset")
    assert "challenger_external" in text and "promotion_decisions" in text

    table = json.loads((settings.reports_dir / "ds-ui" / "forecasters.table.json").read_text())
    assert table["evaluation_dagster_run_url"].startswith(f"http://127.0.0.1:{dport}/runs/")
    page.goto(table["evaluation_dagster_run_url"])
    text = _text_when(page, "calibration_report", timeout_s=60)
    _shot(page, tmp_path, "dagster-run")
    assert table["evaluation_dagster_run_id"][:8] in text


@in_browser
def test_the_html_report_links_its_pages_and_both_uis(filled, page, tmp_path):
    settings, dport, mport = filled
    index = settings.reports_dir / "ds-ui" / "index.html"
    page.goto(index.as_uri())
    text = page.inner_text("body")
    _shot(page, tmp_path, "report")
    assert "external: empty (no kernel outside the templates)" in text
    assert "Oracle (knows the true bin) recovered = " in text
    hrefs = page.eval_on_selector_all("a", "els => els.map(e => e.getAttribute('href'))")
    assert "source_only/index.html" in hrefs
    assert any(h.startswith(f"http://127.0.0.1:{mport}/#/experiments/") for h in hrefs)  # MLflow runs
    assert any(h.startswith(f"http://127.0.0.1:{dport}/runs/") for h in hrefs)  # Dagster runs
    page.click("text=source only (eval set, generator metadata withheld)")
    assert page.url.endswith("source_only/index.html")
    assert "source only (eval set, generator metadata withheld)" in page.inner_text("h1")


def _get(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except Exception:
        return None


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_ui_serves_both_and_stops_on_sigterm(served):
    """Last in this file: it stops the UI the tests above read."""
    settings, dport, mport, proc = served
    try:
        assert proc.poll() is None
        assert _get(f"http://127.0.0.1:{dport}/server_info") == 200, "Dagster UI did not answer"
        assert _get(f"http://127.0.0.1:{mport}/health") == 200, "MLflow UI did not answer"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "stopped Dagster and MLflow UIs" in out
    lines = [line for line in out.splitlines() if line.strip()]
    # The two URLs, the log, the stop line: no daemon INFO, access log or deprecation warning.
    assert len(lines) == 4, out
    assert f"http://127.0.0.1:{dport}" in lines[0] and f"http://127.0.0.1:{mport}" in lines[1]
    log = Path(lines[2].split("log: ", 1)[1].split()[0])
    assert log.parent == settings.home / "logs" and log.stat().st_size > 0
    time.sleep(1)
    assert not _listening(dport) and not _listening(mport)
