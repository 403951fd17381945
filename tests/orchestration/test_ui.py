"""`kernelcast ui` serves Dagster (through `dg dev`) and MLflow on 127.0.0.1, quietly (their own output
goes to a log file under $KERNELCAST_HOME/logs), and stops both cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from orchestration.links import free_port

REPO = Path(__file__).resolve().parents[2]


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
def test_ui_serves_both_and_stops_on_sigterm(tmp_path):
    dport, mport = free_port(), free_port()
    env = {**os.environ, "KERNELCAST_HOME": str(tmp_path / "home"), "KERNELCAST_PROFILE": "smoke"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestration.cli", "ui", "--dagster-port", str(dport), "--mlflow-port", str(mport)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 240
        dagster_ok = mlflow_ok = False
        while time.monotonic() < deadline and not (dagster_ok and mlflow_ok):
            assert proc.poll() is None, proc.stdout.read()
            dagster_ok = dagster_ok or _get(f"http://127.0.0.1:{dport}/server_info") == 200
            mlflow_ok = mlflow_ok or _get(f"http://127.0.0.1:{mport}/health") == 200
            time.sleep(1)
        assert dagster_ok, "Dagster UI did not answer"
        assert mlflow_ok, "MLflow UI did not answer"
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
    assert log.parent == tmp_path / "home" / "logs" and log.stat().st_size > 0
    time.sleep(1)
    assert not _listening(dport) and not _listening(mport)
