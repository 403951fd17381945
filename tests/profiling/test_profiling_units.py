"""Profiling building blocks, in-process and fast: timing maths, task loading, checks, result files."""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from pipelines.profiling import (
    call_feed,
    checked_calls,
    clock_checks,
    compile_child,
    cpu_timing,
    cuda_timing,
    inputs,
    kernel_loading,
    runner,
    taskload,
    timing,
)
from pipelines.profiling.hardware import cpu_fingerprint
from pipelines.profiling.results import ResultStore, now_utc, partial_path
from pipelines.profiling.run_summary import RunSummary
from pipelines.profiling.sandbox_policy import describe_exit, one_line
from pipelines.profiling.worker_config import WorkerConfig
from warehouse.formats import RESULT_SCHEMA

FIXTURES = Path(__file__).parent.parent / "fixtures_kernels"
TINY = f"tiny_scale={FIXTURES / 'tiny_task.py'}"


@pytest.fixture
def tiny_task(monkeypatch):
    monkeypatch.setenv(taskload.ENV_VAR, TINY)
    taskload._loaded.pop("tiny_scale", None)
    return taskload.load_task("tiny_scale")


# ---- timing ---------------------------------------------------------------------------
def test_summarize_median_mean_stderr():
    t = timing.summarize([1.0, 2.0, 3.0, 10.0])
    assert t.median_ms == 2.5 and t.mean_ms == 4.0 and t.reps == 4
    assert t.stderr_ms == pytest.approx(torch.tensor([1.0, 2.0, 3.0, 10.0]).std().item() / 2)
    assert t.stat("kernelcast") == 2.5 and t.stat("paper") == 4.0


def test_geomean_and_bad_values():
    assert timing.geomean([0.5, 2.0]) == pytest.approx(1.0)
    assert timing.geomean([4.0]) == pytest.approx(4.0)
    for bad in ([], [1.0, 0.0], [1.0, math.inf], [-1.0]):
        with pytest.raises(ValueError):
            timing.geomean(bad)


def test_adaptive_stop_rules():
    s = timing.TimingSettings(min_reps=5, max_reps=8, max_case_s=1.0, rse_target=0.01)
    steady = [1.0] * 4
    assert not timing._should_stop(steady, 0.1, s)  # below min_reps
    assert timing._should_stop(steady + [1.0], 0.1, s)  # min_reps reached, zero spread
    noisy = [1.0, 3.0, 1.0, 3.0, 1.0]
    assert not timing._should_stop(noisy, 0.1, s)  # spread too high, time left
    assert timing._should_stop(noisy, 1.5, s)  # time cap
    assert timing._should_stop(noisy + [3.0, 1.0, 3.0], 0.1, s)  # rep cap
    assert not timing._should_stop([5.0, 5.0], 9.9, s)  # the time cap still wants 3 reps
    many = timing.TimingSettings(min_reps=5, max_reps=100, max_case_s=1.0, rse_target=0.01)
    outliers = [1.0] * 20 + [40.0, 60.0]  # the mean's error stays high, the median is settled
    assert not timing._should_stop(outliers, 0.1, many) and timing._should_stop(outliers, 0.1, many, median=True)
    assert not timing._should_stop([1.0, 1.5] * 11, 0.1, many, median=True)  # the median's interval is still wide
    # A 15 us kernel whose median is known to a few tenths of a microsecond: below what CUDA
    # events resolve, so the absolute floor stops it although 0.5% (75 ns) is not reached.
    tiny = [0.0150, 0.0152, 0.0149, 0.0153, 0.0151] * 4
    strict = timing.TimingSettings(min_reps=8, max_reps=1000, max_case_s=1.0, rse_target=0.005)
    assert timing.median_ci_relative(tiny) > 0.005 and timing._should_stop(tiny, 0.1, strict, median=True)
    assert not timing._should_stop(tiny, 0.1, timing.TimingSettings(min_reps=8, max_reps=1000, max_case_s=1.0,
                                                                     rse_target=0.005, floor_ms=0.0), median=True)
    assert not timing._should_stop([x * 100 for x in tiny], 0.1, strict, median=True)  # 1.5 ms: the 0.5% holds


