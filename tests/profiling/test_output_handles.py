"""Outputs handed to the verifier as CUDA IPC handles: the format, the fallback to a file when
the verifier cannot map them, and (on a GPU) the real hand-over between two processes."""

from __future__ import annotations

import json

import pytest
import torch

from pipelines.profiling import shipping, verdicts, verifier, verify
from pipelines.profiling.inputs import make_input
from pipelines.tasks import get_task


def _handle_file(path, entries, tree=None) -> None:
    header = json.dumps({"tree": tree or {"t": "tensor", "i": 0}, "tensors": entries}).encode()
    path.write_bytes(shipping.IPC_MAGIC + len(header).to_bytes(8, "little") + header)


ENTRY = {"dtype": "float32", "shape": [4], "nbytes": 16, "handle": "00" * 64, "offset": 0, "device": "GPU-x"}


def test_a_verifier_without_a_gpu_asks_for_the_file_and_uses_no_step(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCAST_DEVICE", "cpu")
    task = get_task("softmax")
    case = task.correctness_cases[0]
    v = verifier.Verifier({"device": "cpu", "protocol": "kernelcast"})
    base = {"job": "j1", "kind": "check", "task": "softmax", "salt": 0, "case_id": task.case_id(case)}
    handles = tmp_path / "handles"
    _handle_file(handles, [ENTRY])
    r = v.handle({**base, "path": str(handles)})
    assert r["resend"] and not r["ok"] and "no GPU" in r["message"] and "step" not in r
    good = tmp_path / "good"
    shipping.write_output(good, task.ref_kernel(make_input(task, case)))
    r = v.handle({**base, "path": str(good)})  # the same step, now as a file
    assert r["ok"] and r["step"] == 1 and r["shipped"] == "file"


@pytest.mark.parametrize("entry", [
    {**ENTRY, "nbytes": 15},            # size does not match the shape
    {**ENTRY, "dtype": "object"},       # not an allowed dtype
    {**ENTRY, "shape": "4"},            # not a shape
    {**ENTRY, "dtype": ["float32"]},    # not even a name
    {**ENTRY, "offset": -64},           # before the block
    {**ENTRY, "handle": "zz" * 64},     # not hex
    {**ENTRY, "handle": "00" * 63},     # not 64 bytes
    {**ENTRY, "handle": 7},             # not a string
    {**ENTRY, "handle": None},          # no handle, yet 16 bytes to hand over
])
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_malformed_handle_entries_are_refused_as_outputs(tmp_path, entry, device):
    path = tmp_path / "h"
    _handle_file(path, [entry])
    with pytest.raises(shipping.ShippingError) as e:  # refused, not "send a file", on any verifier
        shipping.read_output(path, device)
    assert not isinstance(e.value, shipping.NeedsFile)


def test_an_empty_tensor_travels_as_its_shape_without_a_handle(tmp_path):
    path = tmp_path / "h"
    _handle_file(path, [{**ENTRY, "shape": [0, 4], "nbytes": 0, "handle": None}])
    with pytest.raises(shipping.NeedsFile, match="no GPU"):  # a valid entry: only the GPU is missing here
        shipping.read_output(path, "cpu")


def test_cpu_outputs_go_as_files_even_with_ipc_on(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    task = get_task("softmax")
    sent: list[dict] = []
    seen_magic: list[bytes] = []

    def send(msg):
        sent.append(msg)
        seen_magic.append((tmp_path / msg["file"]).read_bytes()[:8])

    judge = verify.ChannelJudge(send, lambda: {"type": "verdict", "seq": sent[-1]["seq"], "ok": True}, ipc=True)
    ok, _ = judge.judge(task, task.correctness_cases[0], 0, torch.ones(3))
    assert ok and seen_magic == [shipping.MAGIC] and judge.ipc  # no handle to make: not a failure of IPC
    assert not list(tmp_path.glob("out-*.kco"))  # the shipped file is removed after the verdict


class _Child:
    private_dir, uid = "/nonexistent", None


class _VerifierEnd:
    """The verifier's end of the link: messages queued for on_message to read."""

    ready = True

    def __init__(self):
        self.inbox: list[dict] = []
        self.sent: list[dict] = []

    def recv(self):
        return self.inbox.pop(0)

    def send(self, msg):
        self.sent.append(msg)


def test_the_link_passes_a_resend_on_without_counting_it_as_a_verdict():
    link = verdicts.VerifierLink(spawn=_VerifierEnd)
    child = _Child()
    request = {"type": "verify", "seq": 1, "case_id": "c", "salt": 0, "file": "out-000001.kco"}
    assert link.forward(child, "j", "check", "softmax", request) is None
    link.sb.inbox.append({"type": "verdict", "job": "j", "seq": 1, "ok": False, "resend": True, "message": "x"})
    assert link.on_message() == [(child, {"type": "verdict", "seq": 1, "ok": False, "resend": True})]
    assert link.forward(child, "j", "check", "softmax", request) is None  # the file: not out of plan
    link.sb.inbox.append({"type": "verdict", "job": "j", "seq": 1, "ok": True, "step": 1, "of": 1, "shipped": "file"})
    assert link.on_message() == [(child, {"type": "verdict", "seq": 1, "ok": True})]
    v = link.outcome("j")
    assert v.complete and not v.unexpected and v.failure is None and link.resent == 1 and link.shipped["file"] == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_output_arrives_from_another_process_equal_both_ways():
    from pipelines.profiling import cuda_ipc

    report = cuda_ipc.self_test(8)
    assert report["ipc_equal"] and report["file_equal"]


def test_the_verifier_gives_back_spare_gpu_memory_only_on_a_gpu():
    assert verifier.release_spare_gpu_memory("cpu") is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_verifier_gives_back_what_its_allocator_holds_beyond_the_spare():
    """A reference's intermediates, freed, stay reserved by torch's allocator until given back."""
    spare = 2**30
    work = torch.empty(2 * spare, dtype=torch.uint8, device="cuda")
    kept = torch.empty(2**20, dtype=torch.uint8, device="cuda")
    del work
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() > spare
    assert verifier.release_spare_gpu_memory("cuda", spare) is True
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() <= spare
    assert verifier.release_spare_gpu_memory("cuda", spare) is False and kept.numel() == 2**20


@pytest.mark.parametrize("tree", [
    {"t": "dict", "items": [["k"]]},                  # an item that is not a pair
    {"t": "dict", "items": [[["k"], {"t": "none"}]]},  # an unhashable key
    {"t": "list", "items": 7},                         # items that are not a list
    {"t": "dict", "items": [[1.5, {"t": "none"}]]},    # a key `_encode` never writes
    {"t": "dict", "items": [[True, {"t": "none"}]]},   # nor this one
    {"t": "dict", "items": {"k": {"t": "none"}}},      # pairs as a mapping
])
def test_malformed_output_trees_are_refused_as_outputs(tmp_path, tree):
    path = tmp_path / "o"
    header = json.dumps({"tree": tree, "tensors": []}).encode()
    path.write_bytes(shipping.MAGIC + len(header).to_bytes(8, "little") + header)
    with pytest.raises(shipping.ShippingError, match="malformed"):
        shipping.read_output(path)


def test_the_verifier_says_how_an_output_came(tmp_path):
    path = tmp_path / "o"
    shipping.write_output(path, torch.ones(2))
    value, kind = shipping.read_shipped(path)
    assert kind == "file" and torch.equal(value, torch.ones(2))


# ---- several outputs in flight ------------------------------------------------------------------
def test_the_link_keeps_several_requests_of_a_job_in_flight_and_answers_them_in_order():
    link = verdicts.VerifierLink(spawn=_VerifierEnd)
    child = _Child()
    for seq in (1, 2, 3):
        request = {"type": "verify", "seq": seq, "case_id": "c", "salt": 0, "file": f"out-00000{seq}.kco"}
        assert link.forward(child, "j", "check", "softmax", request) is None
    assert [m["seq"] for m in link.sb.sent] == [1, 2, 3]
    for ok in (True, False, True):
        link.sb.inbox.append({"type": "verdict", "job": "j", "seq": 0, "ok": ok, "step": 1, "of": 3, "message": "m"})
    assert [r for _, r in (link.on_message() + link.on_message() + link.on_message())] == [
        {"type": "verdict", "seq": 1, "ok": True}, {"type": "verdict", "seq": 2, "ok": False},
        {"type": "verdict", "seq": 3, "ok": True}]
    v = link.outcome("j")
    assert v.done == 2 and v.failure == "m" and not v.unexpected
    # more than a judge may have in flight is out of plan
    for seq in range(verify.ChannelJudge.MAX_PENDING + 1):
        reply = link.forward(child, "k", "check", "softmax", {"seq": seq, "file": f"out-{seq:06d}.kco"})
    assert reply == {"type": "verdict", "seq": verify.ChannelJudge.MAX_PENDING, "ok": False}
    assert link.outcome("k").unexpected


def test_outputs_sent_before_a_resend_come_again_after_it_in_plan_order(tmp_path, monkeypatch):
    """A verifier that cannot map the first of three outputs in flight: it asks for each again as a
    file, and takes them in the order of its plan."""
    monkeypatch.setenv("KERNELCAST_DEVICE", "cpu")
    task = get_task("softmax")
    cases = task.correctness_cases[:2]
    v = verifier.Verifier({"device": "cpu", "protocol": "kernelcast"})
    base = {"job": "j1", "kind": "check", "task": "softmax"}
    handles = tmp_path / "handles"
    _handle_file(handles, [ENTRY])
    files = []
    for i, case in enumerate(cases):
        files.append(tmp_path / f"f{i}")
        shipping.write_output(files[-1], task.ref_kernel(make_input(task, case)))
    step = lambda case, path, salt=0: {**base, "case_id": task.case_id(case), "salt": salt, "path": str(path)}  # noqa: E731
    assert v.handle(step(cases[0], handles))["resend"]
    r = v.handle(step(cases[1], files[1]))  # sent before the child knew: asked for again, no step used
    assert r["resend"] and not r["ok"] and "step" not in r
    assert v.handle(step(cases[0], files[0]))["step"] == 1
    assert v.handle(step(cases[1], files[1]))["step"] == 2
    # once the step asked for came, a request out of plan is out of plan again
    r = v.handle(step(cases[1], files[1]))
    assert r["unexpected"] and not r["ok"]


def test_the_judge_collects_outputs_in_flight_and_ships_again_what_the_verifier_asks_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    task = get_task("softmax")
    case = task.correctness_cases[0]
    sent: list[dict] = []
    replies: list[dict] = []

    def send(msg):
        sent.append(dict(msg))
        if len(sent) == 3:  # the verifier answers once all three are in: a resend, then verdicts
            replies.extend([{"type": "verdict", "seq": 1, "ok": False, "resend": True},
                            {"type": "verdict", "seq": 2, "ok": True}, {"type": "verdict", "seq": 3, "ok": False}])
        elif len(sent) == 4:
            replies.append({"type": "verdict", "seq": 1, "ok": True})

    judge = verify.ChannelJudge(send, lambda: replies.pop(0), ipc=False)
    for _ in range(3):
        judge.submit(task, case, 0, torch.ones(3))
    assert [m["seq"] for m in sent] == [1, 2, 3] and len(replies) == 3  # nothing read yet
    assert judge.collect() == [(True, "ok"), (True, "ok"), (False, "rejected by the verifier")]
    assert [m["seq"] for m in sent] == [1, 2, 3, 1] and not judge.pending
    assert not list(tmp_path.glob("out-*.kco"))
