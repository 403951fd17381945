"""Timed calls no memo can use: every call of a case runs on values no earlier call had (a random
transform of the case's base values, fresh_values.py), every task's input stays valid under it, the
verifier rebuilds the input of any kept call, and nothing a kernel can reach from its frames leads
to the timer or the feed. The memo and timer-sniffing kernels of the hostile battery gain nothing
over their honest twin, under every protocol, in process (the worker path: test_sandbox_hostile.py
and the fault battery)."""

from __future__ import annotations

import gc
import hashlib
import math
import sys
import types
from pathlib import Path

import pytest
import torch

from pipelines.profiling import call_feed, fresh_values, runner, taskload
from pipelines.tasks import TASK_MODULES, gdn_chunk_fwd_o

FIXTURES = Path(__file__).parent.parent / "fixtures_kernels"
hostile = taskload.module_from_file(FIXTURES / "hostile.py", "hostile_kernels_fresh")


@pytest.fixture
def tiny_task(monkeypatch):
    monkeypatch.setenv(taskload.ENV_VAR, f"tiny_scale={FIXTURES / 'tiny_task.py'}")
    taskload._loaded.pop("tiny_scale", None)
    return taskload.load_task("tiny_scale")


def _digest(data) -> str:
    h = hashlib.sha1()
    for t in fresh_values.tensors(data):
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# ---- the transform ---------------------------------------------------------------------------
def test_every_call_of_a_case_runs_on_values_no_earlier_call_had():
    """Two base variants of three rows (the fewest a case could give a memo to reuse), 300 calls:
    no two inputs alike, and every kept output's input rebuilt from its salt and draw."""
    data = (torch.zeros(3, 5, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.int64), 0.5)
    variants = {s: (torch.randn(3, 5, generator=torch.Generator().manual_seed(s)).to(torch.bfloat16),
                    torch.tensor([0, 1, 2]), 0.5) for s in (7, 9)}
    feed = call_feed.Feed(data, variants.__getitem__, tuple(variants), keep=2)
    seen = set()
    for _ in range(300):
        x = feed.fill()
        assert x is data and x[2] == 0.5
        seen.add(_digest(x))
        assert sorted(x[1].tolist()) == [0, 1, 2]  # labels move, never change
        feed.took(x)
    assert len(seen) == 300
    for k in feed.take_kept():
        assert _digest(k.output) == _digest(fresh_values.fresh_copy(variants[k.salt], k.draw))


def test_scale_steps_are_further_apart_than_a_bf16_unit():
    factors = sorted(fresh_values.scale_factor(j) for j in fresh_values.SCALE_STEPS)
    assert min(b / a for a, b in zip(factors, factors[1:])) - 1 > 2.0**-7  # bf16: 8 significant bits
    assert 0.8 < factors[0] and factors[-1] < 1.25 and 1.0 not in factors
    x = torch.linspace(-3, 3, 4001, dtype=torch.float32).to(torch.bfloat16)
    x = x[x != 0]
    images = {(x * f).to(torch.bfloat16).float().numpy().tobytes() for f in factors}
    assert len(images) == len(factors)


