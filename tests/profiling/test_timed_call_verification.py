"""Timed calls a kernel cannot tell from checked ones, verified outputs of timed calls, an integrity
baseline no kernel can re-base, reference timings cached across runs, and identical code measuring
1.00 under every protocol. In process where possible; the worker path (real sandboxed children,
the Triton interpreter) for the hostile kernels."""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pipelines.profiling import (
    audit,
    call_feed,
    clock_checks,
    fresh_values,
    integrity,
    kernel_loading,
    refcache,
    runner,
    taskload,
    timing,
    verdicts,
    verifier,
    verify,
)
from pipelines.profiling.worker import run_batch
from pipelines.profiling.worker_config import WorkerConfig
from warehouse.formats import BATCH_SCHEMA, HARNESS_VERSION

FIXTURES = Path(__file__).parent.parent / "fixtures_kernels"
hostile = taskload.module_from_file(FIXTURES / "hostile.py", "hostile_kernels_timed")


@pytest.fixture
def tiny_task(monkeypatch):
    monkeypatch.setenv(taskload.ENV_VAR, f"tiny_scale={FIXTURES / 'tiny_task.py'}")
    taskload._loaded.pop("tiny_scale", None)
    return taskload.load_task("tiny_scale")


# ---- one call site, new values, outputs drawn after the calls ----------------------------------
RECORDER = "kc_test_stack_recorder"

STACK_KERNEL = f'''
import sys


def custom_kernel(data):
    f, frames = sys._getframe(1), []
    while f is not None:
        frames.append((f.f_code.co_name, f.f_code.co_filename, f.f_lineno, sorted(f.f_locals)))
        f = f.f_back
    sys.modules["{RECORDER}"].stacks.append(frames)
    sys.modules["{RECORDER}"].values.append(data.clone())
    return data * 2.0 + 1.0
'''


@pytest.mark.parametrize("protocol", ["kernelcast", "gpumode"])
def test_checked_warm_up_timed_and_rechecked_calls_have_the_same_stack(tiny_task, tmp_path, monkeypatch, protocol):
    record = types.ModuleType(RECORDER)
    record.stacks, record.values = [], []
    monkeypatch.setitem(sys.modules, RECORDER, record)
    path = tmp_path / "k.py"
    path.write_text(STACK_KERNEL)
    m = runner.Measurer({"device": "cpu", "protocol": protocol, "max_reps": 3, "timed_variants": 1024})
    result = m.measure({"path": str(path), "task": "tiny_scale"}, lambda phase: None)
    assert result["status"] == "ok", result["error"]
    n_cases = len(tiny_task.correctness_cases)
    assert len(record.stacks) > 2 * n_cases + 3  # checks, warm-up, timed calls, re-check
    assert all(s == record.stacks[0] for s in record.stacks)  # names, files, lines, local names
    assert not any(name.startswith("time_") for name, *_ in record.stacks[0])
    # every call ran on values of its own (no two the same), in buffers of the case's shape
    first = [v for v in record.values if v.shape == record.values[0].shape]
    assert len({tuple(v[:4].tolist()) for v in first}) == len(first)
    phases = result["phases"]
    assert phases["timing_s"] > 0 and phases["timed_verify_s"] > 0 and phases["verifier_s"] > 0


IDLES_WHEN_TIMED = '''
import torch

_seen = {}


def custom_kernel(data):
    n = _seen[data.numel()] = _seen.get(data.numel(), 0) + 1
    if data.numel() == 37 and n > 1:  # the second case has no re-check: after its check, no work
        return torch.zeros_like(data)  # no work (zeros, not empty_like: freed memory may hold the right values)
    return data * 2.0 + 1.0
'''


def test_a_kernel_right_when_checked_and_wrong_when_timed_fails_on_a_timed_output(tiny_task, tmp_path):
    path = tmp_path / "k.py"
    path.write_text(IDLES_WHEN_TIMED)
    m = runner.Measurer({"device": "cpu", "protocol": "kernelcast", "max_reps": 3})
    result = m.measure({"path": str(path), "task": "tiny_scale"}, lambda phase: None)
    assert result["status"] == "failed" and "(a timed call)" in result["error"], result["error"]
    assert result["check_s"] is not None  # its checks passed; the parent's settle calls this tampered


