"""The measuring queue's failure modes, on the service's own intake (`_ServiceRun._take`,
`_recover`, `_Lock`) without its measuring children: a corrupt job, a service killed while it
holds a job, several intakes claiming one job, and duplicates (a kernel twice in a job, a job id
twice in the queue). The slow end-to-end runs are in test_measuring_service.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import pytest

from pipelines.profiling import service_queue as sq
from pipelines.profiling.service import STALE_ROWS_S, JobStore, _Lock, _recover, _ServiceRun
from pipelines.profiling.worker_config import WorkerConfig

REPO = Path(__file__).resolve().parents[2]


def intake(queue: Path) -> _ServiceRun:
    """A service's queue side alone: the job store and the kernel queue `_take` fills."""
    run = object.__new__(_ServiceRun)
    run.queue_dir, run.cfg = queue, WorkerConfig(device="cpu")
    run.jobstore = JobStore(queue, run.cfg.protocol)
    run.queue, run.total = deque(), 0
    return run


def job(queue: Path, job_id: str, kernel_ids=("k1",)) -> Path:
    path = queue / sq.JOBS / f"{job_id}.job"
    sq.write_atomic(path, {"format": sq.FORMAT, "job_id": job_id, "protocol": None,
                           "kernels": [{"kernel_id": k, "task": "softmax", "source": f"# {k}"} for k in kernel_ids]})
    return path


@pytest.fixture()
def queue(tmp_path) -> Path:
    q = tmp_path / "q"
    sq.make_private(q)
    return q


@pytest.mark.parametrize(("content", "reason"), [
    (b"{not json", "Expecting property name"),
    (json.dumps({"format": 99, "kernels": []}).encode(), "not a measuring-service job"),
    (json.dumps({"format": sq.FORMAT, "kernels": [{"kernel_id": 1, "task": "t", "source": "s"}]}).encode(),
     "string kernel_id, task and source"),
    (json.dumps({"format": sq.FORMAT, "protocol": "gpumode", "kernels": []}).encode(), "the job asks for gpumode"),
])
def test_a_corrupt_job_is_answered_with_its_reason_and_the_next_is_taken(queue, content, reason):
    (queue / sq.JOBS / "bad.job").write_bytes(content)
    good = job(queue, "good")
    run = intake(queue)
    assert run._take(queue / sq.JOBS / "bad.job") is False
    answer = json.loads((queue / sq.JOBS / "bad.rows").read_text())
    assert reason in answer["error"] and "\n" not in answer["error"] and answer["rows"] == []
    assert not (queue / sq.JOBS / "bad.taken").exists()  # answered, not left taken
    assert run._take(good) is True  # the service goes on
    assert [k["kernel_id"] for k in run.queue] == ["good/0"] and set(run.jobstore.jobs) == {"good"}
    assert set(run.jobstore.owner) == {"good/0"}  # nothing of the corrupt job is waited for


_TAKER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_measuring_queue_failures import intake
from pipelines.profiling.service import _Lock
q = Path(sys.argv[1])
lock = _Lock(q, {{"pid": 0, "protocol": "kernelcast"}})
run = intake(q)
while True:
    for p in sorted((q / "jobs").glob("*.job")):
        run._take(p)
    time.sleep(0.02)