def test_time_cpu_counts_reps_and_clones_for_paper():
    seen = []
    data = torch.zeros(4)
    t = cpu_timing.time_cpu(lambda d: seen.append(d), data, timing.TimingSettings.for_cpu(4), protocol="paper")
    assert t.reps >= 2 and all(x is not data for x in seen)  # paper: a fresh clone every call
    seen.clear()
    cpu_timing.time_cpu(lambda d: seen.append(d), data, timing.TimingSettings.for_cpu(4))
    assert all(x is data for x in seen)  # kernelcast: the same input, no clone in the window


def test_clone_data_is_deep_and_keeps_structure():
    Pair = collections.namedtuple("Pair", "a b")
    data = {"x": Pair(torch.ones(2), [torch.zeros(1), 3]), "k": "s"}
    c = timing.clone_data(data)
    assert isinstance(c["x"], Pair) and c["k"] == "s" and c["x"].b[1] == 3
    c["x"].a.add_(1)
    assert data["x"].a.tolist() == [1.0, 1.0]
    assert timing.data_nbytes(data) == 2 * 4 + 4


def _module_kernel():
    """A kernel of the GPU MODE TriMul template's kind: an nn.Module whose weights require grad,
    so its output carries the autograd graph of the call. Returns the kernel and a weak reference
    to the intermediate that graph saves."""
    import weakref

    saved = {}

    def kernel(x: torch.Tensor) -> torch.Tensor:
        lin = torch.nn.Linear(x.shape[-1], x.shape[-1])
        a = lin(x)
        saved["a"] = weakref.ref(a)
        return a.sigmoid() * a  # the product saves `a` for backward
    return kernel, saved


@pytest.mark.parametrize("keep", ["feed", "check"])
def test_a_kept_output_does_not_keep_the_kernels_autograd_graph_alive(tiny_task, keep):
    """The outputs the harness keeps for the verifier (a timed call's sample, a check's held copy)
    are values only: a plain clone kept every intermediate of the call alive with the graph, which
    ran an H100 out of memory on three TriMul submissions. The plain clone is shown keeping it."""
    import gc

    kernel, saved = _module_kernel()
    x = torch.randn(4, 16)
    out = kernel(x)
    plain = out.clone()
    del out
    gc.collect()
    assert saved["a"]() is not None  # what the harness did before: the copy holds the graph
    del plain
    gc.collect()
    assert saved["a"]() is None

    if keep == "feed":
        feed = call_feed.Feed(x, keep=1)
        feed.took(kernel(x))
        kept = feed.take_kept()[0].output
    else:
        held: list = []
        case = tiny_task.correctness_cases[0]
        runner.drive(kernel, checked_calls.check_steps(tiny_task, case, "cpu", held=held))
        kept = held[0].output
    gc.collect()
    assert saved["a"]() is None, "the kept copy keeps the call's intermediates alive"
    assert kept.grad_fn is None and not kept.requires_grad


def test_keep_output_copies_values_and_containers():
    w = torch.ones(3, requires_grad=True)
    Pair = collections.namedtuple("Pair", "a b")
    out = {"p": Pair(w * 2, [w + 1]), "n": 7}
    kept = timing.keep_output(out)
    assert isinstance(kept["p"], Pair) and kept["n"] == 7
    assert torch.equal(kept["p"].a, torch.full((3,), 2.0)) and torch.equal(kept["p"].b[0], torch.full((3,), 2.0))
    assert not kept["p"].a.requires_grad and kept["p"].a.data_ptr() != out["p"].a.data_ptr()


def test_an_out_of_memory_error_is_read_from_the_device_when_there_is_one(monkeypatch):
    """The message names this process's allocated and cached bytes and the harness's kept inputs,
    which torch's own message loses past the one-line limit. torch.cuda's counters are replaced
    here (no GPU on this machine); without them the message is torch's, as on the CPU."""
    e = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity "
                                    "of 79.18 GiB of which 50.44 MiB is free. Process 512 has 7.78 GiB memory in use.")
    assert kernel_loading._describe(e).startswith("OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB")
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (int(0.25 * gib), int(79.18 * gib)))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 65 * gib)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: 67 * gib)
    monkeypatch.setattr(inputs.CACHE, "items", {("t", "c", 0): (None, int(10.5 * gib))})
    text = kernel_loading._describe(e)
    assert text == ("OutOfMemoryError: CUDA out of memory (asked 512.00 MiB, 0.25 of 79.18 GiB free): this process "
                    "65.00 GiB allocated (10.50 GiB the harness's kept inputs) + 2.00 GiB cached")
    assert len(kernel_loading.classify(e, "cuda", "timing case " + "x" * 100).message) < 300