ONE_BUFFER = '''
import torch

_out = torch.empty(1 << 12)


def custom_kernel(data):  # every call writes the same buffer, as a captured CUDA graph does
    return torch.mul(data, 2.0, out=_out[: data.numel()]).add_(1.0)
'''


def test_a_kernel_that_returns_one_buffer_every_call_is_judged_on_what_each_call_returned(tiny_task, tmp_path):
    """Re-check and timed outputs wait for the verifier until every case is timed: what is judged is
    a copy taken when the call returned, not the buffer later calls wrote over."""
    path = tmp_path / "k.py"
    path.write_text(ONE_BUFFER)
    m = runner.Measurer({"device": "cpu", "protocol": "kernelcast", "max_reps": 3})
    result = m.measure({"path": str(path), "task": "tiny_scale"}, lambda phase: None)
    assert result["status"] == "ok", result["error"]
    assert not verify.pending()


def test_a_kernel_wrong_on_its_first_case_fails_after_its_checks_and_is_never_timed(tiny_task, tmp_path):
    path = tmp_path / "k.py"
    path.write_text("def custom_kernel(data):\n    return data * 2.0 + (1.0 if data.numel() != 1000 else 3.0)\n")
    m = runner.Measurer({"device": "cpu", "protocol": "kernelcast", "max_reps": 3})
    result = m.measure({"path": str(path), "task": "tiny_scale"}, lambda phase: None)
    assert result["status"] == "failed" and result["failure_kind"] == "incorrect"
    assert "n=1000" in result["error"] and result["phases"]["timing_s"] == 0.0
    assert not verify.pending()


def test_the_feed_keeps_a_uniform_sample_drawn_after_each_call_and_clones_it():
    data = torch.zeros(4)
    variants = {s: torch.arange(4.0) + 10 * s for s in (1, 2, 3)}
    seen_first = {s: 0 for s in variants}
    for _ in range(300):
        feed = call_feed.Feed(data, variants.__getitem__, tuple(variants), keep=1)
        for _ in range(3):
            x = feed.fill()
            assert x is data  # the same buffers, new values
            feed.took(x)  # the output is the input buffer itself: the kept copy must not follow it
            (k,) = feed.kept
            assert torch.equal(k.output, fresh_values.fresh_copy(variants[k.salt], k.draw))  # its input, rebuilt
        seen_first[feed.kept[0].salt] += 1
    # each of the three calls (hence salts, in a random order) is kept about a third of the time
    assert all(60 < n < 140 for n in seen_first.values()), seen_first
    assert len({tuple(call_feed.Feed(data, variants.__getitem__, (1, 2, 3))._order) for _ in range(50)}) > 1


def test_a_sample_as_large_as_the_variants_covers_every_variant_each_time():
    """One verified output for two variants made a kernel just past the tolerance on one variant's
    values `ok` or `incorrect` on the draw; a sample of one per variant decides the same each time."""
    data = torch.zeros(4)
    variants = {s: torch.full((4,), float(s)) for s in (7, 9)}
    for calls in (2, 3, 40):
        for _ in range(50):
            feed = call_feed.Feed(data, variants.__getitem__, tuple(variants), keep=2)
            for _ in range(calls):
                feed.took(feed.fill())
            kept = feed.take_kept()
            assert [k.salt for k in kept] == [7, 9]
            assert all(torch.equal(k.output, fresh_values.fresh_copy(variants[k.salt], k.draw)) for k in kept)
            assert feed.kept == []
    # the GPU default: two variants, one verified output of each; the plan asks for both
    salts, samples = verify.timed_draws("cuda")
    assert (len(salts), samples) == (2, 2)
    assert verify.timed_draws("cuda", {"timed_samples": 3})[1] == 2
    assert verify.timed_draws("cpu") == (tuple(verify.TIMED_SALT_BASE + i for i in range(8)), 1)


