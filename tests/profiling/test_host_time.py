"""Harness 14: the host's time per call beside the device time, the label over device times with
the program's speedup (the slower of device and host time per case) beside it, the launch-bound
flag, the host times through the reference book, the cache and ingest; and the tuning pass that
autotunes a kernel on each benchmark case's inputs before its checks."""

from __future__ import annotations

import json
import types

import pyarrow as pa
import pytest

from pipelines.profiling import audit, kernel_loading, refcache, runner
from pipelines.profiling.timing import Timing, drive, host_ms_of


def _t(ms: float, host: float | None = None) -> dict:
    t = {"median_ms": ms, "mean_ms": ms, "stderr_ms": 0.0, "reps": 10}
    return t if host is None else {**t, "host_ms": host}


def test_a_launch_bound_case_keeps_its_device_label_with_the_programs_speedup_beside_it():
    book = audit.ReferenceBook()
    # the reference: 0.10 ms of GPU work, 0.02 ms to launch; 1.0 ms of GPU, 0.03 to launch
    book.add("t", [{"case_id": "a", **_t(0.10, 0.02)}, {"case_id": "b", **_t(1.0, 0.03)}])
    # a wrapper of 0.47 ms of Python around 0.05 ms of GPU work; then a GPU-bound case
    kernel = {"case_ids": ["a", "b"], "kernel_timings": [_t(0.05, 0.47), _t(0.5, 0.47)]}
    fields = audit.timing_fields(kernel, book, "t", "kernelcast", ["a", "b"], 10.0)
    assert fields["case_speedups"] == pytest.approx([2.0, 2.0])
    assert fields["speedup"] == pytest.approx(2.0)
    assert fields["program_speedup"] == pytest.approx((0.10 / 0.47 * 2.0) ** 0.5)
    assert fields["launch_bound"] is True
    assert fields["kernel_host_ms"] == [0.47, 0.47] and fields["ref_host_ms"] == [0.02, 0.03]
    # the same kernel with a fast launcher is GPU-bound: the program sees the label
    quick = {"case_ids": ["a", "b"], "kernel_timings": [_t(0.05, 0.01), _t(0.5, 0.01)]}
    fields = audit.timing_fields(quick, book, "t", "kernelcast", ["a", "b"], 10.0)
    assert fields["speedup"] == pytest.approx(fields["program_speedup"]) and fields["launch_bound"] is False


def test_without_host_times_the_label_is_the_device_time_and_other_protocols_ignore_them():
    book = audit.ReferenceBook()
    book.add("t", [{"case_id": "a", **_t(2.0)}])
    fields = audit.timing_fields({"case_ids": ["a"], "kernel_timings": [_t(1.0)]}, book, "t", "kernelcast", ["a"], 10.0)
    assert fields["speedup"] == 2.0 and fields["kernel_host_ms"] is None and fields["launch_bound"] is False
    book.add("g", [{"case_id": "a", **_t(2.0, 5.0)}])
    fields = audit.timing_fields({"case_ids": ["a"], "kernel_timings": [_t(1.0, 9.0)]}, book, "g", "gpumode", ["a"], 10.0)
    assert fields["speedup"] == fields["program_speedup"] == 2.0  # gpumode's events already cover the host's work


def test_a_host_time_that_is_not_a_time_is_a_malformed_claim():
    clock = audit.PhaseClock()
    clock.mark("timing a", 0.0, 0.0)
    good = {"case_ids": ["a"], "kernel_timings": [_t(1.0, 0.2)]}
    assert audit.audit_claims(good, clock, end=1.0) is None
    for bad in (-1.0, float("nan"), float("inf"), "soon"):
        claim = {"case_ids": ["a"], "kernel_timings": [{**_t(1.0), "host_ms": bad}]}
        assert "malformed kernel timing" in audit.audit_claims(claim, clock, end=1.0)


