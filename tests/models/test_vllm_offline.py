"""VLLMOfflineAnswerer: vLLM's offline engine in a child process, on the embedded SmolLM2.

Slow: one engine start (~10-25 s on 2 cores with enforce_eager) for the whole module, plus a
one-off GGUF conversion of 1.5-4 minutes when $KERNELCAST_HOME has no converted checkpoint.
The engine runs under $KERNELCAST_VLLM_PYTHON (`make test` sets it to .vllm-venv/bin/python);
the module skips, with the reason, when that python does not exist or lacks `vllm`, as
tests/models/test_vllm_serving.py does.

One module fixture starts one `VLLMEngine` and serves three forecasters through it: logprob
readout (2 repeats), verbalized with structured outputs (greedy), verbalized sampling (2
repeats, short budget: mostly recorded parse failures). What is asserted is the plumbing and
the bookkeeping, not skill: shapes, probabilities summing to 1, the logprob readout agreeing
with TransformersAnswerer on the same checkpoint (one definition), structured completions
being the schema's JSON, parse failures recorded, a second call served from the cache
without starting vLLM, and the child process gone afterwards. Failure paths (no python,
engine start failure, a child dying mid-batch, a hung child) run against stand-in runners
and take seconds.
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
import sys
import time
from pathlib import Path

import pytest
from vllm_helpers import smollm2_dir, vllm_python  # beside the tests (pytest's rootdir)

from models.backends import BackendError, ForecastRequest
from models.cache import ForecastCache

log = logging.getLogger(__name__)

pytestmark = pytest.mark.slow

REPEATS = 2
SAMPLED_MAX_TOKENS = 24
STRUCTURED_MAX_TOKENS = 160
REASONING_MAX_CHARS = 60


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return smollm2_dir(tmp_path_factory)


ANCHOR = """import triton
import triton.language as tl