# ---- tasks and checks -------------------------------------------------------------------
def test_task_override_from_file(tiny_task):
    assert tiny_task.name == "tiny_scale"
    assert taskload.extra_task_modules() == {"tiny_scale": str(FIXTURES / "tiny_task.py")}


def test_task_override_rejects_bad_syntax(monkeypatch):
    monkeypatch.setenv(taskload.ENV_VAR, "no_equals_sign")
    with pytest.raises(ValueError, match="name=module"):
        taskload.extra_task_modules()


def _kernel(name: str):
    return kernel_loading.load_kernel(str(FIXTURES / name))


def test_check_case_accepts_good_and_names_the_wrong_case(tiny_task):
    checked_calls.check_all(tiny_task, _kernel("good_torch.py"), tiny_task.correctness_cases, "cpu")
    with pytest.raises(kernel_loading.KernelFailure) as e:
        checked_calls.check_all(tiny_task, _kernel("wrong_result.py"), tiny_task.correctness_cases, "cpu")
    assert e.value.kind == "incorrect" and "n=1000" in e.value.message


def test_recheck_with_new_seed_catches_cached_results(tiny_task):
    fn = _kernel("cache_by_shape.py")
    case = tiny_task.correctness_cases[0]
    checked_calls.check_case(tiny_task, fn, case, "cpu")  # first sight of the shape: right
    with pytest.raises(kernel_loading.KernelFailure) as e:
        checked_calls.check_case(tiny_task, fn, case, "cpu", salt=runner.RECHECK_SEED_SALT)
    assert e.value.kind == "incorrect" and "recheck" in e.value.message


@pytest.mark.parametrize(
    "name,kind",
    [("syntax_error.py", "compile_failed"), ("no_entry_point.py", "compile_failed"), ("raises.py", "runtime_error")],
)
def test_failure_kinds_in_process(tiny_task, name, kind):
    with pytest.raises(kernel_loading.KernelFailure) as e:
        checked_calls.check_all(tiny_task, _kernel(name), tiny_task.correctness_cases, "cpu")
    assert e.value.kind == kind and "\n" not in e.value.message


def test_torch_flags_are_restored():
    snap = runner.snapshot_torch_flags()
    torch.set_float32_matmul_precision("medium")
    torch.set_default_dtype(torch.float64)
    runner.restore_torch_flags(snap)
    assert torch.get_default_dtype() == snap["default_dtype"]
    assert torch.get_float32_matmul_precision() == snap["matmul_precision"]


# ---- results ---------------------------------------------------------------------------
def _row(kid: str, status: str = "ok", kind: str | None = None, batch: str = "b1", protocol: str = "kernelcast") -> dict:
    return {
        "batch_id": batch, "kernel_id": kid, "task": "tiny_scale", "status": status, "failure_kind": kind,
        "error": None, "case_ids": ["n=1"], "kernel_median_ms": [1.0], "kernel_mean_ms": [1.0],
        "kernel_stderr_ms": [0.01], "kernel_reps": [10], "ref_median_ms": [2.0], "ref_mean_ms": [2.0],
        "ref_stderr_ms": [0.01], "ref_reps": [10], "case_speedups": [2.0], "speedup": 2.0 if status == "ok" else None,
        "needs_recheck": False, "protocol": protocol, "harness_version": "h", "hardware_id": "cpu",
        "hardware_json": "{}", "measured_at": now_utc(), "compile_s": 0.1, "check_s": 0.1, "time_s": 0.1,
    }


