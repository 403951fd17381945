"""The reference is timed through the kernel's own feed and loop: before each timed call it gets
new values copied into its buffers, and its outputs are sampled after the calls, exactly as the
kernel's are (identical code then takes identical steps; under gpumode it did not). Reference
timings of the earlier format are not reused."""

from __future__ import annotations

import gc
import itertools
import json
import random
import sys
import time

import pytest
import torch

from pipelines.profiling import (
    call_feed,
    gpumode_timing,
    inputs,
    refcache,
    runner,
    taskload,
    timing,
)

RECORDED_TASK = '''
import torch

from pipelines.tasks.contract import Task, allclose_check, default_device

CALLS = []


def generate_input(seed, n):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(n, generator=g).to(default_device())


def ref_kernel(data):
    CALLS.append(round(float(data.sum()), 4))
    return data * 2.0 + 1.0


def check_implementation(data, output):
    return allclose_check(output, data * 2.0 + 1.0, rtol=1e-5, atol=1e-5)


TASK = Task(name="recorded", description="y = 2x + 1, its inputs recorded.", generate_input=generate_input,
            ref_kernel=ref_kernel, check_implementation=check_implementation,
            correctness_cases=({"n": 64, "seed": 1},), benchmark_cases=({"n": 64, "seed": 3},),
            tolerances={"rtol": 1e-5, "atol": 1e-5})
'''

KERNEL = '''import sys

from reference import ref_kernel

CALLS = sys.modules[ref_kernel.__module__].CALLS
CALLS.append("kernel imported")


def custom_kernel(data):
    CALLS.append("K")  # the call of ref_kernel it makes follows: a kernel's call is "K", value
    return ref_kernel(data)
'''


def _sides(calls: list) -> list[str]:
    """Each call after the kernel's import as "K" (the kernel's) or "R" (the reference's own)."""
    sides, after_k = [], False
    for c in calls[calls.index("kernel imported") + 1:]:
        if c == "K":
            after_k = True
        elif c != "kernel imported":
            sides.append("K" if after_k else "R")
            after_k = False
    return sides


def _load_recorded(tmp_path, monkeypatch) -> list:
    task_file = tmp_path / "recorded.py"
    task_file.write_text(RECORDED_TASK)
    monkeypatch.setenv(taskload.ENV_VAR, f"recorded={task_file}")
    taskload._loaded.pop("recorded", None)
    return sys.modules[taskload.load_task("recorded").ref_kernel.__module__].CALLS


@pytest.mark.parametrize("protocol", ["kernelcast", "paper", "gpumode"])
def test_the_reference_gets_new_values_per_timed_call_like_the_kernel(tmp_path, monkeypatch, protocol):
    calls = _load_recorded(tmp_path, monkeypatch)
    kernel = tmp_path / "k.py"
    kernel.write_text(KERNEL)
    m = runner.Measurer({"device": "cpu", "protocol": protocol, "max_reps": 4, "timed_variants": 4,
                         "ref_refresh_s": 1e9})
    phases: list[str] = []
    result = m.measure({"path": str(kernel), "task": "recorded"}, phases.append)
    assert result["status"] == "ok", result["error"]
    if protocol == "gpumode":
        # one timing of the reference per case, taken with the kernel's case, before its re-check
        (cid,) = result["case_ids"]
        assert [t["case_id"] for t in result["ref_new"]] == [cid]
        assert phases[-3:-1] == [f"timing {cid}", f"recheck {cid}"], phases
        marks = calls[calls.index("kernel imported") + 1:]
        reference_calls = [c for c, before in zip(marks, ["K", *marks]) if c not in ("K",) and before != "K"]
    else:
        assert any(p.startswith("timing reference") for p in phases[:phases.index("importing kernel")]), phases
        reference_calls = calls[:calls.index("kernel imported")]
    # Every one of the reference's timings (3, or 1 under gpumode) drew from the timed variants.
    # (The loop then stops by the same rule on a real clock; tests/profiling/test_timed_call_verification.py
    # holds reps and ratios equal on a clock only the reference's calls move.)
    assert len(set(reference_calls)) >= 2, reference_calls