WRONG_ON_ONE_VARIANT = """
import torch
from pipelines.profiling import inputs, taskload, verdicts, verifier, verify

_task = taskload.load_task("tiny_scale")


def custom_kernel(data):  # right except on the values of the second timed variant of its case
    case = next(c for c in _task.correctness_cases if c["n"] == data.numel())
    odd = inputs.make_input(_task, case, verify.TIMED_SALT_BASE + 1).sort().values
    mine = data.sort().values  # a timed call's values: the variant's, rolled and scaled by a factor > 0
    from_odd = torch.allclose(mine, odd * (mine[-1] / odd[-1]), rtol=1e-5, atol=1e-6)
    return data * 2.0 + (1.5 if from_odd else 1.0)
"""


def test_a_kernel_wrong_on_one_timed_variant_is_incorrect_every_time(tiny_task, tmp_path):
    path = tmp_path / "k.py"
    path.write_text(WRONG_ON_ONE_VARIANT)
    kinds = []
    for _ in range(6):
        m = runner.Measurer({"device": "cpu", "protocol": "kernelcast", "max_reps": 3,
                             "timed_variants": 2, "timed_samples": 2})
        result = m.measure({"path": str(path), "task": "tiny_scale"}, lambda phase: None)
        kinds.append(result["failure_kind"])
        assert "(a timed call)" in (result["error"] or ""), result
    assert kinds == ["incorrect"] * 6


def test_timed_call_steps_are_planned_and_a_wrong_one_is_tampered(tiny_task):
    plan = verify.verification_plan(tiny_task, "measure", "cpu", "kernelcast")
    cid = [tiny_task.case_id(c) for c in tiny_task.correctness_cases]
    assert plan == [(cid[0], 0), (cid[1], 0), (cid[0], verify.RECHECK_SEED_SALT), (cid[0], verify.TIMED),
                    (cid[1], verify.TIMED)]
    v = verdicts.JobVerdicts(of=5, done=2, failure="case x (a timed call): output: wrong", timed_failure=True)
    out = verdicts.settle({"status": "failed", "failure_kind": "incorrect"}, v)
    assert out["failure_kind"] == "tampered" and "wrong when timed" in out["error"]
    # wrong almost everywhere on a timed call (an idler's empty output) is tampered; one element
    # of 16.8 M a hair past the tolerance on the timed call's own values is incorrect
    for off, kind in (("16000000/16777216", "tampered"), ("1/16777216", "incorrect")):
        v = verdicts.JobVerdicts(of=5, done=4, failure=f"case x (a timed call): output: {off} elements off",
                               timed_failure=True)
        assert verdicts.settle({"status": "ok"}, v)["failure_kind"] == kind


def test_the_verifier_accepts_a_timed_output_only_on_a_timed_salt(tiny_task, tmp_path, monkeypatch):
    from pipelines.profiling import shipping

    monkeypatch.setenv("KERNELCAST_DEVICE", "cpu")
    v = verifier.Verifier({"device": "cpu", "protocol": "kernelcast", "timed_variants": 4})
    cases = tiny_task.correctness_cases
    base = {"job": "j", "kind": "measure", "task": "tiny_scale"}
    for case in cases:
        f = tmp_path / f"c{len(case)}-{tiny_task.case_id(case)}"
        shipping.write_output(f, tiny_task.ref_kernel(runner.make_input(tiny_task, case)))
        assert v.handle({**base, "case_id": tiny_task.case_id(case), "salt": 0, "path": str(f)})["ok"]
    again = tmp_path / "recheck"
    shipping.write_output(again, tiny_task.ref_kernel(runner.make_input(tiny_task, cases[0], verify.RECHECK_SEED_SALT)))
    assert v.handle({**base, "case_id": tiny_task.case_id(cases[0]), "salt": verify.RECHECK_SEED_SALT,
                     "path": str(again)})["ok"]
    salt, draw = verify.TIMED_SALT_BASE + 3, 2**62 + 12345
    cid = [tiny_task.case_id(c) for c in cases]
    good = tmp_path / "timed"
    timed_input = fresh_values.fresh_copy(runner.make_input(tiny_task, cases[0], salt), draw)
    shipping.write_output(good, tiny_task.ref_kernel(timed_input))
    r = v.handle({**base, "case_id": cid[0], "salt": salt, "path": str(good)})
    assert r["unexpected"]  # a timed call's output names the transform of its input
    r = v.handle({**base, "case_id": cid[0], "salt": salt, "draw": draw, "path": str(good)})
    assert r["ok"] and r["timed_call"]  # judged on the input rebuilt from the salt and the draw
    untransformed = tmp_path / "untransformed"  # the answer on the base values is not the timed call's
    shipping.write_output(untransformed, tiny_task.ref_kernel(runner.make_input(tiny_task, cases[1], salt)))
    r = v.handle({**base, "case_id": cid[1], "salt": salt, "draw": draw, "path": str(untransformed)})
    assert not r["ok"] and r["timed_call"] and not r.get("unexpected")
    r = v.handle({**base, "case_id": cid[0], "salt": verify.TIMED_SALT_BASE + 4, "draw": draw, "path": str(good)})
    assert r["unexpected"]  # not a salt the timed calls draw from
    other = verifier.Verifier({"device": "cpu", "protocol": "kernelcast"})
    r = other.handle({**base, "case_id": cid[0], "salt": 0, "draw": draw, "path": str(good)})
    assert r["unexpected"]  # a checked call's input has no transform


