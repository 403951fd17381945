"""The pieces that keep verdicts honest, in process and fast: shipped outputs, the integrity watch,
the verifier's plan, the parent's audit of timings, GPU MODE's timing loop."""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import types
import warnings

import pytest
import torch

from pipelines.profiling import (
    audit,
    clock_checks,
    gpumode_timing,
    integrity,
    shipping,
    timing,
    verdicts,
    verifier,
    verify,
)
from pipelines.tasks import get_task


# ---- shipping ---------------------------------------------------------------------------------
def test_outputs_round_trip_with_structure_and_dtypes(tmp_path):
    out = (torch.randn(3, 5).to(torch.bfloat16), {"scale": torch.arange(4, dtype=torch.int64), "n": 3},
           [torch.randn(2, 2).to(torch.float8_e4m3fn), None, 1.5, "s", True], torch.empty(0, 7))
    path = tmp_path / "out-000001.kco"
    shipping.write_output(path, out)
    back = shipping.read_output(path, "cpu", owner=os.getuid())
    assert torch.equal(back[0], out[0]) and back[0].dtype == torch.bfloat16
    assert torch.equal(back[1]["scale"], out[1]["scale"]) and back[1]["n"] == 3
    assert torch.equal(back[2][0].view(torch.uint8), out[2][0].view(torch.uint8)) and back[2][1:] == [None, 1.5, "s", True]
    assert back[3].shape == (0, 7) and isinstance(back, tuple) and isinstance(back[2], list)


def test_non_contiguous_outputs_keep_their_values(tmp_path):
    x = torch.arange(24.0).reshape(4, 6).t()  # a transposed view
    shipping.write_output(tmp_path / "o", x)
    assert torch.equal(shipping.read_output(tmp_path / "o"), x)


@pytest.mark.parametrize("spoil", ["magic", "header_size", "tensor_size", "dtype", "truncated"])
def test_malformed_output_files_are_refused(tmp_path, spoil):
    path = tmp_path / "o"
    shipping.write_output(path, torch.ones(16))
    data = bytearray(path.read_bytes())
    if spoil == "magic":
        data[:8] = b"PICKLE!!"
    elif spoil == "header_size":
        data[8:16] = (10**9).to_bytes(8, "little")
    elif spoil == "tensor_size":
        data = bytearray(bytes(data).replace(b'"nbytes": 64', b'"nbytes": 6400'))
    elif spoil == "dtype":
        data = bytearray(bytes(data).replace(b'"float32"', b'"object!"'))
    else:
        data = data[:-8]
    path.write_bytes(bytes(data))
    with pytest.raises(shipping.ShippingError):
        shipping.read_output(path)


def test_links_and_other_owners_are_refused(tmp_path):
    target = tmp_path / "real"
    shipping.write_output(target, torch.ones(2))
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(shipping.ShippingError, match="no output file"):
        shipping.read_output(tmp_path / "link")
    with pytest.raises(shipping.ShippingError, match="another user"):
        shipping.read_output(target, owner=os.getuid() + 1)
    with pytest.raises(shipping.ShippingError, match="cannot be checked"):
        shipping.write_output(tmp_path / "x", object())


# ---- the integrity watch ----------------------------------------------------------------------
def test_watch_sees_replaced_functions_and_methods(monkeypatch):
    w = integrity.Watch()
    assert w.changes() == []
    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", lambda self, other: 0.0)
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    changed = w.changes()
    assert "torch.cuda.Event.elapsed_time" in changed and "time.perf_counter" in changed


def test_watch_sees_a_method_added_over_an_inherited_one(monkeypatch):
    w = integrity.Watch()
    monkeypatch.setattr(torch.Tensor, "__mul__", lambda self, other: self, raising=False)
    assert "torch.Tensor.__mul__ (added)" in w.changes()


def test_watch_sees_code_swapped_inside_a_function():
    task_module = __import__("pipelines.tasks.softmax", fromlist=["ref_kernel"])
    w = integrity.Watch(("pipelines.tasks.softmax",))
    code = task_module.ref_kernel.__code__
    try:
        task_module.ref_kernel.__code__ = (lambda data: data[0]).__code__
        assert "pipelines.tasks.softmax.ref_kernel" in w.changes()
    finally:
        task_module.ref_kernel.__code__ = code
    assert w.changes() == []