def test_result_store_resumes_and_retries_infrastructure(tmp_path):
    out = tmp_path / "r.parquet"
    s = ResultStore(out, "kernelcast")
    s.append(_row("a", batch=s.batch_id))
    s.append(_row("b", "failed", "infrastructure", batch=s.batch_id))
    s.close()
    with open(partial_path(out), "a") as f:
        f.write('{"kernel_id": "torn')  # a kill mid-write
    s2 = ResultStore(out, "kernelcast")
    assert s2.done_ids() == {"a"} and s2.batch_id == s.batch_id  # b is retried, the torn line skipped
    s2.append(_row("c", batch=s2.batch_id))
    s2.finalize()
    table = pq.read_table(out)
    assert table.schema.equals(RESULT_SCHEMA) and sorted(table.column("kernel_id").to_pylist()) == ["a", "c"]
    assert not partial_path(out).exists()
    assert ResultStore(out, "kernelcast").done_ids() == {"a", "c"}  # resumes from the final file too
    with pytest.raises(ValueError, match="protocol"):
        ResultStore(out, "paper")


def test_summary_table_and_fingerprint():
    rows = [_row("a"), _row("b"), _row("c", "failed", "timeout")]
    rows[1]["speedup"] = 4.0
    summary = RunSummary(out_path=Path("x.parquet"), batch_id="b", total=3, measured_now=3, rows=rows, hardware_id="cpu")
    assert summary.by_task() == {"tiny_scale": {"ok": 2, "failed": {"timeout": 1}, "median_speedup": 3.0}}
    assert "tiny_scale" in summary.table() and "3.000" in summary.table()
    fp = cpu_fingerprint()
    assert fp["hardware_id"] == "cpu" and json.dumps(fp)


def test_small_helpers():
    assert describe_exit(-11) == "signal SIGSEGV" and describe_exit(3) == "exit code 3"
    assert one_line("a\n\n b \nc") == "a | b | c" and len(one_line("x" * 1000)) == 300
    with pytest.raises(ValueError):
        WorkerConfig(device="tpu").validate()


# ---- the CUDA code paths, driven by fakes (no GPU here) -----------------------------------
class _FakeEvent:
    """Records host time; elapsed_time in ms like torch.cuda.Event."""

    def __init__(self, enable_timing: bool = False):
        self.t = None

    def record(self, stream=None):
        import time

        self.t = time.perf_counter()

    def elapsed_time(self, other: _FakeEvent) -> float:
        return (other.t - self.t) * 1e3


def test_time_cuda_control_flow_with_fake_events(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    flusher = cuda_timing.L2Flusher(l2_bytes=1 << 20, device="cpu", min_bytes=1 << 16)
    assert flusher.nbytes == 2 << 20  # at least twice the L2
    flushes, calls = [], []
    monkeypatch.setattr(flusher, "flush", lambda: flushes.append(1))
    data = torch.ones(8)
    s = timing.TimingSettings(min_reps=5, max_reps=40, max_case_s=0.5, rse_target=0.5, warmup_ms=0.0)
    t = cuda_timing.time_cuda(lambda d: calls.append(d), data, s, flusher=flusher)
    assert 5 <= t.reps <= 40 and t.median_ms >= 0
    # kernelcast: a flush before every call, warm-up included; then the wall-clock probe's calls
    assert len(flushes) == len(calls) - clock_checks.WALL_CHECK_CALLS
    assert all(c is data for c in calls)
    flushes.clear()
    calls.clear()
    t = cuda_timing.time_cuda(lambda d: calls.append(d), data, s, protocol="paper", flusher=flusher)
    assert not flushes and all(c is not data for c in calls)  # paper: no flush, clone in the window


def test_a_slow_call_gets_one_warm_up_call_and_no_probe_calls(monkeypatch):
    """A call of SLOW_CALL_S or more: one warm-up call, then timed calls synchronised one at a time,
    each held to the wall clock; the probe's extra calls are not made."""
    import time

    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    flusher = cuda_timing.L2Flusher(l2_bytes=1 << 20, device="cpu", min_bytes=1 << 16)
    flushes, calls = [], []
    monkeypatch.setattr(flusher, "flush", lambda: flushes.append(1))
    s = timing.TimingSettings(min_reps=3, max_reps=6, max_case_s=2.0, rse_target=1e-9, warmup_ms=0.0)

    def slow(d):
        calls.append(d)
        time.sleep(1.2 * cuda_timing.SLOW_CALL_S)

    t = cuda_timing.time_cuda(slow, torch.ones(8), s, flusher=flusher)
    assert t.reps == 6 and len(calls) == 1 + 6  # one warm-up call, the timed ones, nothing else
    assert len(flushes) == len(calls)
    assert t.median_ms >= 1e3 * cuda_timing.SLOW_CALL_S


def test_a_slow_call_with_work_outside_its_events_is_tampered(monkeypatch):
    """Work the events do not see (another stream, finished by the device-wide synchronisation)
    is caught on the slow path's own timed calls, as the probe's calls catch it on the fast path."""
    import time

    pending = []
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: pending and (pending.clear(), time.sleep(0.02)))
    monkeypatch.setattr(clock_checks, "trusted_call_times", lambda: (1.0, 1.1e-3))  # our own op: honest
    s = timing.TimingSettings(min_reps=3, max_reps=6, max_case_s=2.0, rse_target=1e-9, warmup_ms=0.0)
    with pytest.raises(timing.TimingTampered, match="wall time"):
        cuda_timing.time_cuda(lambda d: pending.append(1), torch.ones(8), s)