def test_recorded_cpu_times_are_held_to_a_second_clock():
    clock_checks.check_recorded_cpu((1.0, 1.0), (1.001, 1.002))
    clock_checks.check_recorded_cpu((0.01, 0.01, 0.01), (0.011, 12.3, 0.012))  # descheduled once, outside a record
    with pytest.raises(timing.TimingTampered, match="recorded"):
        clock_checks.check_recorded_cpu((0.2, 0.2, 0.2), (1.0, 1.0, 1.0))  # rewritten to a fifth
    with pytest.raises(timing.TimingTampered, match="long"):
        clock_checks.check_recorded_cpu((10.0, 10.0), (1.0, 1.0))  # a clock that runs fast
    with pytest.raises(timing.TimingTampered, match="timed calls"):
        clock_checks.check_recorded_cpu((1.0,), (1.0, 1.0))  # a record removed


# ---- the integrity baseline --------------------------------------------------------------------
@pytest.fixture
def started_watch(monkeypatch):
    holder = kernel_loading._WatchHolder()
    monkeypatch.setattr(kernel_loading, "WATCH", holder)
    monkeypatch.setattr(kernel_loading, "_STARTED", [])
    w = integrity.Watch()
    holder.watch = w
    kernel_loading._STARTED.append(w)
    return holder


def test_the_watch_cannot_be_switched_off_or_re_based(started_watch, monkeypatch):
    assert kernel_loading.integrity_changes() == []
    started_watch.watch = None  # as a kernel would
    assert started_watch.watch is not None and "integrity watch" in kernel_loading.integrity_changes()[0]
    started_watch.meddled = False
    started_watch.watch.rebase()
    assert "re-base" in kernel_loading.integrity_changes()[0]


def test_class_level_patches_of_harness_methods_are_seen(started_watch, monkeypatch):
    started_watch.watch.rebased = False
    monkeypatch.setattr(runner.Measurer, "time_fn", lambda self, fn, data: None)
    monkeypatch.setattr(timing.Timing, "as_dict", lambda self: {})
    changed = kernel_loading.integrity_changes()
    assert "pipelines.profiling.runner.Measurer.time_fn" in changed
    assert "pipelines.profiling.timing.Timing.as_dict" in changed


def test_a_change_left_at_unload_fails_the_kernel_and_blocks_the_next(started_watch, monkeypatch):
    monkeypatch.setattr(torch, "relu", lambda x: x)  # what a finalizer of the kernel did
    out = kernel_loading._checked_after_unload({"status": "ok", "failure_kind": None})
    assert out["failure_kind"] == "tampered" and out["restart"] and "unloaded" in out["error"]
    with pytest.raises(kernel_loading.KernelFailure) as e:
        kernel_loading.check_state_before_kernel()
    assert e.value.kind == "infrastructure" and e.value.restart