def test_watch_sees_library_overrides_and_foreign_threads():
    w = integrity.Watch()
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)  # threading.Event.wait: a stdlib target
    t.start()
    foreign = threading.Thread(target=lambda: stop.wait(), daemon=True)  # started by this test's code
    foreign.start()
    try:
        assert any("thread" in c for c in w.changes())
    finally:
        stop.set()
        foreign.join()
        t.join()
    lib = torch.library.Library("aten", "IMPL")
    with pytest.warns(UserWarning, match="Overriding a previously registered kernel"):
        lib.impl("digamma", lambda x: x, "CPU")
    try:
        assert any("aten/digamma/CPU" in c for c in w.changes())
    finally:
        lib._destroy()  # the rest of the test run keeps torch's own digamma
    assert torch.special.digamma(torch.tensor([1.0])).item() == pytest.approx(-0.5772157)


def test_watch_accepts_torch_wrapping_manual_seed_and_not_a_replacement(monkeypatch):
    w = integrity.Watch()
    original = torch.manual_seed

    @functools.wraps(original)
    def wrapped(*a, **k):
        return original(*a, **k)

    monkeypatch.setattr(torch, "manual_seed", wrapped)  # as torch._dynamo does on import
    assert "torch.manual_seed" not in w.changes()
    monkeypatch.setattr(torch, "manual_seed", lambda s: None)
    assert "torch.manual_seed" in w.changes()


def _full_changes(w: integrity.Watch) -> list[str]:
    """What the full comparison names, the quick "nothing changed" test bypassed."""
    quick = w.held.unchanged
    w.held.unchanged = lambda: False
    try:
        return w.changes(limit=1000)
    finally:
        w.held.unchanged = quick


def _closure_function():
    """A watched Python function with a filled closure cell (torch has many: decorated functions)."""
    for name in integrity.WATCHED_MODULES:
        module = sys.modules.get(name)
        for v in list(vars(module).values()) if module is not None else ():
            fn = getattr(v, "__func__", v)
            if isinstance(fn, types.FunctionType) and fn.__closure__ and integrity._filled(fn.__closure__[0]):
                return fn
    pytest.skip("no watched function with a closure in this torch")


def _change(kind: str, monkeypatch):
    from pipelines.profiling import clock_checks, runner, timing

    if kind == "replaced":
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    elif kind == "class method":
        monkeypatch.setattr(runner.Measurer, "time_fn", lambda self, fn, data: None)
    elif kind == "code":
        monkeypatch.setattr(timing.summarize, "__code__", (lambda times_ms: None).__code__)
    elif kind == "defaults":
        monkeypatch.setattr(timing.median_ci_relative, "__defaults__", (1.0,))
    elif kind == "closure":
        cell = _closure_function().__closure__[0]
        old = cell.cell_contents
        cell.cell_contents = object()
        return lambda: setattr(cell, "cell_contents", old)
    elif kind == "deleted":
        monkeypatch.delattr(timing, "geomean")
    elif kind == "added to a class":
        monkeypatch.setattr(torch.Tensor, "__mul__", lambda self, other: self, raising=False)
    elif kind == "module":
        monkeypatch.setitem(sys.modules, "time", types.ModuleType("time"))
    elif kind == "constant":
        monkeypatch.setattr(clock_checks, "WALL_SLACK_S", 1.0)
    elif kind == "trace hook":
        sys.settrace(lambda *a: None)
        return lambda: sys.settrace(None)
    elif kind == "dispatcher":  # a kernel of a hot op replaced on a real backend
        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns where the op had a CPU kernel of its own
            lib.impl("abs", lambda x: x, "CPU")
        return lib._destroy
    return lambda: None


@pytest.mark.parametrize("kind", ["replaced", "class method", "code", "defaults", "closure", "deleted",
                                  "added to a class", "module", "constant", "trace hook", "dispatcher"])