def test_a_failed_wall_check_is_decided_by_new_calls(monkeypatch):
    """A case whose calls read far more wall time than events (a stall of the host or the GPU
    that passed) is checked again on new calls; a kernel that works outside its events on every
    call fails there too."""
    import time

    pending, calls = [], []
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: pending and (pending.clear(), time.sleep(0.01)))
    monkeypatch.setattr(clock_checks, "trusted_call_times", lambda: (1.0, 1.1e-3))  # our own op: honest
    stalled = dict(event_ms=0.05, wall_s=2.4e-3, enqueue_s=0.0, n=3)  # what the case's calls read

    timing.drive(lambda d: calls.append(d), clock_checks.wall_check_steps(call_feed.plain_feed(torch.ones(4)), **stalled))
    assert len(calls) == 3  # honest on the new calls: no verdict

    def side_work(d):
        calls.append(d)
        pending.append(1)

    calls.clear()
    with pytest.raises(timing.TimingTampered, match="wall time"):
        timing.drive(side_work, clock_checks.wall_check_steps(call_feed.plain_feed(torch.ones(4)), **stalled))
    assert len(calls) == 3
    calls.clear()
    timing.drive(side_work, clock_checks.wall_check_steps(call_feed.plain_feed(torch.ones(4)), 5.0, 5.5e-3, 0.0, 3))
    assert not calls  # a check that passes makes no calls


def test_cuda_sticky_errors_ask_for_a_restart():
    f = kernel_loading.classify(RuntimeError("CUDA error: an illegal memory access was encountered"), "cuda", "case n=1")
    assert f.kind == "crashed" and f.restart and f.message.startswith("case n=1: RuntimeError")
    f = kernel_loading.classify(ValueError("bad"), "cpu", "case n=1")
    assert f.kind == "runtime_error" and not f.restart


def test_launch_suppression_restores_launches_and_keeps_tuning_off_disk(monkeypatch):
    """Launches and benchmarks come back after the block; autotune choices stay off the disk for
    good (kernel_loading.keep_tuning_in_memory), as in every child of the harness."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    monkeypatch.setattr(Autotuner, "check_disk_cache", Autotuner.check_disk_cache)  # this test process's own
    run, bench = JITFunction.run, Autotuner.__dict__["do_bench"]
    with compile_child.triton_launches_suppressed():
        assert JITFunction.run is not run and isinstance(Autotuner.__dict__["do_bench"], property)
        assert Autotuner.check_disk_cache is kernel_loading.tune_in_memory  # its 0 ms timings stay here
    assert JITFunction.run is run and Autotuner.__dict__["do_bench"] is bench
    assert Autotuner.check_disk_cache is kernel_loading.tune_in_memory


_WARMUP_IN_A_COMPILE_CHILD = """
import importlib.util, json, sys
from pipelines.profiling import checked_calls, compile_child, kernel_loading, runner, standin
from pipelines.profiling.taskload import load_task