def test_gpumode_times_the_kernel_and_the_reference_by_turns(tmp_path, monkeypatch):
    """Under gpumode the kernel's and the reference's timed calls of a case go by turns of
    PAIRED_TURN_CALLS (1), each turn after a side's first led by one untimed call, so both loops
    meet the same host. 24 timed calls a side: K (checks, GPU MODE's warm-up loop, its obligatory
    call, 1 timed), R (warm-up, obligatory, 1), then 23 turns a side of one untimed and one timed
    call, then the kernel's re-check."""
    assert runner.PAIRED_TURN_CALLS == 1
    calls = _load_recorded(tmp_path, monkeypatch)
    kernel = tmp_path / "k.py"
    kernel.write_text(KERNEL)
    m = runner.Measurer({"device": "cpu", "protocol": "gpumode", "max_reps": 24, "timed_variants": 4,
                         "ref_refresh_s": 1e9})
    result = m.measure({"path": str(kernel), "task": "recorded"}, lambda _: None)
    assert result["status"] == "ok", result["error"]
    assert result["kernel_timings"][0]["reps"] == 24 and result["ref_new"][0]["reps"] == 24
    runs = [(side, len(list(group))) for side, group in itertools.groupby(_sides(calls))]
    # the first two turns' lengths depend on the warm-up loop, which stops on the clock
    assert runs[0][0] == "K" and runs[0][1] >= 3 and runs[1][0] == "R" and runs[1][1] >= 2, runs
    assert runs[2:] == [("K", 2), ("R", 2)] * 23 + [("K", 1)], runs


def test_a_slow_stretch_of_the_host_falls_on_both_loops_taken_call_by_call(monkeypatch):
    """Identical code, a clock only the calls move, and one stretch of the host during which every
    call takes twice as long (H100, 2026-12-05: the means of identical code parted by 2-31% on
    single cases, each by a stretch of 2 to 21 calls, median 9, at a median 2.3 times the median
    call; pipelines/profiling/runner.py, PAIRED_TURN_CALLS). By turns of 10 calls a
    stretch of 5 to 20 calls can fall on one loop's mean; call by call both loops share it."""
    def ratio(turn_calls: int, start_ms: float, length_ms: float) -> float:
        clock = [0.0]
        monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
        monkeypatch.setattr(time, "perf_counter_ns", lambda: int(clock[0] * 1e9))
        monkeypatch.setattr(time, "monotonic_ns", lambda: int(clock[0] * 1e9))
        draws = random.Random(7)  # calls 3% apart at most: both loops go on to 100 calls

        def jitter_ms() -> float:
            return draws.uniform(0.97, 1.03)

        def call(data):
            ms = jitter_ms() * (2.0 if start_ms <= clock[0] * 1e3 < start_ms + length_ms else 1.0)
            clock[0] += ms / 1e3
            return data

        data = torch.ones(4)
        turns = gpumode_timing.Turns(turn_calls)
        loops = [gpumode_timing.gpumode_steps(call_feed.plain_feed(data), device="cpu", max_repeats=100, turns=turns)
                 for _ in range(2)]
        k, r = timing.drive(call, gpumode_timing.interleaved_steps(loops[0], loops[1], call))
        assert k.reps == r.reps == 100
        return r.mean_ms / k.mean_ms

    stretches = [(start, length) for start in range(20, 300, 13) for length in (5.0, 10.0, 20.0)]
    by_ten = [abs(ratio(10, *s) - 1) for s in stretches]
    by_one = [abs(ratio(runner.PAIRED_TURN_CALLS, *s) - 1) for s in stretches]
    assert max(by_ten) > 0.05 and sum(d > 0.02 for d in by_ten) > len(stretches) // 2
    assert max(by_one) <= 0.02, max(by_one)