# ---- the hostile kernels of the timed path ---------------------------------------------------
@pytest.mark.slow
def test_timed_call_cheats_are_caught_on_the_cpu_worker_path(tiny_task, tmp_path):
    names = list(hostile.TIMED_CALL_CHEATS)
    rows = [{"kernel_id": n, "task": "tiny_scale", "source": hostile.render(n)} for n in names]
    rows.append({"kernel_id": "good", "task": "tiny_scale", "source": (FIXTURES / "good_torch.py").read_text()})
    batch, out = tmp_path / "batch.parquet", tmp_path / "out.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=BATCH_SCHEMA), batch)
    summary = run_batch(batch, out, WorkerConfig(device="cpu", compile_workers=2, timeout_s=20, max_reps=3))
    got = {r["kernel_id"]: r for r in pq.read_table(out).to_pylist()}
    for name in names:
        r = got[name]
        assert r["status"] == "failed" and r["failure_kind"] in hostile.KINDS[name], f"{name}: {r['error']}"
    assert got["good"]["status"] == "ok" and 0.05 < got["good"]["speedup"] < 20  # not under a patched clock
    assert summary.phases_s["timing_s"] > 0 and summary.phases_s["compile_s"] > 0


def test_a_case_with_fewer_calls_than_outputs_to_verify_is_topped_up_not_tampered(tiny_task, tmp_path):
    """Eight variants, one verified output of each, at most two timed calls a case: the feed is
    topped up with untimed calls through the same call site until the verifier's plan has every
    output it asks for; short of them, an honest kernel would be `tampered`."""
    data = torch.zeros(4)
    variants = {s: torch.full((4,), float(s)) for s in range(8)}
    feed = call_feed.Feed(data, variants.__getitem__, tuple(variants), keep=8)
    feed.took(feed.fill())
    timing.drive(lambda x: x.clone(), call_feed.top_up_steps(feed))
    assert [k.salt for k in feed.kept] == list(range(8)) and feed.short_salt() is None
    assert all(torch.equal(k.output, fresh_values.fresh_copy(variants[k.salt], k.draw)) for k in feed.take_kept())

    rows = [{"kernel_id": "good", "task": "tiny_scale", "source": (FIXTURES / "good_torch.py").read_text()}]
    batch, out = tmp_path / "batch.parquet", tmp_path / "out.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=BATCH_SCHEMA), batch)
    run_batch(batch, out, WorkerConfig(device="cpu", compile_workers=1, timeout_s=20, max_reps=2,
                                       timed_variants=8, timed_samples=8))
    (row,) = pq.read_table(out).to_pylist()
    assert row["status"] == "ok", row["error"]


# ---- reference timings cached across runs ------------------------------------------------------
def _t(ms: float, cid: str = "a") -> dict:
    return {"case_id": cid, "median_ms": ms, "mean_ms": ms, "stderr_ms": 0.0, "reps": 10}


def test_reference_cache_hit_miss_and_invalidation(tmp_path):
    path = tmp_path / "reference-timings.json"
    c = refcache.RefCache(path)
    assert c.bind("h200-x", "harness-4", "kernelcast") == {}  # miss: no file yet
    t0 = time.time()
    c.record("softmax", [_t(2.0), _t(3.0, "b")], now=t0)
    again = refcache.RefCache(path)
    assert again.bind("h200-x", "harness-4", "kernelcast")["softmax"][0]["median_ms"] == 2.0  # hit
    assert again.freshness("softmax", 60.0, now=t0 + 30) == {"a": "fresh", "b": "fresh"}
    assert again.freshness("softmax", 60.0, now=t0 + 100) == {"a": "stale", "b": "stale"}  # drift: time again
    assert again.freshness("rms_norm", 60.0, now=t0 + 30) == {}
    other = refcache.RefCache(path)
    assert other.bind("h200-x", "harness-4", "gpumode") == {} and other.bind("a100", "harness-4", "kernelcast") == {}
    newer = refcache.RefCache(path)
    assert newer.bind("h200-x", "harness-5", "kernelcast") == {}  # another harness: never used
    newer.record("softmax", [_t(9.0)], now=t0 + 1)
    doc = json.loads(path.read_text())
    assert {e["harness_version"] for e in doc["entries"]} == {"harness-5"}  # the old ones dropped