def _gates_ok(g: torch.Tensor) -> bool:
    """gdn_chunk_fwd_o's contract: log-gates <= 0, cumulated (non-increasing) within each chunk."""
    B, T, H = g.shape
    nt = -(-T // gdn_chunk_fwd_o.CHUNK)
    pad = torch.nn.functional.pad(g, (0, 0, 0, nt * gdn_chunk_fwd_o.CHUNK - T), value=float("-inf"))
    steps = pad.view(B, nt, gdn_chunk_fwd_o.CHUNK, H).diff(dim=2)
    return bool((g <= 0).all()) and bool((steps.nan_to_num(nan=-1.0) <= 1e-6).all())


@pytest.mark.parametrize("name", list(TASK_MODULES))
def test_every_task_input_stays_valid_and_its_answer_changes(name, monkeypatch):
    monkeypatch.setenv("KERNELCAST_DEVICE", "cpu")
    task = taskload.load_task(name)
    case = dict(task.correctness_cases[-1])
    seed = case.pop("seed")
    base = task.generate_input(seed=seed, **case)
    before = fresh_values.tensors(base)
    answer = task.ref_kernel(base)
    for draw in (1, 2**40 + 3, 2**62 + 11):
        x = fresh_values.fresh_copy(base, draw)
        again = fresh_values.fresh_copy(base, draw)
        assert _digest(x) == _digest(again)  # the verifier's copy is the measuring child's values
        after = fresh_values.tensors(x)
        assert [(t.shape, t.dtype, t.stride()) for t in after] == [(t.shape, t.dtype, t.stride()) for t in before]
        for b, a in zip(before, after):
            if not b.is_floating_point() or fresh_values._is_mask(b):  # labels and masks: the same values, moved
                assert sorted(a.reshape(-1).tolist()) == sorted(b.reshape(-1).tolist())
        assert [v for v in (x if isinstance(x, tuple) else ()) if not isinstance(v, (torch.Tensor, dict))] == \
               [v for v in (base if isinstance(base, tuple) else ()) if not isinstance(v, (torch.Tensor, dict))]
        assert _digest(task.ref_kernel(x)) != _digest(answer)  # the correct output changes
        ok, message = task.check_implementation(x, task.ref_kernel(x))
        assert ok, message
        if name == "fp8_quant":  # its all-zero group (the 1e-10 scale floor) is still a whole group
            assert any(bool((row[:128] == 0).all()) for row in x[0])
        if name == "gdn_chunk_fwd_o":
            assert _gates_ok(x[4])


def test_tensors_that_share_memory_are_left_as_they_are():
    x = torch.arange(12.0).view(3, 4)
    plan = fresh_values.transform_plan((x, x[1:]))
    assert plan == (fresh_values.LeafPlan(1, False), fresh_values.LeafPlan(1, False))


# ---- nothing in a call's frames leads to the timer or the feed ---------------------------------
RECORDER = "kc_test_reach_recorder"

REACH_KERNEL = f'''
import sys, types

_SKIP = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type, str, bytes)


def _reachable(frame, stop):
    """Type names of everything reachable from the callers' frames (up to `stop`'s), through locals,
    containers and attributes, and whether a generator is among them."""
    found, todo, seen = set(), [], set()
    while frame is not None:
        todo += [(v, 0) for v in frame.f_locals.values()]
        if frame.f_code.co_name == stop:
            break
        frame = frame.f_back
    while todo:
        v, depth = todo.pop()
        if id(v) in seen or isinstance(v, _SKIP) or depth > 6:
            continue
        seen.add(id(v))
        found.add(type(v).__qualname__)
        if isinstance(v, types.GeneratorType):
            continue
        items = list(v.values()) if isinstance(v, dict) else list(v) if isinstance(v, (list, tuple, set)) else []
        items += list(getattr(v, "__dict__", {{}}).values())
        items += [getattr(v, s, None) for s in getattr(type(v), "__slots__", ())]
        todo += [(x, depth + 1) for x in items]
    return found


def custom_kernel(data):
    sys.modules["{RECORDER}"].reached.append(_reachable(sys._getframe(1), "measure"))
    return data * 2.0 + 1.0
'''


@pytest.mark.parametrize("protocol", ["kernelcast", "paper", "gpumode"])
def test_no_generator_clock_or_feed_is_reachable_from_a_calls_frames(tiny_task, tmp_path, monkeypatch, protocol):
    record = types.ModuleType(RECORDER)
    record.reached = []
    monkeypatch.setitem(sys.modules, RECORDER, record)
    path = tmp_path / "k.py"
    path.write_text(REACH_KERNEL)
    m = runner.Measurer({"device": "cpu", "protocol": protocol, "max_reps": 3})
    result = m.measure({"path": str(path), "task": "tiny_scale"}, lambda phase: None)
    assert result["status"] == "ok", result["error"]
    assert len(record.reached) > 2 * len(tiny_task.correctness_cases) + 3  # checks, warm-up, timed, re-check
    assert all(r == record.reached[0] for r in record.reached)  # checked or timed: the same things
    assert not {"generator", "Feed", "_Calls", "Event", "Turns"} & record.reached[0], record.reached[0]
    assert "CallTurn" in record.reached[0]  # the call site's one object: the reply slot


# ---- memos and timer sniffers gain nothing, under every protocol ---------------------------------
def _case_times(result: dict, protocol: str) -> list[float]:
    return [t["median_ms"] if protocol == "kernelcast" else t["mean_ms"] for t in result["kernel_timings"]]


@pytest.mark.parametrize("protocol", ["kernelcast", "paper", "gpumode"])
def test_memos_and_timer_sniffers_gain_nothing_over_their_honest_twin(tiny_task, tmp_path, protocol):
    """20 timed calls a case: more than the CPU's 8 base variants, so under the harness of cycled
    variants the memos hit (up to 139x their twin), and the sniffer and the walker forged the clock
    readings they found in a suspended frame (about 25x)."""
    def measure(name: str) -> dict:
        path = tmp_path / f"{name}.py"
        path.write_text(hostile.render(name))
        gc.collect()
        m = runner.Measurer({"device": "cpu", "protocol": protocol, "max_reps": 20})
        return m.measure({"path": str(path), "task": "tiny_scale"}, lambda phase: None)

    def honest() -> list[float]:
        twins = [measure(hostile.NO_GAIN_TWIN) for _ in range(2)]
        assert all(t["status"] == "ok" for t in twins), [t["error"] for t in twins]
        return [min(ts) for ts in zip(*(_case_times(t, protocol) for t in twins))]  # the faster of two runs

    twin = honest()
    for name in hostile.NO_GAIN:
        gains = []
        # a busy host can make one run of the twin slow; a kernel that gains gains every time (10x to
        # 139x without fresh values), so a gain over the factor is measured twice more, the twin too
        for _attempt in range(3):
            result = measure(name)
            if result["status"] != "ok":
                assert result["failure_kind"] in hostile.KINDS[name], result["error"]
                break
            gains.append(math.exp(sum(math.log(a / b) for a, b in zip(twin, _case_times(result, protocol)))
                                  / len(twin)))
            print(f"{protocol} {name}: {gains[-1]:.2f}x its twin")
            if gains[-1] <= hostile.NO_GAIN_FACTOR:
                break
            twin = honest()
        assert not gains or min(gains) <= hostile.NO_GAIN_FACTOR, \
            f"{protocol} {name} gained {min(gains):.1f}x over its honest twin in each of 3 runs"
