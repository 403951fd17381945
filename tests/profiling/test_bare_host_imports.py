"""The GPU-host entry points import with the standard library, numpy, torch, triton and pyarrow
only: a bare H200 host has no polars, duckdb, mlflow, dagster, scikit-learn or LightGBM."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_BLOCKER = """
import importlib.abc, sys
class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in {'polars', 'duckdb', 'mlflow', 'dagster', 'sklearn', 'lightgbm'}:
            raise ImportError('not on a bare GPU host: ' + name)
sys.meta_path.insert(0, _Absent())
import importlib
importlib.import_module(sys.argv[1])
print('imported', sys.argv[1])
"""


@pytest.mark.parametrize("module", [
    "pipelines.forecasting.source_features",
    "pipelines.profiling.worker",
    "benchmarks.call_times",
])
def test_gpu_host_module_imports_without_the_platform_stack(module):
    proc = subprocess.run([sys.executable, "-c", _BLOCKER, module], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"imported {module}" in proc.stdout