def test_the_quick_test_misses_nothing_the_full_comparison_names(kind, monkeypatch):
    w = integrity.Watch()
    assert w.held.unchanged() and w.changes() == []
    undo = _change(kind, monkeypatch)
    try:
        full = _full_changes(w)
        assert full  # the change is one the watch names
        assert not w.held.unchanged()  # ... so the quick test must not pass it
        assert w.changes(limit=1000) == full
    finally:
        undo()
        monkeypatch.undo()
    assert w.held.unchanged() and w.changes() == []


# ---- the verifier -----------------------------------------------------------------------------
def test_plans_and_their_rechecks():
    task = get_task("softmax")
    ids = [task.case_id(c) for c in task.correctness_cases]
    assert verify.verification_plan(task, "check", "cpu") == [(i, 0) for i in ids] + [(ids[0], verify.RECHECK_SEED_SALT)]
    bench = [task.case_id(c) for c in task.benchmark_cases]
    # after the checks, per timed case: its re-check (where the protocol has one), then the outputs of timed calls
    assert verify.verification_plan(task, "measure", "cuda", "gpumode") == \
        [(i, 0) for i in bench] + [s for i in bench for s in ((i, verify.GPUMODE_SEED_STEP), (i, verify.TIMED))]
    kc = verify.verification_plan(task, "measure", "cuda", "kernelcast", samples=2)
    assert kc[len(bench):len(bench) + 3] == [(bench[0], verify.RECHECK_SEED_SALT)] + [(bench[0], verify.TIMED)] * 2
    assert kc[-1] == (bench[-1], verify.TIMED) and len(kc) == len(bench) + 2 * len(bench) + 1


