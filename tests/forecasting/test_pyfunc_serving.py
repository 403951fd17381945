"""`mlflow models serve` of a registered version answers a POST with the numbers `kernelcast
forecast` prints for the same files. The server runs as MLflow users start it (--env-manager
local, the model by alias) on a free port, with a home of its own, so it reads the kernels
itself; the test is skipped only where the server cannot start (its error shown)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from test_forecasting_models import toy_pairs

from models.classical import CostModel
from orchestration.links import free_port

ROOT = Path(__file__).resolve().parents[2]
P = [f"p{i}" for i in range(1, 9)]
TORCH_SOFTMAX = ("import torch\n\n\ndef custom_kernel(data):\n    (x,) = data\n"
                 "    return torch.softmax(x.float(), dim=-1).to(torch.bfloat16)\n")
START_S = 240.0  # loading MLflow, the model and its code on two busy cores


def _post(url: str, body: dict, timeout: float) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A cost model registered as @champion-external of a home, served from that alias."""
    from models.classical.registry import log_classical
    from models.registry.versions import set_alias
    from pipelines.forecasting.pyfunc import log_classical_sources_model

    home = tmp_path_factory.mktemp("home")
    uri = f"sqlite:///{home / 'mlflow.db'}"
    fit, y, l2 = toy_pairs(200, 0)
    _, version = log_classical(CostModel(max_iter=30).fit(fit, y, l2), uri, fit.head(4), "kernelcast-surrogate",
                               "ds-test", "in_distribution", model_logger=log_classical_sources_model)
    set_alias(uri, "champion-external", version)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    # as in an activated environment: MLflow starts `uvicorn` from the PATH
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(MLFLOW_TRACKING_URI=uri, KERNELCAST_HOME=str(tmp_path_factory.mktemp("server-home")),
               KERNELCAST_READER_WORKERS="1")
    log = home / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "models", "serve", "-m", "models:/kernelcast-surrogate@champion-external",
             "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port), "-w", "1", "-t", "600"],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(home), start_new_session=True)
    try:
        deadline = time.monotonic() + START_S
        while True:
            if proc.poll() is not None:
                pytest.skip(f"the model server did not start: {log.read_text()[-800:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.skip(f"the model server did not answer within {START_S:.0f} s: {log.read_text()[-800:]}")
            time.sleep(1.0)
        yield f"http://127.0.0.1:{port}", home, version
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and its worker: the group it leads
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_the_served_model_answers_as_the_forecast_command(served, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from orchestration.cli import app
    from pipelines.generation import registry

    url, home, version = served
    sources = {"anchor.py": TORCH_SOFTMAX, "seed.py": registry.render_point(registry.seed_point("softmax")),
               "torch.py": TORCH_SOFTMAX.replace("x.float()", "x.to(torch.float32)"),
               "broken.py": "def custom_kernel(data)\n    return data\n"}
    for name, text in sources.items():
        (tmp_path / name).write_text(text)
    cands = ["seed.py", "torch.py", "broken.py"]
    body = {"dataframe_split": {"columns": ["task", "anchor_source", "candidate_source"],
                                "data": [["softmax", sources["anchor.py"], sources[c]] for c in cands]}}
    status, answer = _post(f"{url}/invocations", body, timeout=600)
    assert status == 200, answer
    rows = answer["predictions"]
    assert len(rows) == 3 and set(rows[0]) == {*P, "expected_log2_speedup", "refused"}
    monkeypatch.setenv("KERNELCAST_HOME", str(home))
    res = CliRunner().invoke(app, ["forecast", "--task", "softmax", "--anchor", str(tmp_path / "anchor.py"),
                                   "--candidate", *(str(tmp_path / c) for c in cands), "--json"])
    assert res.exit_code == 1, res.output  # the broken file is a refused row
    printed = {Path(r["file"]).name: r for r in json.loads(res.stdout)}
    assert {r["model_ref"] for r in printed.values()} == {f"models:/kernelcast-surrogate/{version}"}
    for name, row in zip(cands[:2], rows[:2], strict=True):
        assert row["refused"] is None
        assert np.allclose([row[c] for c in P], printed[name]["p"], rtol=0, atol=1e-12)
        assert row["expected_log2_speedup"] == pytest.approx(printed[name]["expected_log2"], abs=1e-12)
    assert rows[2]["refused"].startswith("candidate: syntax error") and printed["broken.py"]["refused"]
    # bad input is one line and a client error, not a crash
    status, answer = _post(f"{url}/invocations", {"dataframe_split": {"columns": ["task"], "data": [["softmax"]]}},
                           timeout=60)
    assert status == 400 and "anchor_source" in json.dumps(answer)