def test_a_corrupt_or_stale_cache_is_empty(tmp_path, caplog):
    path = tmp_path / "r.json"
    path.write_text("{not json")
    assert refcache.RefCache(path).bind("h", "v", "kernelcast") == {}
    assert "ignored" in caplog.text
    c = refcache.RefCache(path, max_age_s=10.0)
    c.bind("h", "v", "kernelcast")
    c.record("t", [_t(1.0)], now=0.0)  # long ago
    assert refcache.RefCache(path, max_age_s=10.0).bind("h", "v", "kernelcast") == {}


@pytest.mark.slow
def test_a_second_worker_run_takes_its_reference_timings_from_the_cache(tiny_task, tmp_path):
    source = (FIXTURES / "good_torch.py").read_text()
    cfg = WorkerConfig(device="cpu", compile_workers=1, timeout_s=20, max_reps=3, ref_refresh_s=600,
                       ref_cache=str(tmp_path / "reference-timings.json"))
    for run in (1, 2):
        batch = tmp_path / f"b{run}.parquet"
        pq.write_table(pa.Table.from_pylist([{"kernel_id": f"k{run}", "task": "tiny_scale",
                                              "source": source + f"\n# {run}\n"}], schema=BATCH_SCHEMA), batch)
        summary = run_batch(batch, tmp_path / f"out{run}.parquet", cfg)
        row = summary.rows[0]
        assert row["status"] == "ok" and row["harness_version"] == HARNESS_VERSION
        if run == 1:
            first_ref = row["ref_median_ms"]
            assert summary.ref_cache["timings_taken"] == 3 * len(tiny_task.correctness_cases)
        else:
            assert summary.ref_cache["timings_taken"] == 0  # all fresh in the cache: none timed
            assert row["ref_median_ms"] == first_ref and summary.phases_s["reference_s"] < 0.05


# ---- identical code, every protocol ------------------------------------------------------------
# The reference advances a clock of its own by 3 ms a call and the test makes it the timer's clock:
# on a shared CPU a real clock jitters by tens of percent, this one only moves inside calls of
# the reference, so whatever the harness does differently for a kernel and for the reference
# (other calls, another statistic, another loop) shows as a ratio other than 1.
CLOCK_TASK = '''
import torch

from pipelines.tasks.contract import Task, allclose_check, default_device

CLOCK = [1000.0]


def generate_input(seed, n):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(n, generator=g).to(default_device())


def ref_kernel(data):
    CLOCK[0] += 0.003
    return data * 2.0 + 1.0


def check_implementation(data, output):
    return allclose_check(output, data * 2.0 + 1.0, rtol=1e-5, atol=1e-5)


TASK = Task(name="clocked", description="y = 2x + 1 in 3 ms of its own clock.", generate_input=generate_input,
            ref_kernel=ref_kernel, check_implementation=check_implementation,
            correctness_cases=({"n": 64, "seed": 1}, {"n": 32, "seed": 2}),
            benchmark_cases=({"n": 64, "seed": 3},), tolerances={"rtol": 1e-5, "atol": 1e-5})
'''


@pytest.mark.parametrize("protocol", ["kernelcast", "paper", "gpumode"])
def test_the_reference_itself_measures_one_under_every_protocol(tmp_path, monkeypatch, protocol):
    """GPU MODE's way: the submission imports the reference and returns its result."""
    task_file = tmp_path / "clocked.py"
    task_file.write_text(CLOCK_TASK)
    monkeypatch.setenv(taskload.ENV_VAR, f"clocked={task_file}")
    taskload._loaded.pop("clocked", None)
    clock = sys.modules[taskload.load_task("clocked").ref_kernel.__module__].CLOCK
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(time, "perf_counter_ns", lambda: int(clock[0] * 1e9))
    monkeypatch.setattr(time, "monotonic_ns", lambda: int(clock[0] * 1e9))
    kernel = tmp_path / "k.py"
    kernel.write_text("from reference import ref_kernel\n\n\ndef custom_kernel(data):\n    return ref_kernel(data)\n")
    m = runner.Measurer({"device": "cpu", "protocol": protocol, "max_reps": 5})
    result = m.measure({"path": str(kernel), "task": "clocked"}, lambda phase: None)
    assert result["status"] == "ok", result["error"]
    book = audit.ReferenceBook()
    book.add("clocked", result["ref_new"])
    fields = audit.timing_fields(result, book, "clocked", protocol, result["case_ids"], 10.0)
    assert fields["case_speedups"] == [pytest.approx(1.0, abs=1e-9)] * len(result["case_ids"])
    assert fields["kernel_reps"] == fields["ref_reps"]  # the same loop, stopped by the same rule


