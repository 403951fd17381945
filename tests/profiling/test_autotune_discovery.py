"""Autotuners a kernel hides (built inside a function, behind a wrapper, their choice kept on disk
with `cache_results=True`) are found when they run, tuned on the real inputs in the tuning pass
and recorded per case (`autotune_json`); choices made in the compile children, whose benchmarker
only compiles, never reach the measuring child.

Before this, flash-linear-attention's softmax (`cache_results=True`) got its config from an
autotune result the compile children stored (every config 0 ms there: the first one, 1 warp, for
rows of 16384), the measuring child read it back without tuning, and no config was recorded.

The flow runs on this host's CPU with the stand-in GPU (pipelines.profiling.standin): Triton
compiles for an H100 target and launches nothing, and the stand-in's benchmarker answers as a GPU
that prefers 2 warps on short rows and 8 on long ones. In a process of its own: compiles need
Triton's compiler, where this test process interprets Triton."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.profiling import kernel_loading

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / "tests" / "fixtures_kernels" / "device_query" / "hidden_autotuner_softmax.py"

_COMPILE_THEN_MEASURE = r"""
import importlib.util, json, math, os, sys, types
import torch
from pipelines.profiling import compile_child, kernel_loading, runner, standin
from pipelines.profiling.timing import drive

kernel_path, cache = sys.argv[1], sys.argv[2]
os.environ["TRITON_CACHE_DIR"] = cache
CASES = ({"M": 4, "N": 48}, {"M": 4, "N": 300}, {"M": 2, "N": 48})
benched = []


def preferred_warps(n_cols):
    return 2 if n_cols <= 64 else 8


def stand_in_gpu_bench(kernel_call, quantiles=None, **_):
    # The stand-in runs nothing: the timing is that of a GPU with preferred_warps, read from what
    # the autotuner's call would launch (its config and arguments).
    seen = dict(zip(kernel_call.__code__.co_freevars, (c.cell_contents for c in kernel_call.__closure__ or ())))
    if "config" not in seen or "full_nargs" not in seen:
        print(json.dumps({"skip": "this Triton's autotuner calls its benchmarker differently"}))
        sys.exit(0)
    kernel_call()  # compiles the config, launches nothing
    w, n = seen["config"].num_warps, seen["full_nargs"]["n_cols"]
    benched.append((n, w))
    ms = 1.0 + abs(math.log2(w) - math.log2(preferred_warps(n)))
    return [ms] * len(quantiles) if quantiles else ms


standin.StandinDriver.get_benchmarker = lambda self: stand_in_gpu_bench


def load(name):
    spec = importlib.util.spec_from_file_location(name, kernel_path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def x(case):
    return torch.randn(case["M"], case["N"]).to(torch.bfloat16)


with standin.standin_device(standin.H100):
    # A compile child: every benchmark shape compiled, launches and timings suppressed.
    compiling = load("compile_copy")
    with compile_child.triton_launches_suppressed():
        for case in CASES[:2]:
            compiling.custom_kernel((x(case),))
    stored = sorted(p for _, _, files in os.walk(cache) for p in files if p.endswith(".autotune.json"))
    benched_while_compiling = len(benched)
    benched.clear()

    # The measuring child: the watch installed (child.py), the kernel imported afresh, the tuning pass.
    steps = []
    kernel_loading.AUTOTUNE.install()
    kernel_loading.AUTOTUNE.begin(steps.append)
    measured = load("measured_copy")
    runner.make_input = lambda task, case: (x(case),)
    task = types.SimpleNamespace(case_id=lambda c: f"M={c['M']},N={c['N']}")
    chosen = drive(measured.custom_kernel, runner.Measurer({"device": "cpu"})._tuning_steps(task, CASES, steps.append))
    print(json.dumps({"stored": stored, "benched_while_compiling": benched_while_compiling,
                      "benched": benched, "chosen": json.loads(chosen) if chosen else None, "steps": steps}))
"""


def test_a_hidden_autotuner_with_a_disk_cache_is_tuned_on_the_real_inputs_and_recorded(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", _COMPILE_THEN_MEASURE, str(KERNEL), str(tmp_path / "triton")],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if done.returncode != 0 and ("ptxas" in done.stderr or "cuobjdump" in done.stderr):
        pytest.skip(f"Triton cannot compile for the stand-in GPU here: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    # the compile child compiled each config of both row widths and stored no choice
    assert got["benched_while_compiling"] == 0 and got["stored"] == []
    # the measuring child tuned each row width once, every config, on the real inputs
    assert sorted(map(tuple, got["benched"])) == [(n, w) for n in (48, 300) for w in (2, 4, 8)]
    # and recorded per case what it ran: the third case reuses the choice of the first's width
    config = "num_warps: {}, num_ctas: 1, num_stages: 3, maxnreg: None"
    assert got["chosen"] == {"M=4,N=48": {"_softmax_rows": config.format(2)},
                             "M=4,N=300": {"_softmax_rows": config.format(8)},
                             "M=2,N=48": {"_softmax_rows": config.format(2)}}
    assert got["steps"][:2] == ["autotuning on M=4,N=48", "autotune _softmax_rows: config 1/3"]


def test_choices_name_what_ran_since_the_mark_and_tell_same_named_kernels_apart():
    from types import SimpleNamespace

    watch = kernel_loading.AutotuneWatch()

    def tuner(name, config):
        return SimpleNamespace(base_fn=SimpleNamespace(__name__=name), best_config=config)

    a, b, c = tuner("rows", "w2"), tuner("rows", "w8"), tuner("cols", "w4")
    watch.begin(None)
    watch.saw(a)
    watch.saw(c)
    a.best_config = "w4"  # a second shape in the same call
    watch.saw(a)
    watch.saw(a)
    watch.saw(b)
    assert watch.choices() == {"rows": "w2 | w4", "cols": "w4", "rows#2": "w8"}
    watch.mark()
    assert watch.choices() == {}
    watch.saw(b)
    assert watch.choices() == {"rows": "w8"}


def test_nothing_reads_or_writes_an_autotune_result_on_disk():
    benched = []
    assert kernel_loading.tune_in_memory(None, ("key",), [], lambda: benched.append(1)) is False
    assert benched == [1]