def test_the_host_time_is_the_covered_issue_time_or_a_lone_call_when_the_call_waits():
    assert host_ms_of([20e-6, 25e-6, 30e-6], [80e-6, 90e-6]) == pytest.approx(0.025)
    # a callable that synchronises inside waits for the cover when issued under it: its lone call decides
    assert host_ms_of([3e-3, 3.1e-3], [1.2e-3, 1.0e-3]) == pytest.approx(1.1)
    assert Timing(1.0, 1.0, 0.0, 3, 0.25).as_dict()["host_ms"] == 0.25
    assert "host_ms" not in Timing(1.0, 1.0, 0.0, 3).as_dict()


def test_host_times_survive_the_reference_cache(tmp_path):
    path = tmp_path / "ref.json"
    cache = refcache.RefCache(path)
    cache.bind("h", "v", "kernelcast")
    cache.record("t", [{"case_id": "a", **_t(1.0, 0.3)}, {"case_id": "b", **_t(2.0)}])
    again = refcache.RefCache(path).bind("h", "v", "kernelcast")
    assert again["t"][0]["host_ms"] == 0.3 and "host_ms" not in again["t"][1]
    doc = json.loads(path.read_text())
    doc["entries"][0]["host_ms"] = -5
    path.write_text(json.dumps(doc))
    assert [e["case_id"] for e in refcache.RefCache(path).bind("h", "v", "kernelcast")["t"]] == ["b"]


def test_the_tuning_pass_calls_the_kernel_once_per_benchmark_case_in_order_and_records_choices(monkeypatch):
    task = types.SimpleNamespace(case_id=lambda c: f"n={c['n']}")
    cases = ({"n": 4}, {"n": 8})
    monkeypatch.setattr(runner, "make_input", lambda task, case: ("input", case["n"]))
    m = runner.Measurer({"device": "cpu", "protocol": "kernelcast"})
    seen, phases = [], []

    def kernel_fn(kernel_name):
        def base():
            pass
        base.__name__ = kernel_name
        return base

    softmax = types.SimpleNamespace(base_fn=kernel_fn("_softmax"), best_config="BLOCK: 64")
    rows = types.SimpleNamespace(base_fn=kernel_fn("_rows"), best_config="BLOCK: 128")

    def fn(data):  # what the autotuners the kernel runs report (kernel_loading.AutotuneWatch.install)
        seen.append(data)
        if data[1] == 4:
            kernel_loading.AUTOTUNE.saw(softmax)
        if data[1] in (4, 8):  # the second case's shape runs only the second kernel
            kernel_loading.AUTOTUNE.saw(rows)
        return data

    kernel_loading.AUTOTUNE.begin(None)
    chosen = drive(fn, m._tuning_steps(task, cases, phases.append))
    assert seen == [("input", 4), ("input", 8)] and phases == ["autotuning on n=4", "autotuning on n=8"]
    assert json.loads(chosen) == {"n=4": {"_rows": "BLOCK: 128", "_softmax": "BLOCK: 64"},
                                  "n=8": {"_rows": "BLOCK: 128"}}
    kernel_loading.AUTOTUNE.begin(None)
    assert drive(fn, m._tuning_steps(task, ({"n": 2},), phases.append)) is None  # no autotuner ran


def test_a_kernel_that_fails_while_tuning_fails_as_on_its_case(monkeypatch):
    task = types.SimpleNamespace(case_id=lambda c: "n=4")
    monkeypatch.setattr(runner, "make_input", lambda task, case: 1)
    m = runner.Measurer({"device": "cpu", "protocol": "kernelcast"})

    def fn(data):
        raise ValueError("bad shape")

    with pytest.raises(kernel_loading.KernelFailure) as e:
        drive(fn, m._tuning_steps(task, ({"n": 4},), lambda p: None))
    assert "autotuning on case n=4" in e.value.message and "bad shape" in e.value.message


def test_result_files_carry_the_host_columns_and_old_files_lack_them():
    from warehouse.formats import RESULT_SCHEMA

    for name, kind in (("kernel_host_ms", pa.list_(pa.float64())), ("ref_host_ms", pa.list_(pa.float64())),
                       ("program_speedup", pa.float64()), ("launch_bound", pa.bool_()), ("autotune_json", pa.string())):
        assert RESULT_SCHEMA.field(name).type == kind
