"""benchmarks/forecast.py as on a GPU host: no mlflow, polars, duckdb or dagster, the cost model
from an exported forecaster file; it times its batch and says what it skipped."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCKER = '''
import importlib.abc, sys

class _Bare(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("mlflow", "polars", "duckdb", "dagster"):
            raise ModuleNotFoundError(f"No module named {name!r} (a bare GPU host)")
        return None

sys.meta_path.insert(0, _Bare())
'''


def test_the_benchmark_runs_on_a_host_without_the_stack(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "forecasting"))
    from test_forecasting_models import toy_pairs

    from models.classical import CostModel
    from models.classical.portable import PortableCostModel

    fit, y, l2 = toy_pairs(200, 0)
    model = CostModel(max_iter=20).fit(fit, y, l2)
    (tmp_path / "f.pkl").write_bytes(pickle.dumps(PortableCostModel.from_cost_model(model, name="toy")))
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCKER)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path / 'site'}:{ROOT}", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "forecast.py"), "--forecaster-file",
                          str(tmp_path / "f.pkl"), "--count", "3", "--workers", "1", "--measured-per-s", "1.5",
                          "--json"], capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    (m,) = report["models"]
    assert m["model"].startswith("file:") and m["kind"] == "cost_model" and m["batch"] == 3 and m["per_s"] > 0
    assert m["vs_measured"] == round(m["per_s"] / 1.5, 1)
    assert any("lacks mlflow, polars or duckdb" in s for s in report["skipped"])
    assert any("kernelcast forecast" in s for s in report["skipped"])
