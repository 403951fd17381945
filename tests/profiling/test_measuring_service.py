"""The warm measuring service on the CPU path (--device cpu, Triton interpreter, real sandboxed
children): it starts, serves two clients at once, survives a crashing kernel, stops cleanly on
a signal and on its stop file, and a client without a service gets a one-line error. The queue
folder's rules (private, atomic jobs and rows, the flock) are checked without a service."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipelines.profiling import service_queue as sq
from pipelines.profiling import taskload
from pipelines.profiling.queue_order import order_kernels, uses_torch_compile

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures_kernels"
REPO = Path(__file__).resolve().parents[2]


def kernel(name: str, kid: str | None = None) -> dict:
    return {"kernel_id": kid or name.removesuffix(".py"), "task": "tiny_scale",
            "source": (FIXTURES / name).read_text() + f"\n# {kid}\n"}


def start_service(queue: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, taskload.ENV_VAR: f"tiny_scale={FIXTURES / 'tiny_task.py'}", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.profiling.service", "--queue", str(queue), "--device", "cpu",
                             "--compile-workers", "2", "--timeout-s", "10", "--max-reps", "3", "--ref-cache", "off",
                             *extra], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 60
    while not sq.running(queue, "cpu"):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < end, "the service did not take its lock"
        time.sleep(0.1)
    return proc


def wait_exit(proc: subprocess.Popen, timeout: float = 60.0) -> str:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return err


@pytest.mark.slow
def test_the_service_serves_two_clients_survives_a_crash_and_stops_on_sigterm(tmp_path):
    queue = tmp_path / "queue"
    proc = start_service(queue)
    try:
        assert (os.stat(queue).st_mode & 0o777) == 0o700
        results: dict[str, list[dict]] = {}
        errors: list[BaseException] = []

        def client(name: str, kernels: list[dict]) -> None:
            try:
                results[name] = sq.submit(kernels, queue=queue, device="cpu", timeout_s=240)
            except BaseException as e:  # noqa: BLE001 - reported by the assertion below
                errors.append(e)

        # Two clients at once; the same kernel id in both jobs is two kernels (ids are per job).
        a = threading.Thread(target=client, args=("a", [kernel("good_torch.py", "k1"), kernel("segfault.py", "k2"),
                                                         kernel("wrong_result.py", "k3")]))
        b = threading.Thread(target=client, args=("b", [kernel("good_triton.py", "k1"), kernel("good_torch.py", "k4")]))
        a.start()
        b.start()
        a.join(300)
        b.join(300)
        assert not errors, errors
        rows_a = {r["kernel_id"]: r for r in results["a"]}
        rows_b = {r["kernel_id"]: r for r in results["b"]}
        assert sorted(rows_a) == ["k1", "k2", "k3"] and sorted(rows_b) == ["k1", "k4"]
        why = {f"{c}/{k}": (r["failure_kind"], r["error"]) for c, rows in (("a", rows_a), ("b", rows_b))
               for k, r in rows.items() if r["status"] != "ok"}
        assert rows_a["k1"]["status"] == "ok" and rows_a["k1"]["speedup"] > 0, why
        assert rows_a["k2"]["failure_kind"] == "crashed" and "SIGSEGV" in rows_a["k2"]["error"]
        assert rows_a["k3"]["failure_kind"] == "incorrect"
        assert rows_b["k1"]["status"] == "ok" and rows_b["k4"]["status"] == "ok", why  # after the crash: served on
        assert {r["batch_id"] for r in results["a"]} != {r["batch_id"] for r in results["b"]}
        assert all(r["protocol"] == "kernelcast" and r["hardware_id"] == "cpu" for r in results["a"] + results["b"])
        # Warm: a second job takes no start-up and no reference timing (the book has them).
        t0 = time.monotonic()
        again = sq.submit([kernel("good_torch.py", "k5")], queue=queue, device="cpu", timeout_s=120)
        assert again[0]["status"] == "ok" and time.monotonic() - t0 < 60
        end = time.monotonic() + 10  # status.json is rewritten every 2 s
        while (status := json.loads((queue / "status.json").read_text()))["measured"] < 6 and time.monotonic() < end:
            time.sleep(0.2)
        assert status["state"] == "ready" and status["measured"] == 6 and status["ok"] == 4
        assert status["phases_s"]["timing_s"] > 0 and status["ready_after_s"] is not None
        with pytest.raises(sq.ServiceError, match="measures under kernelcast"):
            sq.submit([kernel("good_torch.py")], queue=queue, device="cpu", protocol="gpumode")
    finally:
        proc.send_signal(signal.SIGTERM)
        err = wait_exit(proc)
    assert proc.returncode == 0, err
    assert "stopped (SIGTERM)" in err
    assert not (queue / sq.LOCK).exists() and not sq.running(queue, "cpu")
    assert not list((queue / sq.JOBS).iterdir())  # every job answered and collected


@pytest.mark.slow
def test_a_stop_file_stops_the_service_and_an_unfinished_job_goes_back_to_the_queue(tmp_path):
    queue = tmp_path / "queue"
    proc = start_service(queue, "--stop-grace-s", "1")
    got: list[BaseException] = []

    def client() -> None:
        try:
            sq.submit([kernel("hang_python.py")], queue=queue, device="cpu", timeout_s=120)
        except BaseException as e:  # noqa: BLE001
            got.append(e)

    # A job no client waits for: it must survive the stop for the next service.
    sq.write_atomic(queue / sq.JOBS / "0000000000000-orphan.job",
                    {"format": sq.FORMAT, "job_id": "0000000000000-orphan", "kernels": [kernel("hang_python.py", "h2")]})
    t = threading.Thread(target=client)
    t.start()
    end = time.monotonic() + 60
    while not list((queue / sq.JOBS).glob("*.taken")) and time.monotonic() < end:
        time.sleep(0.1)
    time.sleep(1.0)
    sq.request_stop(queue, "cpu")
    err = wait_exit(proc)
    t.join(30)
    assert proc.returncode == 0 and "stopped (stop file)" in err, err
    assert got and isinstance(got[0], sq.ServiceUnavailable)
    assert not (queue / sq.LOCK).exists()
    left = sorted(p.name for p in (queue / sq.JOBS).iterdir())
    assert left == ["0000000000000-orphan.job"]  # returned; the waiting client withdrew its own


def test_a_client_without_a_service_gets_a_one_line_error(tmp_path):
    with pytest.raises(sq.ServiceUnavailable, match="no measuring service queue"):
        sq.submit([kernel("good_torch.py")], queue=tmp_path / "nowhere", device="cpu")
    sq.make_private(tmp_path / "q")
    (tmp_path / "q" / sq.LOCK).write_text('{"pid": 1}')  # left by a killed service: nobody holds the flock
    assert not sq.running(tmp_path / "q", "cpu")
    with pytest.raises(sq.ServiceUnavailable, match="kernelcast serve-measure"):
        sq.submit([kernel("good_torch.py")], queue=tmp_path / "q", device="cpu")
    assert not list((tmp_path / "q" / sq.JOBS).iterdir())


def test_a_queue_others_can_enter_is_refused(tmp_path):
    q = tmp_path / "open"
    q.mkdir(mode=0o755)
    os.chmod(q, 0o755)
    with pytest.raises(sq.ServiceError, match="0700"):
        sq.make_private(q)
    with pytest.raises(sq.ServiceError, match="0700"):
        sq.submit([kernel("good_torch.py")], queue=q, device="cpu")


def test_the_service_refuses_a_second_instance_and_a_bad_job(tmp_path):
    from pipelines.profiling.service import JobStore, _Lock
    from pipelines.profiling.worker_config import WorkerError

    q = tmp_path / "q"
    sq.make_private(q)
    lock = _Lock(q, {"pid": os.getpid()})
    try:
        assert sq.service_info(q)["pid"] == os.getpid()
        with pytest.raises(WorkerError, match="already runs"):
            _Lock(q, {"pid": 0})
    finally:
        lock.release()
    assert sq.service_info(q) is None
    store = JobStore(q, "kernelcast")
    from pipelines.profiling.service import _Job

    job = _Job("j1", q / sq.JOBS / "j1.taken", set())
    store.jobs["j1"] = job
    store.add(job, "j1/0", "mine")
    store.append({"kernel_id": "j1/0", "status": "ok", "batch_id": "x"})
    doc = json.loads((q / sq.JOBS / "j1.rows").read_text())
    assert doc["rows"] == [{"kernel_id": "mine", "status": "ok", "batch_id": "j1"}] and doc["error"] is None


def test_job_files_are_capped_before_decoding(tmp_path):
    big = tmp_path / "big.job"
    big.write_bytes(b"[" * 2000)
    with pytest.raises(ValueError, match="larger than"):
        sq.read_capped(big, limit=1000)
    with pytest.raises(ValueError, match="not a JSON object"):
        big.write_text("[1]")
        sq.read_capped(big)


def test_queue_order_groups_tasks_and_puts_torch_compile_last():
    ks = [{"kernel_id": str(i), "task": t, "source": s} for i, (t, s) in enumerate(
        [("a", "x"), ("b", "@torch.compile\ndef f(): ..."), ("b", "y"), ("a", "z"), ("c", "w"), ("b", "v")])]
    assert [k["kernel_id"] for k in order_kernels(ks)] == ["0", "3", "2", "5", "4", "1"]
    assert [k["task"] for k in order_kernels(ks, first_task="c")][:1] == ["c"]
    assert uses_torch_compile("from torch import compile as c") and not uses_torch_compile("compiled = 1")


def test_the_queue_is_one_per_gpu(monkeypatch, tmp_path):
    monkeypatch.delenv(sq.ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4")
    assert sq.default_queue("cuda") == tmp_path / ".cache" / "kernelcast" / "measure" / "cuda-3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert sq.default_queue("cuda").name == "cuda-0" and sq.default_queue("cpu").name == "cpu"
    monkeypatch.setenv(sq.ENV, str(tmp_path / "q"))
    assert sq.default_queue("cuda") == tmp_path / "q" and sq.default_queue("cuda", "x") == Path("x")


@pytest.mark.slow
def test_the_live_search_measures_through_the_service_and_falls_back_without_one(tmp_path):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from pipelines.search.live import main
    from warehouse.formats import RESULT_SCHEMA

    def args(work: Path, out: Path, *extra: str) -> list[str]:
        return ["--tasks", "softmax", "--modes", "standard,filtered", "--seeds", "1", "--budget", "3",
                "--forecaster", "uniform", "--device", "cpu", "--workdir", str(work), "--out", str(out),
                "--worker-arg=--compile-workers=2", "--queue", str(queue), *extra]

    queue = tmp_path / "queue"
    # No service: "on" stops with a one-line reason, "auto" measures with worker runs.
    assert main(args(tmp_path / "w0", tmp_path / "o0", "--service", "on")) == 3
    stopped = json.loads((tmp_path / "o0" / "live-search.json").read_text())["stopped"]
    assert "no measuring service" in stopped
    # A softmax kernel in the interpreter on a loaded 2-core machine can take longer than the
    # 10 s the tiny-task tests allow; a root that times out would end both runs after one round.
    proc = start_service(queue, "--timeout-s", "180")
    try:
        assert main(args(tmp_path / "w1", tmp_path / "o1", "--service", "on")) == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        wait_exit(proc)
    rep = json.loads((tmp_path / "o1" / "live-search.json").read_text())
    assert rep["stopped"] is None and rep["unfinished_runs"] == 0
    failed = pq.read_table(tmp_path / "o1" / "results-live.parquet").filter(pc.field("status") != "ok")
    assert rep["service_runs"] == rep["worker_runs"] >= 2, failed.select(["kernel_id", "failure_kind", "error"]).to_pylist()
    assert all(r["measurements"] == 3 and r["finished"] == "budget spent" for r in rep["runs"])
    results = pq.read_table(tmp_path / "o1" / "results-live.parquet")
    assert results.schema.equals(RESULT_SCHEMA) and results.num_rows == rep["kernels_measured"]


@pytest.mark.slow
def test_kernelcast_serve_measure_starts_reports_and_stops(tmp_path):
    queue = tmp_path / "queue"
    env = {**os.environ, taskload.ENV_VAR: f"tiny_scale={FIXTURES / 'tiny_task.py'}", "PYTHONPATH": str(REPO)}
    cli = [sys.executable, "-m", "orchestration.cli", "serve-measure", "--device", "cpu", "--queue", str(queue)]
    proc = subprocess.Popen([*cli, "--compile-workers", "1", "--ref-cache", "off"], cwd=REPO, env=env,
                            stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 90
    while not sq.running(queue, "cpu"):
        assert proc.poll() is None and time.monotonic() < end, proc.stderr.read() if proc.poll() is not None else "slow"
        time.sleep(0.1)
    got = subprocess.run([*cli, "--status"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0 and json.loads(got.stdout)["running"] is True
    stopped = subprocess.run([*cli, "--stop"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    err = wait_exit(proc)
    assert proc.returncode == 0 and "measuring service stopped (stop file)" in err, err
    again = subprocess.run([*cli, "--device", "gpu"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and again.stderr.strip().count("\n") == 0 and "cuda or cpu" in again.stderr


@pytest.mark.slow
def test_the_measure_step_hands_its_shard_to_a_running_service(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.profiling import launch
    from warehouse.formats import BATCH_SCHEMA, RESULT_SCHEMA

    queue = tmp_path / "queue"
    monkeypatch.setenv(sq.ENV, str(queue))  # the step finds the service through its default queue
    batch, out = tmp_path / "batch-gpu0.parquet", tmp_path / "results-gpu0.parquet"
    pq.write_table(pa.Table.from_pylist([kernel("good_torch.py", "a"), kernel("raises.py", "b")], schema=BATCH_SCHEMA), batch)
    proc = start_service(queue)
    try:
        assert launch.run_worker(batch, out, device="cpu", timeout_s=10, compile_workers=1) == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        wait_exit(proc)
    table = pq.read_table(out)
    rows = {r["kernel_id"]: r for r in table.to_pylist()}
    assert table.schema.equals(RESULT_SCHEMA) and sorted(rows) == ["a", "b"]
    assert rows["a"]["status"] == "ok" and rows["b"]["failure_kind"] == "runtime_error"
    assert len({r["batch_id"] for r in rows.values()}) == 1


def test_a_given_order_that_thrashes_the_input_caches_is_named_at_the_start():
    """`--order given` keeps the batch's order; one that switches task kernel by kernel, or puts
    torch.compile kernels before plain ones, is told in one warning; runs of one task are not."""
    import doctest

    from pipelines.profiling import worker_loop
    from pipelines.profiling.worker_loop import given_order_warning

    alternating = [{"task": t, "source": "import triton"} for t in ("softmax", "rms_norm") * 30]
    warning = given_order_warning(alternating)
    assert warning.startswith("--order given: the batch switches task 59 times in 60 kernels")
    runs = [{"task": t, "source": "import triton"} for t in ["softmax"] * 64 + ["rms_norm"] * 64]
    assert given_order_warning(runs) is None
    compiled_first = [{"task": "softmax", "source": "f = torch.compile(g)"}, *runs]
    assert "1 torch.compile kernels come before plain ones" in given_order_warning(compiled_first)
    assert given_order_warning([*runs, {"task": "softmax", "source": "f = torch.compile(g)"}]) is None
    assert doctest.testmod(worker_loop).failed == 0
