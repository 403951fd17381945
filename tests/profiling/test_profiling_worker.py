"""The profiling worker end to end on CPU (--device cpu, Triton interpreter), with real child processes.

A batch of good and deliberately broken kernels (tests/fixtures_kernels) goes through the
worker: every kernel gets the right failure kind within the timeout, good ones are measured,
the output matches RESULT_SCHEMA, and a killed run resumes without duplicate rows. The
test-only task `tiny_scale` reaches the children through KERNELCAST_TASK_MODULES.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.profiling import taskload
from pipelines.profiling.check import check_source, check_sources
from pipelines.profiling.results import partial_path
from pipelines.profiling.worker import run_batch
from pipelines.profiling.worker_config import WorkerConfig
from warehouse.formats import BATCH_SCHEMA, RESULT_SCHEMA

FIXTURES = Path(__file__).parent.parent / "fixtures_kernels"
REPO = Path(__file__).resolve().parents[2]
EXPECTED = taskload.module_from_file(FIXTURES / "tiny_task.py", "tiny_task_fixture").EXPECTED

TIMEOUT_S = 5.0  # per kernel: hangs cost this much each


@pytest.fixture(autouse=True)
def tiny_task_env(monkeypatch):
    monkeypatch.setenv(taskload.ENV_VAR, f"tiny_scale={FIXTURES / 'tiny_task.py'}")


def write_batch(path: Path, names: list[str], copies: int = 1) -> Path:
    rows = []
    for name in names:
        source = (FIXTURES / name).read_text()
        for i in range(copies):
            kid = name.removesuffix(".py") + (f"-{i}" if copies > 1 else "")
            rows.append({"kernel_id": kid, "task": "tiny_scale", "source": source + f"\n# variant {i}\n"})
    pq.write_table(pa.Table.from_pylist(rows, schema=BATCH_SCHEMA), path)
    return path


def worker_cmd(batch: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.profiling.worker", "--batch", str(batch), "--out", str(out),
            "--device", "cpu", "--compile-workers", "2", "--timeout-s", str(TIMEOUT_S), "--max-reps", "3", *extra]


@pytest.mark.slow
def test_worker_assigns_every_failure_kind(tmp_path):
    names = ["good_triton.py", "good_torch.py", "wrong_result.py", "syntax_error.py", "raises.py", "exit_process.py",
             "segfault.py", "hang_python.py", "cache_by_shape.py", "bad_triton.py"]
    batch = write_batch(tmp_path / "batch.parquet", names)
    t0 = time.monotonic()
    cfg = WorkerConfig(device="cpu", compile_workers=2, timeout_s=TIMEOUT_S, max_reps=3, phased=True, lookahead=4)
    summary = run_batch(batch, tmp_path / "out.parquet", cfg)  # phased, as on a GPU
    assert time.monotonic() - t0 < 120
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.schema.equals(RESULT_SCHEMA)
    rows = {r["kernel_id"]: r for r in table.to_pylist()}
    assert sorted(rows) == sorted(n.removesuffix(".py") for n in names)
    for name in names:
        r = rows[name.removesuffix(".py")]
        accepted = EXPECTED[name][1]
        got = None if r["status"] == "ok" else r["failure_kind"]
        assert got in accepted, f"{name}: {r['status']} {r['failure_kind']} {r['error']}"
        assert r["hardware_id"] == "cpu" and r["protocol"] == "kernelcast" and r["batch_id"] == summary.batch_id
        if got is None:
            assert math.isfinite(r["speedup"]) and r["speedup"] > 0
            assert len(r["case_ids"]) == 2 and all(n >= 2 for n in r["kernel_reps"])
            assert r["speedup"] == pytest.approx(math.exp(sum(math.log(s) for s in r["case_speedups"]) / 2))
        else:
            assert r["speedup"] is None and r["error"] and "\n" not in r["error"]
    assert "worker died" in rows["segfault"]["error"] and "SIGSEGV" in rows["segfault"]["error"]
    assert summary.by_task()["tiny_scale"]["ok"] == 2


@pytest.mark.slow
def test_killed_run_resumes_without_duplicates(tmp_path):
    batch = write_batch(tmp_path / "batch.parquet", ["good_torch.py"], copies=6)
    out = tmp_path / "out.parquet"
    cfg = WorkerConfig(device="cpu", compile_workers=1, timeout_s=TIMEOUT_S, max_reps=3)
    # 1) --limit: a clean partial run; the final file holds exactly those rows
    first = run_batch(batch, out, WorkerConfig(**{**cfg.__dict__, "limit": 2}))
    assert first.stopped == "limit" and pq.read_table(out).num_rows == 2
    # 2) rerun from the command line and SIGKILL it as soon as one more kernel is on disk
    proc = subprocess.Popen(worker_cmd(batch, out, "--compile-workers", "1"), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 90
    while time.monotonic() < end and proc.poll() is None:
        if partial_path(out).exists() and partial_path(out).read_text().count("\n") >= 1:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    # 3) a final run completes the batch; nothing is measured twice, earlier rows are kept
    last = run_batch(batch, out, cfg)
    table = pq.read_table(out)
    ids = table.column("kernel_id").to_pylist()
    assert sorted(ids) == sorted(f"good_torch-{i}" for i in range(6)) and len(set(ids)) == 6
    assert set(table.column("status").to_pylist()) == {"ok"}
    assert len(set(table.column("batch_id").to_pylist())) == 1 == len({first.batch_id, last.batch_id})
    assert last.measured_now <= 4 and not partial_path(out).exists()


def test_time_budget_stops_cleanly(tmp_path):
    batch = write_batch(tmp_path / "batch.parquet", ["good_torch.py"], copies=3)
    t0 = time.monotonic()
    summary = run_batch(batch, tmp_path / "out.parquet", WorkerConfig(device="cpu", compile_workers=1, time_budget_s=4.0))
    assert time.monotonic() - t0 < 10 and summary.stopped == "time budget"
    assert pq.read_table(tmp_path / "out.parquet").schema.equals(RESULT_SCHEMA)  # a valid file, maybe empty


def test_the_next_kernel_goes_to_the_measuring_child_before_the_last_row_is_written(tmp_path, monkeypatch):
    """A row's write (fsynced) overlaps the next kernel's job instead of holding the measuring
    child idle: when a measured row is recorded, the next compiled kernel is already out."""
    from pipelines.profiling import worker_loop

    batch = write_batch(tmp_path / "batch.parquet", ["good_torch.py"], copies=4)
    busy_when_recorded = []
    record = worker_loop._Run._record

    def watching(self, kernel, result, compile_s, sandbox=""):
        if result.get("status") == "ok":
            busy_when_recorded.append(self.measurer is not None and self.measurer.job is not None)
        record(self, kernel, result, compile_s, sandbox)

    monkeypatch.setattr(worker_loop._Run, "_record", watching)
    # all four compiled before the first is measured, so a next kernel always waits
    cfg = WorkerConfig(device="cpu", compile_workers=2, timeout_s=30.0, max_reps=3, phased=True, lookahead=4)
    run_batch(batch, tmp_path / "out.parquet", cfg)
    rows = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    assert busy_when_recorded == [True, True, True, False]  # the last one has no next kernel


def test_worker_cli_bad_input_is_one_line_error(tmp_path):
    res = subprocess.run(worker_cmd(tmp_path / "missing.parquet", tmp_path / "o.parquet"), cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "batch file not found" in res.stderr


@pytest.mark.slow
def test_check_sources_maps_every_failure_kind():
    names = ["good_triton.py", "syntax_error.py", "bad_triton.py", "wrong_result.py", "raises.py", "hang_triton.py",
             "segfault.py"]
    progress = []
    # A check's clock includes a fresh child's first Triton-interpreter call: on two loaded, slow
    # cores a good kernel's first check took over 5 s, so the one hang here waits longer instead.
    timeout_s = 15.0
    outcomes = check_sources([("tiny_scale", (FIXTURES / n).read_text()) for n in names], n_workers=2,
                             timeout_s=timeout_s, progress=lambda d, t: progress.append((d, t)))
    assert progress[-1] == (len(names), len(names))
    for name, o in zip(names, outcomes):
        assert (None if o.ok else o.failure_kind) in EXPECTED[name][1], f"{name}: {o}"
        assert o.seconds < timeout_s + 5 and "\n" not in o.message


def test_check_source_single_and_unknown_task():
    o = check_source("tiny_scale", (FIXTURES / "good_torch.py").read_text(), timeout_s=60)
    assert o.ok and o.failure_kind is None and o.message == "ok"
    with pytest.raises(ValueError, match="unknown task"):
        check_source("no_such_task", "def custom_kernel(d): return d")


_PLANTER = '''
import os

import torch

mine = os.environ.get("TRITON_CACHE_DIR", "")
if mine and not os.path.realpath(mine).startswith(os.getcwd()):  # a compile job: plant everywhere in the cache
    root = os.path.dirname(mine) if os.path.basename(mine).startswith("k-") else mine
    for folder in [mine, os.path.join(root, "kc-poison")] + [os.path.join(root, n) for n in os.listdir(root)]:
        try:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "__triton_launcher.so"), "wb") as f:
                f.write(b"kc-poison")
        except OSError:
            pass


def custom_kernel(data):
    return torch.add(data, data).add_(1.0)
'''

_VICTIM = '''
import os

import torch


def _poisoned():
    for var in ("TRITON_CACHE_DIR", "KERNELCAST_TRITON_SHARED"):
        folder = os.environ.get(var)
        for top, _, files in os.walk(folder or "/nonexistent"):
            for name in files:
                with open(os.path.join(top, name), "rb") as f:
                    if b"kc-poison" in f.read():
                        return f"{var}: {os.path.join(top, name)}"
    return None


FOUND = _poisoned()


def custom_kernel(data):
    found = FOUND or _poisoned()
    if found:
        raise RuntimeError(f"planted by another kernel: {found}")
    return torch.add(data, data).add_(1.0)
'''


@pytest.mark.slow
def test_a_kernel_cannot_plant_in_another_kernels_triton_cache(tmp_path):
    """Each compile job writes its kernel's Triton cache into a folder of its own, sealed before
    the measuring child reads it, which reads that kernel's folder alone: a kernel that writes a
    "launcher" into every folder of the shared cache reaches no later kernel, compiled or measured."""
    rows = [{"kernel_id": f"planter-{i}", "task": "tiny_scale", "source": _PLANTER + f"\n# {i}\n"} for i in range(2)]
    rows += [{"kernel_id": f"victim-{i}", "task": "tiny_scale", "source": _VICTIM + f"\n# {i}\n"} for i in range(3)]
    batch = tmp_path / "batch.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=BATCH_SCHEMA), batch)
    cfg = WorkerConfig(device="cpu", compile_workers=2, timeout_s=30.0, max_reps=3, order="given")
    summary = run_batch(batch, tmp_path / "out.parquet", cfg)
    got = {r["kernel_id"]: (r["status"], r["error"]) for r in summary.rows}
    assert got == {k: ("ok", None) for k in got} and len(got) == 5, got


_OUT_OF_MEMORY = '''
import os

import torch


def custom_kernel(data):
    if data.device.type != "meta" and os.environ.get("KC_TEST_OOM_SEEN") != "{name}":
        if "{once}":
            os.environ["KC_TEST_OOM_SEEN"] = "{name}"
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB")
    return torch.add(data, data).add_(1.0)
'''


def test_a_kernel_out_of_gpu_memory_is_measured_once_more_before_it_is_blamed(tmp_path):
    """Out of GPU memory in the measuring child may be the harness's doing (its input cache takes
    30% of the card): the child empties its cache and the kernel is measured once more. Out of
    memory again is the kernel's `runtime_error`; a kernel that fits the second time is measured."""
    rows = [{"kernel_id": "oom-once", "task": "tiny_scale", "source": _OUT_OF_MEMORY.replace("{name}", "oom-once").replace("{once}", "1")},
            {"kernel_id": "oom-always", "task": "tiny_scale", "source": _OUT_OF_MEMORY.replace("{name}", "oom-always").replace("{once}", "")}]
    batch = tmp_path / "batch.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=BATCH_SCHEMA), batch)
    run_batch(batch, tmp_path / "out.parquet", WorkerConfig(device="cpu", compile_workers=1, timeout_s=30.0, max_reps=3))
    got = {r["kernel_id"]: r for r in pq.read_table(tmp_path / "out.parquet").to_pylist()}
    assert sorted(got) == ["oom-always", "oom-once"]  # one row each: the first attempt is not recorded
    assert got["oom-once"]["status"] == "ok", got["oom-once"]["error"]
    always = got["oom-always"]
    assert always["failure_kind"] == "runtime_error"
    assert "out of memory" in always["error"] and "again, with this process's input cache emptied" in always["error"]