@triton.jit
def softmax_kernel(out_ptr, in_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * n_cols + cols, num / tl.sum(num, axis=0), mask=mask)
"""

# Small edits of the anchor: short prompts keep the module's CPU time down (~900 tokens).
CANDIDATES = {
    "exp2": ANCHOR.replace("tl.exp(x)", "tl.exp2(x * 1.4426950408889634)"),
    "fp16_out": ANCHOR.replace(
        "num / tl.sum(num, axis=0)", "(num / tl.sum(num, axis=0)).to(tl.float16)"
    ),
    "no_max": ANCHOR.replace("    x = x - tl.max(x, axis=0)\n", ""),
}


def _requests() -> list[ForecastRequest]:
    from models.prompts import build_prompt

    hardware = {"name": "NVIDIA H200", "capability": "9.0", "sm_count": 132}
    return [
        ForecastRequest(
            build_prompt("softmax", "Row softmax of a matrix.", ANCHOR, cand, hardware, "diff"), rid
        )
        for rid, cand in CANDIDATES.items()
    ]


def _forecasters(model_dir, engine, cache):
    from models.backends import make_answerer

    logprob = make_answerer(
        "vllm", model=model_dir, readout="logprob", engine=engine, cache=cache
    )
    structured = make_answerer(
        "vllm", model=model_dir, readout="verbalized", engine=engine, cache=cache,
        structured=True, reasoning_max_chars=REASONING_MAX_CHARS, max_tokens=STRUCTURED_MAX_TOKENS,
    )  # fmt: skip
    sampled = make_answerer(
        "vllm", model=model_dir, readout="verbalized", engine=engine, cache=cache,
        temperature=0.8, max_tokens=SAMPLED_MAX_TOKENS, seed=7, batch_size=4,
    )  # fmt: skip
    return logprob, structured, sampled


@pytest.fixture(scope="module")
def served(model_dir, tmp_path_factory):
    """One engine start; every readout runs through it; the child is gone afterwards."""
    from models.backends.vllm_backend import VLLMEngine

    python = vllm_python()
    tmp = tmp_path_factory.mktemp("vllm-offline")
    cache = ForecastCache(tmp / "cache")
    engine = VLLMEngine(model_dir, python=python, dtype="float32", log_path=tmp / "engine.log")
    logprob, structured, sampled = _forecasters(model_dir, engine, cache)
    requests = _requests()
    timings: dict[str, float] = {}
    progress: list[tuple[int, int]] = []
    try:
        t0 = time.perf_counter()
        engine.start()
        timings["start"] = time.perf_counter() - t0
        pid = engine._proc.pid
        t0 = time.perf_counter()
        out_logprob = logprob.forecast(requests, repeats=REPEATS)
        timings["logprob"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        out_structured = structured.forecast(requests)
        timings["structured"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        out_sampled = sampled.forecast(
            requests, repeats=REPEATS, progress=lambda d, n: progress.append((d, n))
        )
        timings["sampled"] = time.perf_counter() - t0
    finally:
        t0 = time.perf_counter()
        engine.close()
        timings["close"] = time.perf_counter() - t0
    log.info("timings (s): %s", {k: round(v, 1) for k, v in timings.items()})
    print(f"\nvLLM offline timings (s): { {k: round(v, 1) for k, v in timings.items()} }")
    yield {
        "requests": requests, "cache": cache, "engine": engine, "pid": pid,
        "logprob": out_logprob, "structured": out_structured, "sampled": out_sampled,
        "progress": progress, "timings": timings,
    }  # fmt: skip
    cache.close()


def _live_in_group(pgid: int) -> list[int]:
    """Processes of group `pgid` that still run (zombies are dead: a process that became a
    child subreaper, as the profiling sandbox makes its parent, may not have reaped them yet)."""
    live = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(entry))
    return live


def _exists(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


def _is_distribution(p) -> bool:
    return len(p) == 8 and all(v >= 0 for v in p) and math.isclose(sum(p), 1.0, abs_tol=1e-6)


def test_engine_started_once_and_child_is_gone(served):
    engine = served["engine"]
    assert engine.starts == 1 and not engine.running
    assert engine.info["vllm"] == "0.32.0"
    assert _live_in_group(served["pid"]) == []  # the runner's whole process group is gone


def test_logprob_readout(served):
    out = served["logprob"]
    assert len(out) == len(served["requests"]) * REPEATS
    assert [f.repeat for f in out] == [0, 1] * len(served["requests"])
    for f in out:
        assert f.parse_ok, f.parse_error
        assert f.readout == "logprob" and _is_distribution(f.p)
        assert 0 < f.raw_sum <= 1.0 + 1e-6
        assert f.predicted_bin == f.argmax_bin and 1 <= f.predicted_bin <= 8
        assert f.tokens == 0 and f.prompt_tokens > 100 and f.latency_s > 0
    for a, b in zip(out[::2], out[1::2], strict=True):
        assert a.p == b.p  # deterministic: computed once, copied to every repeat


def test_logprob_readout_matches_transformers(served, model_dir):
    """Same tokens, same labels, same full-vocabulary softmax as the in-process backend."""
    from models.backends.transformers_backend import TransformersAnswerer

    hf = TransformersAnswerer(str(model_dir), readout="logprob", batch_size=4, device="cpu")
    reference = hf.forecast(served["requests"])
    for mine, theirs in zip(served["logprob"][::REPEATS], reference, strict=True):
        assert mine.prompt_tokens == theirs.prompt_tokens
        gap = max(abs(a - b) for a, b in zip(mine.p, theirs.p, strict=True))
        log.info(
            "max |p_vllm - p_hf| %.2e, label mass %.4f vs %.4f", gap, mine.raw_sum, theirs.raw_sum
        )
        assert gap < 2e-3
        assert math.isclose(mine.raw_sum, theirs.raw_sum, rel_tol=1e-2)


def test_structured_verbalized_readout(served):
    out = served["structured"]
    assert len(out) == len(served["requests"])
    for f in out:
        assert f.readout == "verbalized" and f.repeat == 0
        assert 0 < f.tokens <= STRUCTURED_MAX_TOKENS and f.prompt_tokens > 100
        if f.tokens < STRUCTURED_MAX_TOKENS:  # finished: the completion is the schema's JSON
            answer = json.loads(f.text)
            assert set(answer) == {"predicted_bin", "p", "reasoning"}
            assert len(answer["p"]) == 8 and len(answer["reasoning"]) <= REASONING_MAX_CHARS
        if f.parse_ok:
            assert _is_distribution(f.p) and 1 <= f.predicted_bin <= 8 and f.raw_sum > 0
        else:
            assert f.p is None and "\n" not in f.parse_error
    assert any(f.parse_ok for f in out), [f.parse_error for f in out]
    log.info("structured: %s", [(f.predicted_bin, f.tokens, f.parse_error) for f in out])


def test_sampled_verbalized_bookkeeping(served):
    out = served["sampled"]
    assert len(out) == len(served["requests"]) * REPEATS
    assert [f.repeat for f in out] == [0, 1] * len(served["requests"])
    for f in out:
        assert f.readout == "verbalized" and isinstance(f.text, str)
        assert 0 < f.tokens <= SAMPLED_MAX_TOKENS and f.attempts == 1
        if f.parse_ok:
            assert _is_distribution(f.p)
        else:  # a recorded outcome with a one-line reason, never an exception
            assert f.p is None and f.parse_error and "\n" not in f.parse_error
    # seed + repeat per request: the repeats of a prompt are different samples
    assert any(a.text != b.text for a, b in zip(out[::2], out[1::2], strict=True))
    assert served["progress"][-1] == (len(out), len(out))


def test_second_call_is_served_from_cache_without_vllm(served, model_dir):
    from models.backends.vllm_backend import VLLMEngine

    dead = VLLMEngine(model_dir, python="/nonexistent/python")  # would fail if started
    logprob, structured, sampled = _forecasters(model_dir, dead, served["cache"])
    requests = served["requests"]
    again = {
        "logprob": logprob.forecast(requests, repeats=REPEATS),
        "structured": structured.forecast(requests),
        "sampled": sampled.forecast(requests, repeats=REPEATS),
    }
    assert dead.starts == 0
    for name, out in again.items():
        assert all(f.cached for f in out), name
        before = served[name]
        assert [f.p for f in out] == [f.p for f in before], name
        assert [f.text for f in out] == [f.text for f in before], name
        assert [f.repeat for f in out] == [f.repeat for f in before], name


# --- failure paths: stand-in runners, seconds each --------------------------------------------


def _one_request():
    return [ForecastRequest([{"role": "user", "content": "Forecast the speedup."}], "r0")]


def test_missing_python_is_a_one_line_backend_error(model_dir, tmp_path):
    from models.backends.vllm_backend import VLLMOfflineAnswerer

    forecaster = VLLMOfflineAnswerer(
        model_dir, python="/nonexistent/python", cache=ForecastCache(tmp_path)
    )
    with pytest.raises(BackendError) as err:
        forecaster.forecast(_one_request())
    assert "no vLLM python at /nonexistent/python" in str(err.value)
    assert "\n" not in str(err.value)


def test_engine_start_failure_is_a_one_line_backend_error(model_dir, tmp_path):
    """This venv's python has no vllm: the runner reports the import error and exits."""
    from models.backends.vllm_backend import VLLMOfflineAnswerer

    forecaster = VLLMOfflineAnswerer(
        model_dir, python=sys.executable, cache=ForecastCache(tmp_path)
    )
    with pytest.raises(BackendError) as err:
        forecaster.forecast(_one_request())
    message = str(err.value)
    assert "vLLM engine failed to start" in message and "vllm" in message and "\n" not in message
    assert forecaster._own_engine is None  # closed after the call


