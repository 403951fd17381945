"""scripts/ holds thin wrappers: each runs its package module as `python3 -m ...` from the
repository root, so a command written with the script's name keeps working; and the modules a
bare GPU host runs import nothing of the CPU-side stack."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WRAPPERS = {
    "commit_measurements.py": "warehouse.commit",
    "gpu_check_sdpa.py": "models.training.gpu_host.sdpa_check",
}
GPU_HOST_MODULES = ("pipelines.profiling.worker", "benchmarks.profiling", "benchmarks.fault_injection",
                    "benchmarks.harness_bench", "benchmarks.call_times", "benchmarks.third_party_batch",
                    "models.training.gpu_host.sdpa_check")


@pytest.mark.parametrize(("script", "module"), sorted(WRAPPERS.items()))
def test_a_wrapper_runs_its_module(script, module):
    res = subprocess.run([sys.executable, f"scripts/{script}", "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    description = importlib.import_module(module).__doc__.splitlines()[0]
    assert " ".join(description.split()) in " ".join(res.stdout.split())  # argparse re-wraps it


def test_what_the_gpu_host_runs_imports_no_polars_duckdb_dagster_or_mlflow():
    code = (f"import sys; import {', '.join(GPU_HOST_MODULES)}; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('polars', 'duckdb', 'dagster', 'mlflow')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