"""


def test_a_service_killed_mid_job_leaves_the_job_to_the_next_and_its_client_a_one_line_error(queue, tmp_path):
    taker = subprocess.Popen([sys.executable, "-c", _TAKER.format(tests=str(Path(__file__).parent)), str(queue)],
                             cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE, text=True)
    got: list[BaseException] = []
    client = threading.Thread(target=lambda: got.extend(_raised(lambda: sq.submit(
        [{"kernel_id": "k1", "task": "softmax", "source": "# k1"}], queue=queue, device="cpu", timeout_s=60))))
    try:
        end = time.monotonic() + 30
        while not sq.running(queue, "cpu"):
            assert taker.poll() is None and time.monotonic() < end, taker.stderr.read()
            time.sleep(0.05)
        client.start()
        while not list((queue / sq.JOBS).glob("*.taken")):
            assert time.monotonic() < end, "the job was not taken"
            time.sleep(0.05)
    finally:
        taker.send_signal(signal.SIGKILL)  # no handler, no give_back: only the kernel cleans up
        taker.wait(10)
    client.join(30)
    assert got and isinstance(got[0], sq.ServiceUnavailable) and "stopped before the job was done" in str(got[0])
    assert sq.service_info(queue) is None  # the flock died with it; the lock file is still there
    assert (queue / sq.LOCK).exists()
    (taken,) = (queue / sq.JOBS).glob("*.taken")

    # The next service: takes the lock, puts the job back, and measures it.
    stale, fresh = queue / sq.JOBS / "old.rows", queue / sq.JOBS / "new.rows"
    stale.write_text("{}")
    fresh.write_text("{}")
    os.utime(stale, (time.time() - STALE_ROWS_S - 60,) * 2)
    (queue / sq.STOP).touch()  # meant for the dead one
    lock = _Lock(queue, {"pid": os.getpid()})
    try:
        _recover(queue)
        assert not taken.exists() and taken.with_suffix(".job").exists()
        assert not stale.exists() and fresh.exists() and not (queue / sq.STOP).exists()
        run = intake(queue)
        assert run._take(taken.with_suffix(".job")) is True and len(run.queue) == 1
    finally:
        lock.release()


def _raised(call) -> list[BaseException]:
    try:
        call()
    except BaseException as e:  # noqa: BLE001 - handed to the assertion
        return [e]
    return []


def test_of_several_intakes_claiming_one_job_exactly_one_gets_it(queue):
    path = job(queue, "shared", ("k1", "k2"))
    runs = [intake(queue) for _ in range(8)]
    start = threading.Barrier(len(runs))
    taken: list[bool] = [False] * len(runs)

    def claim(i: int) -> None:
        start.wait()
        taken[i] = runs[i]._take(path)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(runs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert taken.count(True) == 1
    assert sum(len(r.queue) for r in runs) == 2  # its kernels queued once, by the one that won
    assert [p.name for p in (queue / sq.JOBS).iterdir()] == ["shared.taken"]
    # A job withdrawn by its client before the intake reaches it is simply not there.
    gone = job(queue, "withdrawn")
    gone.unlink()
    assert intake(queue)._take(gone) is False and not (queue / sq.JOBS / "withdrawn.rows").exists()


def test_a_kernel_twice_in_a_job_is_measured_once_and_an_empty_job_is_answered(queue):
    run = intake(queue)
    assert run._take(job(queue, "twice", ("k1", "k1", "k2"))) is True
    assert [k["kernel_id"] for k in run.queue] == ["twice/0", "twice/1"]
    assert run._take(job(queue, "empty", ())) is False
    assert json.loads((queue / sq.JOBS / "empty.rows").read_text())["rows"] == []


def test_a_job_id_already_open_waits_until_the_open_job_is_answered(queue):
    run = intake(queue)
    assert run._take(job(queue, "same", ("a",))) is True
    duplicate = job(queue, "same", ("b",))
    assert run._take(duplicate) is False  # not taken over the open one
    assert duplicate.exists() and (queue / sq.JOBS / "same.taken").exists()
    assert [k["kernel_id"] for k in run.queue] == ["same/0"] and run.jobstore.owner == {"same/0": ("same", "a")}
    run.jobstore.append({"kernel_id": "same/0", "status": "ok"})
    assert [r["kernel_id"] for r in json.loads((queue / sq.JOBS / "same.rows").read_text())["rows"]] == ["a"]
    assert run._take(duplicate) is True  # answered: the duplicate is an ordinary job now
    assert run.jobstore.owner == {"same/0": ("same", "b")}