FAKE_RUNNER = """#!{python}
# Stand-in for the vLLM python: speaks the runner protocol without vLLM.
import json, os, sys, time
open({pidfile!r}, "w").write(str(os.getpid()))
print(json.dumps({{"event": "ready", "vllm": "fake", "load_s": 0}}), flush=True)
batch = json.loads(sys.stdin.readline())
first = batch["requests"][0]
labels = first["sampling"]["logprob_token_ids"]
step = {{str(t): -2.0 - i for i, t in enumerate(labels)}}
result = {{"event": "result", "index": first["index"], "prompt_tokens": 7,
          "outputs": [{{"text": "1", "token_ids": [1], "finish_reason": "length", "logprobs": [step]}}]}}
print(json.dumps(result), flush=True)
if {mode!r} == "hang":
    time.sleep(600)
sys.exit(3)
"""


def _fake_python(tmp_path, mode: str) -> tuple[Path, Path]:
    pidfile = tmp_path / f"{mode}.pid"
    script = tmp_path / f"fake-{mode}"
    script.write_text(FAKE_RUNNER.format(python=sys.executable, pidfile=str(pidfile), mode=mode))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, pidfile


@pytest.mark.parametrize("mode", ["exit", "hang"])
def test_partial_results_stay_cached_and_child_is_gone(model_dir, tmp_path, mode):
    from models.backends.vllm_backend import VLLMOfflineAnswerer

    python, pidfile = _fake_python(tmp_path, mode)
    cache = ForecastCache(tmp_path / "cache")
    forecaster = VLLMOfflineAnswerer(model_dir, python=python, cache=cache, timeout_s=3)
    two = _one_request() + [ForecastRequest([{"role": "user", "content": "Another pair."}], "r1")]
    with pytest.raises(BackendError) as err:
        forecaster.forecast(two)
    message = str(err.value)
    assert "1 of 2 requests failed" in message and "\n" not in message
    assert ("timed out" if mode == "hang" else "exited (code 3)") in message
    assert len(cache) == 1  # the answer that arrived is kept
    (first,) = VLLMOfflineAnswerer(model_dir, python="/nonexistent", cache=cache).forecast(
        two[:1]
    )
    assert first.cached and first.parse_ok and first.predicted_bin == 1 and first.prompt_tokens == 7
    assert not _exists(int(pidfile.read_text()))  # gone (or a zombie nobody reaped yet)