def test_verifier_judges_shipped_outputs_and_holds_jobs_to_their_plan(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCAST_DEVICE", "cpu")
    task = get_task("softmax")
    v = verifier.Verifier({"device": "cpu", "protocol": "kernelcast"})
    case = task.correctness_cases[0]
    from pipelines.profiling.inputs import make_input

    good = tmp_path / "good"
    shipping.write_output(good, task.ref_kernel(make_input(task, case)))
    base = {"job": "j1", "kind": "check", "task": "softmax", "salt": 0, "case_id": task.case_id(case)}
    assert v.handle({**base, "path": str(good)})["ok"]
    second = task.correctness_cases[1]
    wrong = tmp_path / "wrong"
    shipping.write_output(wrong, torch.zeros(1))
    r = v.handle({**base, "case_id": task.case_id(second), "path": str(wrong)})
    assert not r["ok"] and r["step"] == 2 and "dtype" in r["message"]
    # a request out of plan: the first case again, as if the kernel wanted a second opinion
    r = v.handle({**base, "path": str(good)})
    assert r["unexpected"] and not r["ok"]


def test_a_check_out_of_gpu_memory_is_retried_with_emptied_caches_then_the_harness_failure(tmp_path, monkeypatch):
    """The verifier's own memory running out is never the kernel's `incorrect`: its caches are
    emptied and the check runs again; out of memory twice, the row is `infrastructure`. (No GPU
    here: the input cache raises torch's CUDA out-of-memory error, as it does when a trimul
    input no longer fits beside the measuring child.)"""
    monkeypatch.setenv("KERNELCAST_DEVICE", "cpu")
    task = get_task("softmax")
    v = verifier.Verifier({"device": "cpu", "protocol": "kernelcast"})
    from pipelines.profiling.inputs import make_input

    good = tmp_path / "good"
    cases = task.correctness_cases
    shipping.write_output(good, task.ref_kernel(make_input(task, cases[0])))
    v.cache.peek(task, cases[1])  # something the verifier holds from an earlier check
    assert v.cache.items
    failures = iter([1])  # the next draw of an input fails once

    def drawing(real):
        def draw(*args, **kwargs):
            if next(failures, 0):
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB")
            return real(*args, **kwargs)
        return draw

    monkeypatch.setattr(v.cache, "get", drawing(v.cache.get))
    monkeypatch.setattr(v.cache, "peek", drawing(v.cache.peek))
    base = {"job": "j1", "kind": "check", "task": "softmax", "salt": 0, "case_id": task.case_id(cases[0])}
    r = v.handle({**base, "path": str(good)})
    assert r["ok"] and r["step"] == 1 and not r.get("infrastructure")
    assert all(key[1] != task.case_id(cases[1]) for key in v.cache.items)  # let go before the retry

    failures = iter([1, 1])  # out of memory again after the caches were emptied
    shipping.write_output(good, task.ref_kernel(make_input(task, cases[1])))
    r = v.handle({**base, "case_id": task.case_id(cases[1]), "path": str(good)})
    assert not r["ok"] and r["infrastructure"] and "ran out of GPU memory twice" in r["message"]
    link = verdicts.JobVerdicts(of=2)
    link.infrastructure = r["message"]
    row = verdicts.settle({"status": "failed", "failure_kind": "incorrect", "error": "rejected"}, link)
    assert row["failure_kind"] == "infrastructure"

    # any other error of a check stays the kernel's failure
    monkeypatch.setattr(v.cache, "peek", lambda *a, **k: (_ for _ in ()).throw(ValueError("bad shape")))
    monkeypatch.setattr(v.cache, "get", lambda *a, **k: (_ for _ in ()).throw(ValueError("bad shape")))
    out = v.handle({**base, "job": "j2", "path": str(good)})
    assert not out["ok"] and not out.get("infrastructure") and "check raised ValueError: bad shape" in out["message"]


def test_settle_rules():
    complete = verdicts.JobVerdicts(of=3, done=3)
    assert verdicts.settle({"status": "ok"}, complete)["status"] == "ok"
    partial = verdicts.JobVerdicts(of=3, done=2)
    assert verdicts.settle({"status": "ok"}, partial)["failure_kind"] == "tampered"
    failed = verdicts.JobVerdicts(of=3, done=1, failure="case x: output: wrong")
    assert verdicts.settle({"status": "failed", "failure_kind": "incorrect", "error": "rejected"}, failed)["error"] == \
        "case x: output: wrong"
    odd = verdicts.JobVerdicts(of=3, done=3, unexpected=True)
    assert verdicts.settle({"status": "ok"}, odd)["failure_kind"] == "tampered"
    ours = verdicts.JobVerdicts(of=3, done=1, infrastructure="verifier died")
    assert verdicts.settle({"status": "ok"}, ours)["failure_kind"] == "infrastructure"
    assert verdicts.settle({"status": "failed", "failure_kind": "runtime_error"}, verdicts.JobVerdicts())["failure_kind"] \
        == "runtime_error"


def test_flags_a_gpumode_reference_inherits_are_allow_listed():
    assert verify.clean_flags({"torch.backends.cuda.matmul.allow_tf32": True, "os.system": "rm", "matmul_precision": "x"}) \
        == {"torch.backends.cuda.matmul.allow_tf32": True}
    before = torch.backends.cuda.matmul.allow_tf32
    with verifier.global_flags({"torch.backends.cuda.matmul.allow_tf32": not before}):
        assert torch.backends.cuda.matmul.allow_tf32 is (not before)
    assert torch.backends.cuda.matmul.allow_tf32 is before


# ---- the parent's audit -----------------------------------------------------------------------
def _t(ms: float, reps: int = 10) -> dict:
    return {"median_ms": ms, "mean_ms": ms, "stderr_ms": 0.0, "reps": reps}


def test_audit_refuses_more_device_time_than_wall_time():
    clock = audit.PhaseClock()
    clock.mark("timing reference n=1", 0.0, 0.0)
    clock.mark("timing n=1", 0.1, 0.1)  # 100 ms of wall time for the reference
    ok = {"case_ids": ["n=1"], "kernel_timings": [_t(1.0)], "ref_new": [{"case_id": "n=1", **_t(5.0)}]}
    assert audit.audit_claims(ok, clock, end=0.2) is None  # 50 ms of timed calls in 100 ms: fine
    inflated = {**ok, "ref_new": [{"case_id": "n=1", **_t(45.0)}]}  # 450 ms claimed in 100 ms
    assert "claim" in audit.audit_claims(inflated, clock, end=0.2)
    unseen = {**ok, "case_ids": ["n=2"]}
    assert "never announced" in audit.audit_claims(unseen, clock, end=0.2)
    # gpumode: the reference timed by turns with the kernel's case, in that case's one phase
    # (100 ms): the two claims must fit there together
    paired = audit.PhaseClock()
    paired.mark("timing n=1", 0.0, 0.0)
    paired.mark("recheck n=1", 0.1, 0.1)
    assert audit.audit_claims(ok, paired, end=0.2) is None  # 10 + 50 ms in 100 ms
    both = {**ok, "kernel_timings": [_t(9.0)]}  # 90 + 50 ms claimed in 100 ms: each alone would fit
    assert "timing n=1: the timed calls claim 140.0 ms" in audit.audit_claims(both, paired, end=0.2)
    # a parent busy when the phase began: the phase may have begun as early as 0.0 (read at 0.06)
    late = audit.PhaseClock()
    late.mark("timing reference n=1", 0.0, 0.06)
    late.mark("timing n=1", 0.1, 0.1)
    assert late.windows("timing reference n=1", end=0.2) == [pytest.approx(0.1)]


def test_rows_take_their_reference_from_the_parents_book():
    book = audit.ReferenceBook()
    book.add("t", [{"case_id": "a", **_t(2.0)}, {"case_id": "b", **_t(8.0)}])
    fields = audit.timing_fields({"case_ids": ["a", "b"], "kernel_timings": [_t(1.0), _t(2.0)]}, book, "t",
                                 "kernelcast", ["a", "b"], 10.0)
    assert fields["case_speedups"] == [2.0, 4.0] and fields["speedup"] == pytest.approx(8 ** 0.5)
    assert "not the task's" in audit.timing_fields({"case_ids": ["a"], "kernel_timings": [_t(1.0)]}, book, "t",
                                                   "kernelcast", ["a", "b"], 10.0)
    assert "no reference timing" in audit.timing_fields({"case_ids": ["c"], "kernel_timings": [_t(1.0)]}, book, "t",
                                                        "kernelcast", ["c"], 10.0)


# ---- GPU MODE's loop and the wall-clock checks --------------------------------------------------
def test_gpumode_loop_reuses_one_input_and_stops_by_its_rule():
    seen = []
    data = torch.ones(4)
    t = gpumode_timing.time_gpumode(lambda d: seen.append(d) or d, data, device="cpu", max_repeats=100)
    assert all(x is data for x in seen) and 3 <= t.reps <= 100 and t.stat("gpumode") == t.mean_ms
    calls = iter(range(1000))
    uneven = gpumode_timing.time_gpumode(lambda d: time.sleep(0.001 if next(calls) % 2 else 0.004), data, device="cpu",
                                 max_repeats=5)
    assert uneven.reps == 5  # the cap: calls this uneven never reach a 0.1% error in 5


class _LyingEvent:
    """An event whose elapsed time is a tenth of the truth (a side stream the events miss)."""

    def __init__(self, enable_timing: bool = False):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) * 1e3 / 10


