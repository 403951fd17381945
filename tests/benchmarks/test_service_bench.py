"""The H200 service bench end to end on the CPU path (Triton interpreter): the service starts,
the live search reaches its budget in both modes through it, identical code is measured under
two protocols by services of their own, and the summary says so."""

from __future__ import annotations

import json

import pytest

from benchmarks import service_bench


@pytest.mark.slow
def test_the_service_bench_reaches_every_budget_and_measures_identical_code(tmp_path):
    out = tmp_path / "out"
    rc = service_bench.main(["--out", str(out), "--tasks", "softmax", "--seeds", "1", "--budget", "2",
                             "--identical-tasks", "softmax", "--identical-copies", "1", "--protocols", "kernelcast,gpumode",
                             "--compile-workers", "2", "--device", "cpu", "--deadline-s", "400"])
    rep = json.loads((out / "service-bench.json").read_text())
    assert rc == 0, rep
    assert [r["budget_reached"] for r in rep["live"]["runs"]] == [True, True]
    assert rep["live"]["service_rounds"] >= 2 and rep["live"]["service_kernels"] >= 2
    assert rep["forecaster"].startswith("bin-prior")
    for protocol in ("kernelcast", "gpumode"):
        by_task = rep["identical"][protocol]["by_task"]["softmax"]
        assert by_task["speedups"] and not by_task["failed"], by_task  # measured; 2% is for the GPU's clock
        assert rep["services"][protocol]["exit_code"] == 0 and rep["services"][protocol]["ready_s"] > 0
    assert rep["services"]["kernelcast"]["phases_s"]["timing_s"] > 0


def test_the_bin_prior_comes_from_committed_results(tmp_path):
    prior = service_bench.bin_prior_forecaster(service_bench.REPO / "data" / "measurements" / "h200")
    assert prior is not None
    p = prior.predict_kernels({}, [{"task": "softmax"}, {"task": "no-such-task"}], "h200")
    assert p.shape == (2, 8) and abs(p.sum() - 2.0) < 1e-9
    assert service_bench.bin_prior_forecaster(tmp_path) is None
    assert service_bench.identical_summary([{"task": "t", "status": "ok", "speedup": 1.01, "case_speedups": [1.01]},
                                            {"task": "u", "status": "ok", "speedup": 0.95, "case_speedups": [0.95]}]
                                           ) == {"t": {"speedups": [1.01], "case_speedups": [[1.01]], "failed": [],
                                                       "within_2pct": True},
                                                 "u": {"speedups": [0.95], "case_speedups": [[0.95]], "failed": [],
                                                       "within_2pct": False}}
