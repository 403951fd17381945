"""The live search with the real profiling worker on CPU (--device cpu: Triton interpreter, the
tasks' correctness cases), its resume, and committing what it measured."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.search.live import main
from warehouse import commit
from warehouse.formats import KERNEL_BATCH_SCHEMA, RESULT_SCHEMA

REPO = Path(__file__).resolve().parents[2]


def _args(work: Path, out: Path, *extra: str) -> list[str]:
    return ["--tasks", "softmax", "--modes", "standard,filtered", "--seeds", "1", "--budget", "4",
            "--forecaster", "uniform", "--device", "cpu", "--workdir", str(work), "--out", str(out),
            "--worker-arg=--compile-workers=2", *extra]


@pytest.mark.slow
def test_live_search_on_the_worker_stops_resumes_and_commits(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    # a deadline already past: the runs are set up and logged, nothing is measured
    assert main(_args(work, out, "--deadline-s", "0")) == 0
    first = json.loads((out / "live-search.json").read_text())
    assert first["unfinished_runs"] == 2 and first["kernels_measured"] == 0
    # the same command again: resumes and finishes
    assert main(_args(work, out)) == 0
    rep = json.loads((out / "live-search.json").read_text())
    assert rep["unfinished_runs"] == 0 and rep["stopped"] is None
    assert rep["worker_runs"] == 2  # the root, then step 0 of both runs in ONE worker batch
    for run in rep["runs"]:
        assert run["measurements"] == 4 and run["finished"] == "budget spent"
    assert rep["comparison"]["softmax"]["filtered"]["forecasts_mean"] > 4
    logs = {p.name: p.read_text() for p in (work / "logs").glob("*.jsonl")}
    # once more: nothing left to do, nothing measured again, logs unchanged
    assert main(_args(work, out)) == 0
    again = json.loads((out / "live-search.json").read_text())
    assert again["worker_runs"] == 2 and {p.name: p.read_text() for p in (work / "logs").glob("*.jsonl")} == logs

    results, kernels = pq.read_table(out / "results-live.parquet"), pq.read_table(out / "kernels-live.parquet")
    assert results.schema.equals(RESULT_SCHEMA) and kernels.schema.equals(KERNEL_BATCH_SCHEMA)
    measured = set(results.column("kernel_id").to_pylist())
    assert measured == set(kernels.column("kernel_id").to_pylist()) and len(measured) == rep["kernels_measured"]
    assert all(r["hardware_id"] == "cpu" for r in results.to_pylist())

    # commit next to a copy of the committed kernels: lineage resolves, the warehouse ingest passes
    dest = tmp_path / "dest"
    dest.mkdir()
    for p in (REPO / "data" / "measurements" / "h200").glob("kernels-*.parquet"):
        shutil.copy(p, dest / p.name)
    assert commit.main(["--name", "live-test", "--dest", str(dest), "--kernels", str(out / "kernels-live.parquet"),
                        str(out / "results-live.parquet")]) == 0
    assert (dest / "results-live-test-live.parquet").exists() and (dest / "kernels-live-test.parquet").exists()


def test_live_search_refuses_filtering_without_a_forecaster(tmp_path, capsys):
    code = main(["--tasks", "softmax", "--modes", "filtered", "--device", "cpu", "--workdir", str(tmp_path / "w"),
                 "--out", str(tmp_path / "o")])
    assert code == 2 and "need --forecaster-file" in capsys.readouterr().err


@pytest.mark.slow
def test_gpu_search_round_script_runs_every_stage_on_cpu(tmp_path):
    """scripts/gpu_search_round.sh end to end with KC_DEVICE=cpu: a 2-kernel neighbourhood batch,
    a budget-2 live search, a 2-config autotune (each stage's own tests go further); its files
    are what the round writes to --out."""
    import os

    from pipelines.search import space
    from pipelines.search.measure import write_kernel_batch

    root = space.root_child("softmax")
    kids = space.children("softmax", root)[:2]
    prep, out = tmp_path / "prep", tmp_path / "out"
    out.mkdir()
    write_kernel_batch([space.kernel_record("softmax", c, root.kernel_id) for c in kids], prep / "neighbourhood.parquet")
    env = {**os.environ, "KC_DEVICE": "cpu", "KC_LIVE_TASKS": "softmax", "KC_LIVE_SEEDS": "1",
           "KC_LIVE_BUDGET": "2", "KC_LIVE_WORKDIR": str(tmp_path / "live"), "KC_COMPILE_WORKERS": "2",
           "KC_AUTOTUNE_GRID": "BLOCK_N=256+512;NUM_WARPS=1;NUM_STAGES=1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(["bash", "scripts/gpu_search_round.sh", "--out", str(out), str(prep)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("exit 0") == 3, proc.stdout
    names = sorted(p.name for p in out.iterdir())
    assert names == ["autotune.json", "kernels-live.parquet", "live-search.json", "results-live.parquet",
                     "results-neighbourhood.parquet", "summary-neighbourhood.json"]
    assert pq.read_table(out / "results-neighbourhood.parquet").num_rows == 2
    assert json.loads((out / "autotune.json").read_text())["phases"]["exhaustive"]["benchmarked"] == 2


def test_the_gpu_host_path_imports_no_polars_duckdb_dagster_or_mlflow():
    code = ("import sys; import pipelines.search.live, benchmarks.autotune_demo, pipelines.search.autotune; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('polars', 'duckdb', 'dagster', 'mlflow')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