CLEAN_RUNNER = """#!{python}
# Stand-in for the vLLM python: ready, one batch answered, a clean exit at EOF.
import json, sys
print("a line of the engine's log", file=sys.stderr, flush=True)
print(json.dumps({{"event": "ready", "vllm": "fake", "load_s": 0}}), flush=True)
for line in sys.stdin:
    print(json.dumps({{"event": "done", "batch": json.loads(line)["batch"]}}), flush=True)
"""


def test_the_engine_log_is_removed_after_a_clean_close_and_kept_when_named_by_an_error(tmp_path, monkeypatch):
    """A temp log per engine start would pile up in the temp folder: a clean run leaves none,
    a failed start leaves the one its error names."""
    import tempfile

    from models.backends.vllm_backend import VLLMEngine

    logs = tmp_path / "tmp"
    logs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(logs))
    clean = tmp_path / "clean-runner"
    clean.write_text(CLEAN_RUNNER.format(python=sys.executable))
    clean.chmod(clean.stat().st_mode | stat.S_IXUSR)
    engine = VLLMEngine(tmp_path, python=clean)
    assert engine.run([]) == {}
    assert [p.name for p in logs.iterdir()] == [engine.log_path.name]
    assert "a line of the engine's log" in engine.log_path.read_text()
    engine.close()
    assert list(logs.iterdir()) == [] and engine.log_path is None

    failing = VLLMEngine(tmp_path, python=sys.executable)  # this venv has no vllm
    with pytest.raises(BackendError) as err:
        failing.start()
    [kept] = logs.iterdir()
    assert f"(log {kept})" in str(err.value) and kept.stat().st_size > 0
    failing.close()
    assert kept.exists()


def test_auto_dtype_follows_the_cpus_bfloat16_instructions(tmp_path):
    """On a CPU platform the runner turns dtype "auto" into float32 unless the CPU has bfloat16
    instructions (vLLM would run the float32 checkpoint in emulated bfloat16, 4-5x slower on AVX2)."""
    from models.backends.vllm_offline_runner import cpu_has_bf16

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    assert cpu_has_bf16(str(info)) is False
    info.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert cpu_has_bf16(str(info)) is True
    info.write_text("Features\t: fp asimd bf16 i8mm\n")  # Arm
    assert cpu_has_bf16(str(info)) is True
    assert cpu_has_bf16(str(tmp_path / "absent")) is False


def test_backend_doctests():
    import doctest
    import importlib

    # models.backends has examples; vllm_backend's answer schema (and its example) moved to
    # models.parsing, whose doctests run in tests/models/test_models_doctests.py.
    for name, has_examples in (("models.backends", True), ("models.backends.vllm_backend", False)):
        result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and (result.attempted > 0 or not has_examples), name


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v", "-s", "-p", "no:cacheprovider"]))