compile_child.COMPILE_INPUTS = "meta"
launched, task = [], load_task("softmax")
with standin.standin_device(on_launch=lambda *a: launched.append(a[1])):
    spec = importlib.util.spec_from_file_location("warmup_kernel", sys.argv[1])
    module = sys.modules["warmup_kernel"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with compile_child.triton_launches_suppressed():
        for case in task.benchmark_cases[:2]:
            module.custom_kernel(compile_child.gpu_looking(compile_child.meta_input(task, case)))
    suppressed = list(launched)
    kernel, programs = next(iter(module._COMPILED.values()))
    kernel[(programs, 1, 1)]()
print(json.dumps({"grids": [p for _, p in module._COMPILED.values()], "suppressed": suppressed,
                  "after": launched}))
"""


def test_a_compile_child_takes_a_launcher_that_warms_up_and_launches_the_compiled_kernel():
    """A launcher that sizes a persistent grid from the device's properties and the compiled
    kernel's registers (`warmup`, `_init_handles`, then `kernel[grid](...)`) compiles on the meta
    inputs of a compile child and launches nothing there: its launch would run on pointers to
    nothing. The stand-in device plays this host's GPU and records any launch that gets through.
    In a process of its own: a compile child compiles, where this one interprets Triton."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from pipelines.profiling import standin

    kernel = Path(__file__).resolve().parents[1] / "fixtures_kernels" / "device_query" / "driver_warmup_softmax.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _WARMUP_IN_A_COMPILE_CHILD, str(kernel)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=Path(runner.__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(got["grids"]) == 2 and all(p % standin.H200.sm_count == 0 for p in got["grids"])
    assert got["suppressed"] == []
    # outside the suppression the compiled kernel's launch reaches the (stand-in) driver
    assert len(got["after"]) == 1 and got["after"][0][0] in got["grids"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_release_cuda_memory_returns_free_blocks_above_the_threshold():
    x = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    del x  # freed, but still reserved by the caching allocator
    reserved = torch.cuda.memory_reserved()
    assert reserved >= 512 * 2**20
    assert compile_child.release_cuda_memory(keep_bytes=reserved) is False  # at the threshold: kept
    assert compile_child.release_cuda_memory(keep_bytes=0) is True
    assert torch.cuda.memory_reserved() < reserved


def test_release_cuda_memory_is_a_no_op_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert compile_child.release_cuda_memory(keep_bytes=0) is False


def test_to_meta_keeps_shape_dtype_strides_and_storage_offset():
    x = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    data = (x, [x[:, 1:].t(), x[2:]], {"scale": 0.5, "y": x.to(torch.bfloat16)})
    meta = compile_child.to_meta(data)
    pairs = [(data[0], meta[0]), (data[1][0], meta[1][0]), (data[1][1], meta[1][1]), (data[2]["y"], meta[2]["y"])]
    for real, m in pairs:
        assert m.device.type == "meta" and m.dtype == real.dtype
        assert (m.shape, m.stride(), m.storage_offset()) == (real.shape, real.stride(), real.storage_offset())
        assert m.data_ptr() % 16 == (real.data_ptr() - real.untyped_storage().data_ptr()) % 16
    assert meta[2]["scale"] == 0.5


def test_meta_input_is_drawn_on_the_meta_device_once_and_restores_the_device_setting(monkeypatch):
    """Compile children need shapes only: the task draws the input on the meta device (no values,
    no seconds of CPU sampling per trimul case in each child), once per case."""
    task = taskload.load_task("softmax")
    case = task.benchmark_cases[0]
    monkeypatch.setenv("KERNELCAST_DEVICE", "cuda")  # as on a GPU host: tasks would place inputs there
    compile_child._META_INPUTS.clear()
    calls = []
    real_generate = inputs.generate

    def counting(task_, case_, salt=0):
        calls.append(__import__("os").environ["KERNELCAST_DEVICE"])
        return real_generate(task_, case_, salt)

    monkeypatch.setattr(inputs, "generate", counting)
    first, second = compile_child.meta_input(task, case), compile_child.meta_input(task, case)
    assert calls == ["meta"]  # generated once, on the meta device
    assert __import__("os").environ["KERNELCAST_DEVICE"] == "cuda"
    flat = [t for t in (first if isinstance(first, (tuple, list)) else [first]) if isinstance(t, torch.Tensor)]
    assert flat and all(t.device.type == "meta" for t in flat)
    assert first is not second


def test_compile_case_leaves_launchers_that_need_values_to_the_measuring_child(monkeypatch):
    import triton

    task = taskload.load_task("softmax")
    case = task.benchmark_cases[0]
    monkeypatch.setattr(compile_child, "COMPILE_INPUTS", "meta")
    seen = []

    def reads_values(data):
        x = data[0] if isinstance(data, (tuple, list)) else data
        seen.append(x.device.type)
        return x.sum().item()  # cannot run on meta tensors

    compile_child._compile_case(reads_values, task, case, {"kernel_id": "k"})  # logged, not a failure
    assert seen == ["meta", "meta"]  # as meta tensors, then as meta tensors that say they are on the GPU

    def bad_triton(data):
        raise triton.compiler.errors.CompilationError("k.py", None, "bad tl.dot shape")

    with pytest.raises(kernel_loading.KernelFailure) as info:
        compile_child._compile_case(bad_triton, task, case, {"kernel_id": "k"})
    assert info.value.kind == "compile_failed"


def test_compile_case_also_builds_what_a_launcher_chooses_on_the_gpu(monkeypatch):
    """A launcher that picks a constexpr by `x.is_cuda` (the fp8_quant family) gets both of its
    variants compiled ahead: on meta tensors, and on the same tensors answering as on the GPU.
    The GPU-looking input keeps the meta input's shapes, strides, alignment and device, so what
    the launcher allocates from it stays shape-only."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    task = taskload.load_task("fp8_quant")
    case = task.benchmark_cases[0]
    monkeypatch.setattr(compile_child, "COMPILE_INPUTS", "meta")
    compile_child._META_INPUTS.clear()
    seen = []

    def launcher(data):
        (x,) = data
        y = x.contiguous()
        out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        seen.append((x.is_cuda, y.is_cuda, out.device.type, native_specialize_impl(BaseBackend, x, False, True, True)))

    compile_child._compile_case(launcher, task, case, {"kernel_id": "k"})
    assert [s[:3] for s in seen] == [(False, False, "meta"), (True, True, "meta")]
    assert seen[0][3] == seen[1][3]  # Triton specialises the pointer alike

    x = compile_child.to_meta(torch.zeros(9, dtype=torch.bfloat16)[1:])
    g = compile_child.gpu_looking((x, {"n": 3}))
    assert g[0].is_cuda and g[0].device.type == "meta" and g[1] == {"n": 3}
    assert (g[0].shape, g[0].stride(), g[0].data_ptr()) == (x.shape, x.stride(), x.data_ptr())


def test_a_compile_child_on_meta_inputs_checks_cuda_without_work_on_the_gpu(tiny_task, monkeypatch):
    """After each kernel a compile child asks whether its CUDA context still works. On meta inputs
    it only synchronises (a sticky error surfaces there): no op of its own reaches the GPU that
    the measuring child times on. On device inputs it also runs and reads back a one-element op."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: calls.append("synchronize"))
    monkeypatch.setattr(torch, "ones", lambda *a, **k: calls.append("op") or torch.full((1,), 1.0))
    assert kernel_loading.cuda_healthy(launch=False) and calls == ["synchronize"]
    calls.clear()
    assert kernel_loading.cuda_healthy() and calls == ["synchronize", "op"]
    monkeypatch.undo()

    asked = []
    monkeypatch.setattr(compile_child, "cuda_healthy", lambda launch=True: asked.append(launch) or True)
    job = {"path": str(FIXTURES / "good_triton.py"), "task": "tiny_scale", "kernel_id": "k"}
    for inputs_kind, launch in (("meta", False), ("device", True)):
        monkeypatch.setattr(compile_child, "COMPILE_INPUTS", inputs_kind)
        monkeypatch.setattr(compile_child, "_compile_case", lambda *a: None)  # no GPU here to compile for
        result = compile_child.run_compile(job, "cuda")
        assert result["ok"], result
        assert asked[-1] is launch


def test_meta_compile_inputs_are_the_gpu_default_and_unphase_the_worker(tmp_path, monkeypatch):
    from pipelines.profiling.sandbox_policy import SKIP_ENV, WANTED_LAYERS
    from pipelines.profiling.worker import _parser
    from pipelines.profiling.worker_config import WorkerConfig
    from pipelines.profiling.worker_loop import _Run

    # A worker probes its sandbox as it starts; for CUDA on a host without a GPU the probe tries
    # again without each layer in turn (over two minutes on 2 cores). No layer bears on what is
    # asserted here, so none is asked for: one start per device.
    monkeypatch.setenv(SKIP_ENV, ",".join(WANTED_LAYERS))

    args = _parser().parse_args(["--batch", "b", "--out", "o", "--compile-inputs", "meta"])
    assert args.compile_inputs == "meta"
    with pytest.raises(ValueError, match="compile-inputs"):
        WorkerConfig(compile_inputs="gpu").validate()

    class NoRows:
        def done_ids(self):
            return set()

    def run(**kw):
        return _Run([], NoRows(), WorkerConfig(**kw), tmp_path, None)

    # meta is the default on a GPU (measured faster on the H200s); device inputs phase the worker
    assert run(device="cuda").compile_inputs == "meta"
    assert run(device="cuda").phased is False
    assert run(device="cpu").compile_inputs == "device"
    assert run(device="cuda", compile_inputs="device").phased is True
    assert run(device="cuda", compile_inputs="meta").phased is False
    assert run(device="cuda", compile_inputs="meta", phased=True).phased is True
    assert run(device="cuda", compile_inputs="meta").base_config["compile_inputs"] == "meta"


def test_a_run_resumed_on_another_gpu_starts_a_new_batch(tmp_path):
    """One batch is one device at ingest: rows kept from a run on another GPU of the same kind
    keep their batch, the new rows get a batch of their own; a warmer GPU is still the same one."""
    import json

    from pipelines.profiling.results import ResultStore

    def fp(uuid: str, temperature: str) -> str:
        return json.dumps({"hardware_id": "nvidia-h200-sm90", "uuid": uuid, "nvidia_smi": {"temperature_gpu": temperature}})

    out = tmp_path / "r.parquet"
    store = ResultStore(out, "kernelcast")
    store.append({"batch_id": store.batch_id, "kernel_id": "k1", "protocol": "kernelcast", "hardware_id": "nvidia-h200-sm90",
                  "hardware_json": fp("gpu-a", "33"), "status": "ok"})
    first = store.batch_id
    again = ResultStore(out, "kernelcast")
    assert again.batch_id == first
    assert not again.continue_on(fp("gpu-a", "41")) and again.batch_id == first
    assert again.continue_on(fp("gpu-b", "33")) and again.batch_id != first


def test_the_autotune_watch_names_each_config_and_stops_an_autotune_past_its_budget(monkeypatch):
    """Each config an autotuner tries is a step of the job (a hang names it); past the budget the
    next config is a `timeout` that says autotune, not the job running on to its step's limit."""
    import time
    from types import SimpleNamespace

    from triton.runtime.autotuner import Autotuner

    tried = []
    monkeypatch.setattr(Autotuner, "_bench", lambda tuner, *a, config, **m: tried.append(config) or [1.0])
    monkeypatch.setattr(Autotuner, "run", Autotuner.run)  # install replaces these too
    monkeypatch.setattr(Autotuner, "check_disk_cache", Autotuner.check_disk_cache)
    watch = kernel_loading.AutotuneWatch(budget_s=0.05)
    watch.install()  # wraps the stub; monkeypatch puts Triton's own back afterwards
    steps = []
    watch.begin(steps.append)
    tuner = SimpleNamespace(base_fn=SimpleNamespace(__name__="ce_fwd"), configs=["c1", "c2", "c3"])
    Autotuner._bench(tuner, config="c1")
    Autotuner._bench(tuner, config="c2")
    assert steps == ["autotune ce_fwd: config 1/3", "autotune ce_fwd: config 2/3"] and tried == ["c1", "c2"]
    time.sleep(0.06)
    with pytest.raises(kernel_loading.KernelFailure) as failure:
        Autotuner._bench(tuner, config="c3")
    assert failure.value.kind == "timeout" and tried == ["c1", "c2"]
    assert "autotune of ce_fwd: its configs took over the 0 s budget (2 of 3 tried)" in str(failure.value)
    watch.begin(None)  # a new job: the budget starts again
    Autotuner._bench(tuner, config="c3")
    assert tried[-1] == "c3"