def test_call_times_record_both_loops_in_the_order_made(tmp_path, monkeypatch, capfd):
    """`worker --call-times`: each gpumode case's timed calls go to the child's log, and
    benchmarks.call_times reads them back, a loop's calls as many as its reps."""
    from benchmarks import call_times

    _load_recorded(tmp_path, monkeypatch)
    kernel = tmp_path / "k.py"
    kernel.write_text(KERNEL)
    m = runner.Measurer({"device": "cpu", "protocol": "gpumode", "max_reps": 12, "ref_refresh_s": 1e9,
                         "call_times": True})
    result = m.measure({"path": str(kernel), "task": "recorded"}, lambda _: None)
    assert result["status"] == "ok", result["error"]
    (tmp_path / "logs").mkdir()
    forged = ("call-times {not json\n" "call-times " + "[" * 5000 + "\n"
              'call-times {"calls": [[0, 1.0, "slow", 1.0, false]]}\n' 'call-times {"calls": [[2, 0, 0, 0, true]]}\n')
    (tmp_path / "logs" / "measure-0001.log").write_text("a kernel's own line\n" + forged + capfd.readouterr().err)
    [record], skipped = call_times.read_call_times(tmp_path / "logs")
    assert skipped == 4  # lines a kernel could write into the same log
    assert record["task"] == "recorded" and record["loops"] == ["kernel", "reference"]
    assert [c[0] for c in record["calls"]] == [0, 1] * 12  # turns of one call
    assert all(c[4] for c in record["calls"][2:]) and not any(c[4] for c in record["calls"][:2])
    assert [c[1] for c in record["calls"]] == sorted(c[1] for c in record["calls"])
    summary = call_times.summarize_case(record)
    assert summary["loops"]["kernel"]["calls"] == result["kernel_timings"][0]["reps"] == 12
    assert summary["loops"]["reference"]["mean_ms"] == pytest.approx(result["ref_new"][0]["mean_ms"], rel=1e-3)
    assert call_times.lines([summary])[1].startswith("recorded")
    assert call_times.main([str(tmp_path / "logs")]) == 0
    assert "4 line(s) tagged 'call-times'" in capfd.readouterr().err
    assert call_times.main([str(tmp_path)]) == 0  # the logs are found below the folder given
    empty = tmp_path / "empty"
    empty.mkdir()
    assert call_times.main([str(empty)]) == 2
    assert "no call times" in capfd.readouterr().err
    assert call_times.main([str(tmp_path / "absent")]) == 2
    assert "absent is not a folder" in capfd.readouterr().err


def test_call_times_tell_a_loops_slow_first_call_from_a_slow_turn():
    """Call by call every timed call but a loop's first opens a turn, so the summary also says
    whether a slow call was the loop's first of the case (on the H100, 14 of 31 were)."""
    from benchmarks import call_times

    # (loop, ms since the first, ms, wall ms, first of a turn): the kernel's first call slow,
    # then the reference's fourth, then two in a row, one of each loop
    took = [3.0, 1.0] + [1.0, 1.0] * 2 + [1.0, 2.0] + [2.5, 2.5] + [1.0, 1.0] * 3
    calls = [[i % 2, float(i), t, t, i >= 2] for i, t in enumerate(took)]
    summary = call_times.summarize_case({"task": "t", "case_id": "c", "calls": calls})
    kernel, reference = summary["loops"]["kernel"], summary["loops"]["reference"]
    assert (kernel["slow_calls"], kernel["slow_first_of_turn"], kernel["slow_first_call"]) == (2, 1, 1)
    assert (reference["slow_calls"], reference["slow_first_of_turn"], reference["slow_first_call"]) == (2, 2, 0)
    assert summary["stretches"] == [{"calls": 1, "by_loop": [1, 0]}, {"calls": 3, "by_loop": [1, 2]}]
    table = call_times.lines([summary])
    assert "2 (1, 1)" in table[1] and "2 (2, 0)" in table[2]