def test_identical_code_rows_are_a_batch_of_the_reference_itself(tmp_path):
    from benchmarks import protocol_bench
    from pipelines.tasks import TASK_MODULES

    rows = protocol_bench.identical_code_rows(TASK_MODULES)
    pq.write_table(pa.Table.from_pylist(rows, schema=BATCH_SCHEMA), tmp_path / "b.parquet")
    assert [r["task"] for r in rows] == list(TASK_MODULES) and len({r["kernel_id"] for r in rows}) == len(rows)
    compile(rows[0]["source"], "k", "exec")


def test_the_cache_file_is_per_host_unless_given_or_off(monkeypatch, tmp_path):
    monkeypatch.delenv(refcache.ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert refcache.default_path() == tmp_path / ".cache" / "kernelcast" / "reference-timings.json"
    monkeypatch.setenv(refcache.ENV, str(tmp_path / "r.json"))
    assert refcache.default_path() == tmp_path / "r.json" and refcache.default_path("x.json") == Path("x.json")
    assert refcache.default_path("off") is None
    monkeypatch.setenv(refcache.ENV, "off")
    assert refcache.default_path() is None


FLAKY_REFERENCE_TASK = '''
import torch

from pipelines.tasks.contract import Task, allclose_check, default_device

FAIL_ON = {"n": 32}  # the reference raises once on the case of this size


def generate_input(seed, n):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(n, generator=g).to(default_device())


def ref_kernel(data):
    if FAIL_ON.get("n") == data.numel():
        del FAIL_ON["n"]
        raise RuntimeError("the GPU is shared (simulated)")
    return data * 2.0 + 1.0


def check_implementation(data, output):
    return allclose_check(output, data * 2.0 + 1.0, rtol=1e-5, atol=1e-5)


TASK = Task(name="flaky_ref", description="y = 2x + 1; the reference fails once.", generate_input=generate_input,
            ref_kernel=ref_kernel, check_implementation=check_implementation,
            correctness_cases=({"n": 64, "seed": 1}, {"n": 32, "seed": 2}),
            benchmark_cases=({"n": 64, "seed": 3}, {"n": 32, "seed": 4}), tolerances={"rtol": 1e-5, "atol": 1e-5})
'''


def test_reference_timings_of_a_failed_job_are_forgotten_by_the_child_too(tmp_path, monkeypatch):
    """Seen on the H200: the reference failed on a job's second case, the parent never got the
    first case's timing, the child kept it and skipped it on the next job, whose good kernel then
    read as a forged reference (`tampered`). The failed call leaves the child's record as it was."""
    task_file = tmp_path / "flaky_ref.py"
    task_file.write_text(FLAKY_REFERENCE_TASK)
    monkeypatch.setenv(taskload.ENV_VAR, f"flaky_ref={task_file}")
    taskload._loaded.pop("flaky_ref", None)
    task = taskload.load_task("flaky_ref")
    m = runner.Measurer({"device": "cpu", "protocol": "kernelcast", "max_reps": 3})
    with pytest.raises(kernel_loading.KernelFailure) as failed:
        m.reference_timings(task, lambda phase: None)
    assert failed.value.kind == "infrastructure" and not any(k[0] == "flaky_ref" for k in m.refs)
    again = m.reference_timings(task, lambda phase: None)
    assert {t["case_id"] for t in again} == {task.case_id(c) for c in m.cases(task)}
    book = audit.ReferenceBook()
    book.add("flaky_ref", again)
    assert all(book.middle("flaky_ref", task.case_id(c)) is not None for c in m.cases(task))