def test_events_far_below_the_wall_clock_are_tampering(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _LyingEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(clock_checks, "trusted_call_times", lambda: (0.02, 0.00004))  # our own call: honest
    with pytest.raises(timing.TimingTampered, match="wall time"):
        gpumode_timing.time_gpumode(lambda d: time.sleep(0.003), torch.ones(2), device="cuda", max_repeats=5)
    with pytest.raises(timing.TimingTampered):
        clock_checks.check_chunk_wall([50.0, 50.0], wall_s=0.01)  # 100 ms of events in 10 ms
    clock_checks.check_call_wall(event_ms=1.0, wall_s=0.0012)  # a call's honest overhead passes


def test_a_shared_gpu_is_told_apart_from_a_kernel_working_off_its_stream():
    """On a GPU another process uses, every synchronised call waits for the other's work: a
    call of our own is as far off as the kernel's, and the row is `infrastructure`, not `tampered`."""
    from pipelines.profiling.kernel_loading import classify

    slow_ours, fast_ours = (lambda: (0.07, 0.0025)), (lambda: (0.07, 0.0001))
    with pytest.raises(timing.GpuShared, match="another process") as e:
        clock_checks.check_kernel_wall(event_ms=0.07, wall_s=0.0025, trusted=slow_ours)
    assert classify(e.value, "cuda", "timing case c").kind == "infrastructure"
    with pytest.raises(timing.TimingTampered) as e:
        clock_checks.check_kernel_wall(event_ms=0.07, wall_s=0.0025, trusted=fast_ours)
    assert classify(e.value, "cuda", "timing case c").kind == "tampered"
    calls = []
    with pytest.raises(timing.TimingTampered):  # events longer than the wall: a patched timer, always
        clock_checks.check_kernel_wall(event_ms=50.0, wall_s=0.01, trusted=lambda: calls.append(1) or (0.07, 0.0025))
    assert calls == []
    clock_checks.check_kernel_wall(event_ms=1.0, wall_s=0.0012, trusted=slow_ours)  # honest: ours not even asked


def test_layers_that_keep_cuda_from_starting_are_dropped_with_their_reason(monkeypatch):
    """On a GPU host (an H200 VM) Landlock and the network and PID namespaces kept the CUDA
    driver from starting; the probe drops such layers one by one and says why. There is no GPU
    here, so the jailed probe is replaced by one that fails while any of them is on."""
    from pipelines.profiling import layer_probe, sandbox_policy

    def fake_probe(policy, device, uid):
        fragile = [x for x in layer_probe.CUDA_FRAGILE_LAYERS if x in policy.layers]
        if fragile:
            return None, {}, "cuInit: error 304"
        return [x for x in policy.layers if x != "uid"], {}, ""

    monkeypatch.setattr(layer_probe, "_probe_once", fake_probe)
    monkeypatch.setattr(layer_probe, "_PROBES", {})
    monkeypatch.setenv(layer_probe.MEMO_ENV, "off")
    report = layer_probe.probe(sandbox_policy.SandboxPolicy(), "cuda")
    assert not set(layer_probe.CUDA_FRAGILE_LAYERS) & set(report.layers)
    for layer in layer_probe.CUDA_FRAGILE_LAYERS:
        assert "breaks CUDA initialisation" in report.notes[layer]
    cpu = layer_probe.probe(sandbox_policy.SandboxPolicy(), "cpu")  # on the CPU nothing is dropped for CUDA
    assert all("CUDA" not in v for v in cpu.notes.values())


def test_a_remembered_probe_confirms_in_one_attempt_and_a_stale_memo_probes_again(monkeypatch, tmp_path):
    """Each attempt starts CUDA (seconds on a GPU host): the next worker on the same host starts
    from the layers the last probe had to drop, and falls back to the full probe if the memo no
    longer holds."""
    from pipelines.profiling import layer_probe, sandbox_policy

    broken = set(layer_probe.CUDA_FRAGILE_LAYERS)
    attempts: list[tuple[str, ...]] = []

    def fake_probe(policy, device, uid):
        attempts.append(policy.layers)
        if broken & set(policy.layers):
            return None, {}, "cuInit: error 304"
        return [x for x in policy.layers if x != "uid"], {}, ""

    monkeypatch.setattr(layer_probe, "_probe_once", fake_probe)
    monkeypatch.setenv(layer_probe.MEMO_ENV, str(tmp_path / "memo.json"))
    policy = sandbox_policy.SandboxPolicy()

    monkeypatch.setattr(layer_probe, "_PROBES", {})
    first = layer_probe.probe(policy, "cuda")
    n_first = len(attempts)
    assert n_first >= 1 + len(broken) and (tmp_path / "memo.json").is_file()

    monkeypatch.setattr(layer_probe, "_PROBES", {})  # a new worker process
    second = layer_probe.probe(policy, "cuda")
    assert len(attempts) == n_first + 1 and second == first  # one attempt, the same report

    broken.add("rlimits")  # the memo no longer holds: its one attempt fails, everything is probed again
    monkeypatch.setattr(layer_probe, "_PROBES", {})
    third = layer_probe.probe(policy, "cuda")
    # the memo's one attempt, then a whole probe again (its retries of dropped layers included)
    assert len(attempts) > n_first + 2 and third.layers == ("env", "tmpdir", "pgkill")
    broken.discard("rlimits")

    monkeypatch.setattr(layer_probe, "_host_key", lambda p, d: "another driver")  # another host: not used
    monkeypatch.setattr(layer_probe, "_PROBES", {})
    before = len(attempts)
    assert layer_probe.probe(policy, "cuda") == first and len(attempts) - before == n_first

    (tmp_path / "memo.json").write_text("{not json")  # a corrupt memo is ignored
    monkeypatch.setattr(layer_probe, "_PROBES", {})
    assert layer_probe.probe(policy, "cuda") == first


def test_the_probe_of_a_gpu_host_runs_its_attempts_side_by_side_and_keeps_what_starts(monkeypatch):
    """An H200 VM where the AF_UNIX refusal, Landlock and the PID namespace each keep CUDA from
    starting: one round of attempts side by side (all layers, no fragile one, each fragile one
    alone) and one confirming attempt drop exactly those three, each with its own error."""
    from pipelines.profiling import layer_probe, sandbox_policy

    broken = {"nounix", "landlock", "pidns"}
    attempts: list[tuple[str, ...]] = []

    def fake_probe(policy, device, uid):
        attempts.append(policy.layers)
        bad = sorted(broken & set(policy.layers))
        if bad:
            return None, {}, f"cuInit: error 304 with {','.join(bad)}"
        return [x for x in policy.layers if x != "uid"], {}, ""

    monkeypatch.setattr(layer_probe, "_probe_once", fake_probe)
    monkeypatch.setattr(layer_probe, "_PROBES", {})
    monkeypatch.setenv(layer_probe.MEMO_ENV, "off")
    policy = sandbox_policy.SandboxPolicy()
    fragile = [x for x in layer_probe.CUDA_FRAGILE_LAYERS if x in policy.layers]
    report = layer_probe.probe(policy, "cuda")
    assert len(attempts) == 2 + len(fragile) + 1
    assert broken.isdisjoint(report.layers)
    assert set(fragile) - broken <= set(report.layers)
    for layer in broken:
        assert report.notes[layer] == f"breaks CUDA initialisation on this host (cuInit: error 304 with {layer})"


def test_a_sealed_kernel_cache_folder_keeps_plain_files_only_and_nothing_outside_changes(tmp_path):
    """The worker seals each compile job's Triton cache folder (ours, read-only) before the
    measuring child reads it; a kernel may have planted links there to turn that chown or chmod on
    a file elsewhere: they are removed, and the file they point to keeps its owner and mode."""
    from pipelines.profiling import sandbox_policy

    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    os.chmod(outside, 0o600)
    root = tmp_path / "cache"
    root.mkdir()
    folder = sandbox_policy.kernel_cache_dir(root, None, 0)
    assert folder.parent == root and folder.name.startswith("k-") and len(folder.name) == 26
    (folder / "abc").mkdir()
    (folder / "abc" / "kernel.cubin").write_bytes(b"\x7fELF")
    os.symlink(outside, folder / "abc" / "link.so")
    os.link(outside, folder / "hard.so")
    os.mkfifo(folder / "fifo")
    sandbox_policy.seal_dir(folder)
    assert sorted(p.name for p in folder.rglob("*")) == ["abc", "kernel.cubin"]
    assert oct((folder / "abc" / "kernel.cubin").stat().st_mode & 0o777) == "0o644"
    assert oct(folder.stat().st_mode & 0o777) == "0o755"
    assert outside.read_text() == "secret" and oct(outside.stat().st_mode & 0o777) == "0o600"
    assert folder.name != sandbox_policy.kernel_cache_dir(root, None, 0).name  # names are not predictable