def test_the_worker_refuses_call_times_without_a_log_dir(capsys):
    from pipelines.profiling import worker

    with pytest.raises(SystemExit) as exit_:
        worker.main(["--batch", "b.parquet", "--out", "o.parquet", "--call-times"])
    assert exit_.value.code == 2 and "give --log-dir" in capsys.readouterr().err


def test_reference_timings_of_the_earlier_format_are_timed_again(tmp_path, caplog):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"format": 1, "entries": []}))
    assert refcache.RefCache(path).bind("h", "v", "kernelcast") == {}
    assert f"format 1, this harness writes {refcache.FORMAT}" in caplog.text


def test_input_cache_budget_follows_the_device():
    assert inputs.input_cache_bytes("cpu", 0.3, 24 * 2**30) == 24 * 2**30
    m = runner.Measurer({"device": "cpu", "input_cache_bytes": 2**30})
    assert inputs.CACHE.max_bytes == 2**30
    runner.Measurer({"device": "cpu"})
    assert inputs.CACHE.max_bytes == 24 * 2**30 and m.device == "cpu"


def _toy_loop(n: int, pause_every: int):
    got = []
    for i in range(n):
        if i and i % pause_every == 0:
            yield gpumode_timing.PAUSE
        try:
            got.append((yield i))
        except ValueError:
            got.append("raised")
    return got


def test_interleaved_steps_take_turns_and_keep_each_sides_failures_apart():
    order: list[str] = []

    def kernel(x):
        order.append(f"K{x}")
        if x == 3:
            raise ValueError("the kernel's")  # thrown into the kernel's loop, which records it
        return x * 10

    def reference(x):
        order.append(f"R{x}")
        return -x

    got = timing.drive(kernel, gpumode_timing.interleaved_steps(_toy_loop(5, 2), _toy_loop(3, 2), reference,
                                                        turn=lambda side: order.append(side)))
    assert got == ([0, 10, 20, "raised", 40], [0, -1, -2])
    assert order == ["kernel", "K0", "K1", "reference", "R0", "R1", "kernel", "K2", "K3", "reference", "R2",
                     "kernel", "K4"]

    def broken(x):
        raise RuntimeError("the reference's")

    with pytest.raises(gpumode_timing.ReferenceFailed, match="the reference's"):
        timing.drive(kernel, gpumode_timing.interleaved_steps(_toy_loop(2, 1), _toy_loop(2, 1), broken))


def test_the_cycle_collector_is_off_while_a_case_is_timed_and_back_on_after(tmp_path, monkeypatch):
    """A full collection inside a timed call lengthens it by milliseconds (timing.collector_paused):
    the collector is off for the kernel's and the reference's timed calls, on for the checks and
    the re-check, and on again after the measurement and after a failure."""
    calls = _load_recorded(tmp_path, monkeypatch)
    kernel = tmp_path / "k.py"
    kernel.write_text(KERNEL.replace('    CALLS.append("K")', '    CALLS.append(("gc", __import__("gc").isenabled()))\n    CALLS.append("K")'))
    m = runner.Measurer({"device": "cpu", "protocol": "gpumode", "max_reps": 4, "ref_refresh_s": 1e9})
    result = m.measure({"path": str(kernel), "task": "recorded"}, lambda _: None)
    assert result["status"] == "ok", result["error"]
    states = [c[1] for c in calls if isinstance(c, tuple)]
    checks = 1  # the one correctness case of the recorded task is its benchmark case on the CPU
    assert states[:checks] == [True] and states[-1] is True  # the check, the re-check
    assert set(states[checks:-1]) == {False}, states  # GPU MODE's warm-up, obligatory and timed calls
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="raised while timed"):
        with timing.collector_paused():
            assert not gc.isenabled()
            raise RuntimeError("raised while timed")
    assert gc.isenabled()


def _clocked_loops(monkeypatch, kernel_ms, reference_ms, max_repeats=30, turns=None):
    """The kernel's and the reference's gpumode loops on the CPU path, by turns, on a clock only
    their calls move: each call of a side takes the next of its durations (cycled)."""
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(time, "perf_counter_ns", lambda: int(clock[0] * 1e9))
    monkeypatch.setattr(time, "monotonic_ns", lambda: int(clock[0] * 1e9))

    def calls(durations):
        it = itertools.cycle(durations)

        def call(data):
            clock[0] += next(it) / 1e3
            return data
        return call

    data = torch.ones(4)
    if turns is None:
        k = timing.drive(calls(kernel_ms), gpumode_timing.gpumode_steps(call_feed.plain_feed(data), device="cpu",
                                                                max_repeats=max_repeats))
        r = timing.drive(calls(reference_ms), gpumode_timing.gpumode_steps(call_feed.plain_feed(data), device="cpu",
                                                                   max_repeats=max_repeats))
        return k, r
    loops = [gpumode_timing.gpumode_steps(call_feed.plain_feed(data), device="cpu", max_repeats=max_repeats, turns=turns)
             for _ in range(2)]
    return timing.drive(calls(kernel_ms), gpumode_timing.interleaved_steps(loops[0], loops[1], calls(reference_ms)))


def test_by_turns_a_gpumode_loop_whose_rule_is_met_goes_on_until_the_others_is(monkeypatch):
    """Alone, a loop with steady calls stops after 3 and a noisy one makes all its calls (cap 30).
    By turns of 10, a loop whose rule is met hands the turn over at once and then takes turns as
    long as the other goes on, so both meet the same stretches of the host; identical loops
    stop alike."""
    steady, noisy = [1.0], [1.0, 3.0]
    k, r = _clocked_loops(monkeypatch, steady, noisy)
    assert (k.reps, r.reps) == (3, 30)
    # K 1-3 (met), R 1-10, K 4-10, R 11-20, K 11-20, R 21-30 (cap): K stops as it resumes
    k, r = _clocked_loops(monkeypatch, steady, noisy, turns=gpumode_timing.Turns(10))
    assert (k.reps, r.reps) == (20, 30) and k.mean_ms == pytest.approx(1.0) and r.mean_ms == pytest.approx(2.0)
    k, r = _clocked_loops(monkeypatch, steady, [2.0], turns=gpumode_timing.Turns(10))
    assert (k.reps, r.reps) == (3, 3)
    # K 1-10, R 1-3 (met), K 11-20, R 4-10, K 21-30 (cap)
    k, r = _clocked_loops(monkeypatch, noisy, steady, turns=gpumode_timing.Turns(10))
    assert (k.reps, r.reps) == (30, 10)


def test_the_harness_out_of_gpu_memory_empties_the_input_cache_and_is_not_the_kernels_failure(tmp_path, monkeypatch):
    """An input the harness makes for a timed case out of memory (H100, 2026-12-05: trimul's and
    cross_entropy's largest cases with the cache at 30% of the card) is `infrastructure`, with the
    input cache emptied and the kernel flagged to be measured once more; the second time it is
    not flagged again."""
    _load_recorded(tmp_path, monkeypatch)
    kernel = tmp_path / "k.py"
    kernel.write_text(KERNEL)
    m = runner.Measurer({"device": "cpu", "protocol": "kernelcast", "max_reps": 3, "ref_refresh_s": 1e9})
    feed = m.timed_feed

    def out_of_memory(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.96 GiB")

    monkeypatch.setattr(m, "timed_feed", out_of_memory)
    first = m.measure({"path": str(kernel), "task": "recorded"}, lambda _: None)
    assert (first["status"], first["failure_kind"], first["out_of_memory"]) == ("failed", "infrastructure", True)
    assert "out of memory" in first["error"] and not inputs.CACHE.items
    again = m.measure({"path": str(kernel), "task": "recorded", "after_out_of_memory": True}, lambda _: None)
    assert again["failure_kind"] == "infrastructure" and not again.get("out_of_memory")
    monkeypatch.setattr(m, "timed_feed", feed)
    assert m.measure({"path": str(kernel), "task": "recorded"}, lambda _: None)["status"] == "ok"
