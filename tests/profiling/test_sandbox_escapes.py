"""The sandbox escapes of issue 25 closed, each with a hostile kernel (tests/fixtures_kernels/
hostile.py, the block at its end) and what it aimed at watched from outside: a Unix socket on
the host, the caller's 0600 files (with the interpreter under a 0700 home), other processes'
command lines, a second "ready", messages too deep or too long for the parent, a thread left
running into the next kernel, a verifier made to recurse, the Triton cache, /dev/shm and the
private folder. Real children, real sandboxes (jail.py), the Triton interpreter.

Which layers a host gives depends on its privileges: a test asserts containment where the
layer that gives it is in the row's `sandbox` column, and says so where it is not.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.profiling import layer_probe, sandbox, sandbox_policy, shipping, taskload
from pipelines.profiling.check import check_sources
from pipelines.profiling.worker import run_batch
from pipelines.profiling.worker_config import WorkerConfig
from tests.profiling.test_sandbox_hostile import _jail
from warehouse.formats import BATCH_SCHEMA

FIXTURES = Path(__file__).parent.parent / "fixtures_kernels"
REPO = Path(__file__).resolve().parents[2]
hostile = taskload.module_from_file(FIXTURES / "hostile.py", "hostile_kernels_escapes")
POLICY = sandbox_policy.SandboxPolicy(memory_bytes=3 * sandbox_policy.GIB, processes=64, shm_bytes=256 * 2**20, private_files=500)
WITNESS = "kc-argv-witness-" + os.urandom(4).hex()
SECRET = "kc-private-key-" + os.urandom(4).hex()


@pytest.fixture
def open_dir():
    """A folder every uid can reach (pytest's tmp_path sits under a 0700 folder)."""
    d = Path(tempfile.mkdtemp(prefix="kc-escapes-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def targets(open_dir, monkeypatch):
    """A Unix listener, a process with a marker in its argv, and a 0700 home with a 0600 key."""
    monkeypatch.setenv(taskload.ENV_VAR, f"tiny_scale={FIXTURES / 'tiny_task.py'}")
    home = open_dir / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_rsa"
    key.write_text(SECRET)
    os.chmod(key, 0o600)
    os.chmod(home, 0o700)
    monkeypatch.setenv("HOME", str(home))
    listener, witness = hostile.UnixListener(str(open_dir)), hostile.ArgvWitness(WITNESS)
    params = {"unix_path": listener.path, "unix_abstract": listener.abstract, "proc_marker": WITNESS,
              "secret_files": [str(key), "/etc/shadow"], "shm_mb": 512, "files": 2000}
    yield {"params": params, "listener": listener, "key": key}
    listener.close()
    witness.close()


def _check(names: list[str], params: dict, policy=POLICY, workers: int = 1) -> dict[str, tuple[str | None, str, str]]:
    outcomes = check_sources([("tiny_scale", hostile.render(n, **params)) for n in names], n_workers=workers,
                             timeout_s=30, policy=policy)
    got = {n: (None if o.ok else o.failure_kind, o.message, o.sandbox) for n, o in zip(names, outcomes)}
    for name, (kind, msg, layers) in got.items():
        print(f"  {name:20s} {kind!s:14s} {msg[:110]}  [{layers}]")
    return got


@pytest.mark.slow
def test_unix_sockets_the_callers_files_and_other_processes_stay_out_of_reach(targets):
    names = ["unix_socket", "caller_secrets", "proc_snoop"]
    got = _check(names, targets["params"])
    layers = set(got["unix_socket"][2].split(","))
    time.sleep(0.5)  # let the listener read anything in flight
    if "nounix" in layers:
        assert got["unix_socket"][0] == "runtime_error" and targets["listener"].got == []
    if {"masks", "uid"} & layers:
        assert got["caller_secrets"][0] == "runtime_error" and SECRET not in got["caller_secrets"][1]
    if "proc" in layers:
        assert got["proc_snoop"][0] == "runtime_error"
    if os.geteuid() == 0:  # this host: everything is there, and the child has an unprivileged uid
        assert {"nounix", "masks", "proc", "uid"} <= layers, layers


def test_the_listener_and_the_witness_are_reachable_from_the_host(targets):
    """What the test above watches is real: a host process does reach both."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(targets["listener"].path)
        s.sendall(b"from-the-host")
    time.sleep(0.5)
    assert targets["listener"].got == ["from-the-host"]
    assert any(WITNESS.encode() in Path(f"/proc/{p}/cmdline").read_bytes() for p in os.listdir("/proc")
               if p.isdigit() and Path(f"/proc/{p}/cmdline").exists())


@pytest.mark.slow
@pytest.mark.parametrize("skip", ["uid", "pidns"])
def test_without_a_sandbox_uid_or_a_pid_namespace_the_files_and_proc_stay_hidden(targets, monkeypatch, skip):
    """Where CUDA stops a layer (the H200 host: no uid, no PID namespace), the masks and a
    hidepid /proc still hold."""
    monkeypatch.setenv(sandbox_policy.SKIP_ENV, skip)
    got = _check(["caller_secrets", "proc_snoop"], targets["params"], sandbox_policy.policy_from_env(POLICY))
    layers = set(got["caller_secrets"][2].split(","))
    assert skip not in layers
    if "masks" in layers:
        assert got["caller_secrets"][0] == "runtime_error" and SECRET not in got["caller_secrets"][1]
    if "proc" in layers:
        assert got["proc_snoop"][0] == "runtime_error"


@pytest.mark.slow
def test_messages_the_harness_never_sends_are_the_kernels_failure_and_the_run_goes_on(targets):
    names = ["second_ready", "deep_message", "long_message", "verifier_recursion"]
    got = _check(names + ["lingering_thread", "thread_survivor"], targets["params"])
    for name in names:
        assert got[name][0] in hostile.KINDS[name], (name, got[name])
    assert "second 'ready'" in got["second_ready"][1] and "forged" not in got["second_ready"][2]
    assert "nested deeper" in got["deep_message"][1] and "over" in got["long_message"][1]
    assert "refused" in got["verifier_recursion"][1]  # incorrect, not the verifier's failure
    # one worker: the survivor runs right after the lingering thread's kernel, in a new child
    assert got["lingering_thread"][0] is None  # a thread is no cheat: its child is replaced (torch.compile leaves pools)
    assert got["thread_survivor"][0] == "runtime_error"


@pytest.mark.slow
def test_kernelcast_check_prints_its_json_for_a_message_that_would_crash_the_decoder(tmp_path):
    kernel = tmp_path / "k.py"
    kernel.write_text(hostile.render("deep_message"))
    res = subprocess.run([sys.executable, "-m", "orchestration.cli", "check", "--task", "softmax", "--kernel", str(kernel),
                          "--json", "--timeout-s", "60"], capture_output=True, text=True, cwd=REPO, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 1, (res.stdout[-500:], res.stderr[-1500:])
    report = json.loads(res.stdout)  # its JSON report, and nothing else
    assert report["failure_kind"] == "tampered" and "RecursionError" not in res.stderr


@pytest.mark.slow
def test_the_triton_cache_dev_shm_and_the_private_folder(targets, monkeypatch, open_dir):
    shared = open_dir / "user-triton-cache"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(shared))  # the caller's own cache: no check child may write it
    monkeypatch.setenv(sandbox_policy.SKIP_ENV, "landlock")  # else Landlock alone refuses /dev/shm
    before = set(os.listdir("/dev/shm"))
    got = _check(["triton_cache_write", "shm_hoard", "private_hoard"], targets["params"], sandbox_policy.policy_from_env(POLICY))
    assert got["triton_cache_write"][0] == "runtime_error" and list(shared.iterdir()) == []
    assert got["private_hoard"][0] == "crashed" and "files in its private folder" in got["private_hoard"][1]
    if "shm" in got["shm_hoard"][2].split(","):
        assert got["shm_hoard"][0] == "runtime_error" and "then OSError" in got["shm_hoard"][1]  # ENOSPC at 256 MiB
    assert not [n for n in set(os.listdir("/dev/shm")) - before if n.startswith("kc-hoard")]


@pytest.mark.slow
def test_on_the_worker_path_the_measuring_child_cannot_write_the_shared_triton_cache(targets, tmp_path, monkeypatch):
    cache = tmp_path / "triton-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    names = ["triton_cache_write", "second_ready", "deep_message", "lingering_thread", "thread_survivor",
             "verifier_recursion"]
    rows = [{"kernel_id": n, "task": "tiny_scale", "source": hostile.render(n, **targets["params"])} for n in names]
    rows.append({"kernel_id": "good", "task": "tiny_scale", "source": (FIXTURES / "good_torch.py").read_text()})
    batch, out = tmp_path / "batch.parquet", tmp_path / "out.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=BATCH_SCHEMA), batch)
    run_batch(batch, out, WorkerConfig(device="cpu", compile_workers=1, timeout_s=20, max_reps=3))
    got = {r["kernel_id"]: r for r in pq.read_table(out).to_pylist()}
    print({k: (r["failure_kind"], r["error"]) for k, r in got.items()})
    assert got["good"]["status"] == "ok" and "forged" not in (got["good"]["sandbox"] or "")
    for name in names:
        assert got[name]["failure_kind"] in hostile.KINDS[name], (name, got[name]["error"])
    assert not (cache / "kc-poison").exists()


# ---- the layers on their own ------------------------------------------------------------------
def test_the_nounix_layer_refuses_unix_sockets_and_keeps_socket_pairs(open_dir):
    path = open_dir / "s.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    code = ("import socket, os\n"
            "a, b = socket.socketpair(); a.sendall(b'x'); assert b.recv(1) == b'x'\n"
            "try:\n"
            f"    socket.socket(socket.AF_UNIX).connect({str(path)!r}); print('connected')\n"
            "except PermissionError:\n"
            "    print('refused')\n"
            "print(os.environ['KERNELCAST_SANDBOX_LAYERS'])\n")
    try:
        res = _jail({"private_dir": str(open_dir), "want": ["nounix"], "limits": {}}, [sys.executable, "-I", "-c", code])
    finally:
        server.close()
    if '"nounix"' in res.stderr:
        pytest.skip(f"this host refuses seccomp filters: {res.stderr.strip()}")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.split()
    assert lines[0] == "refused" and "nounix" in lines[-1].split(",")


def _mount_want() -> list[str]:
    return ["mountns", "nocaps"] if os.geteuid() == 0 else ["mountns"]


def test_the_sockets_layer_hides_the_hosts_socket_files_where_nounix_is_not_applied(open_dir):
    """A host whose CUDA driver refuses `nounix` (the H200's) still keeps the socket files of
    /tmp and /run out of reach: the child sees /dev/null there and its connect is refused,
    while its own folder and socket pairs work as before."""
    own = open_dir / "own"
    own.mkdir()
    os.chmod(own, 0o777)
    servers, paths = [], {"tmp": str(open_dir / "host.sock")}
    run_dir = Path("/run") / f"kc-test-{os.getpid()}"
    if os.access("/run", os.W_OK):
        run_dir.mkdir(exist_ok=True)
        paths["run"] = str(run_dir / "daemon.sock")
    try:
        for path in paths.values():
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(path)
            server.listen()
            os.chmod(path, 0o777)
            servers.append(server)
        code = ("import socket, os, sys, json\n"
                "a, b = socket.socketpair(); a.sendall(b'x'); assert b.recv(1) == b'x'\n"
                "own = sys.argv[2] + '/mine.sock'; s = socket.socket(socket.AF_UNIX); s.bind(own); s.listen()\n"
                "socket.socket(socket.AF_UNIX).connect(own)\n"
                "got = {}\n"
                "for name, path in json.loads(sys.argv[1]).items():\n"
                "    try:\n"
                "        socket.socket(socket.AF_UNIX).connect(path); got[name] = 'connected'\n"
                "    except OSError as e:\n"
                "        got[name] = type(e).__name__\n"
                "print(json.dumps(got)); print(os.environ['KERNELCAST_SANDBOX_LAYERS'])\n")
        spec = {"private_dir": str(own), "want": [*_mount_want(), "sockets"], "limits": {},
                "mount_writable_dirs": [str(own)], "visible_paths": [sys.prefix, sys.base_prefix, str(REPO)]}
        res = _jail(spec, [sys.executable, "-I", "-c", code, json.dumps(paths), str(own)])
    finally:
        for server in servers:
            server.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    if "mountns" not in res.stdout:
        pytest.skip(f"no mount namespace on this host: {res.stderr.strip()[-200:]}")
    assert res.returncode == 0, res.stderr
    got, layers = res.stdout.strip().splitlines()
    assert "sockets" in layers.split(","), res.stderr
    # /tmp's socket reads as /dev/null (refused), /run is an empty tmpfs (no such file)
    want = {"tmp": "ConnectionRefusedError", "run": "FileNotFoundError"}
    assert json.loads(got) == {name: want[name] for name in paths}
    # the host still reaches its own socket: nothing was changed outside the child
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe, socket.socket(socket.AF_UNIX) as again:
        again.bind(paths["tmp"] + ".2")
        again.listen()
        probe.connect(paths["tmp"] + ".2")


def test_the_proc_and_shm_layers_give_a_private_proc_and_a_bounded_dev_shm(open_dir):
    code = ("import os\n"
            f"print('parent-visible', os.path.exists('/proc/{os.getpid()}'))\n"
            "st = os.statvfs('/dev/shm'); print('shm-bytes', st.f_blocks * st.f_frsize)\n"
            "print('sys-ro', bool(os.statvfs('/proc/sys').f_flag & os.ST_RDONLY))\n"
            "print('layers', os.environ['KERNELCAST_SANDBOX_LAYERS'])\n")
    spec = {"private_dir": str(open_dir), "want": [*_mount_want(), "proc", "shm"], "limits": {},
            "mount_writable_dirs": [str(open_dir)], "shm_bytes": 64 * 2**20}
    res = _jail(spec, [sys.executable, "-I", "-c", code])
    notes = layer_probe.read_notes(res.stderr)
    got = dict(line.split(" ", 1) for line in res.stdout.splitlines())
    print(got, notes)
    if os.geteuid() != 0 and "mountns" in notes:
        pytest.skip(f"no mount namespace for an unprivileged user here: {notes['mountns']}")
    assert res.returncode == 0, res.stderr
    layers = got["layers"].split(",")
    assert "proc" in layers and "shm" in layers, notes
    assert got["parent-visible"] == "False"  # this process (root, all capabilities) is hidden
    assert int(got["shm-bytes"]) == 64 * 2**20 and got["sys-ro"] == "True"


@pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox uid needs root")
def test_with_masks_a_sandbox_uid_runs_an_interpreter_under_a_0700_home_and_reads_no_secret(open_dir):
    """The issue's host: the interpreter (a venv) lives under a 0700 home beside a 0600 key."""
    home = open_dir / "home"
    venv = home / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(os.path.realpath(sys.executable), venv / "bin" / "python")
    key = home / "id_rsa"
    key.write_text(SECRET)
    os.chmod(key, 0o600)
    os.chmod(home, 0o700)
    private = open_dir / "private"
    private.mkdir()
    os.chown(private, 61990, 61000)
    code = ("import os, sys\nprint('uid', os.getuid())\n"
            f"try:\n    print('read', open({str(key)!r}).read())\nexcept OSError as e:\n    print('read', type(e).__name__)\n")
    argv = [str(venv / "bin" / "python"), "-I", "-S", "-c", code]
    base = {"private_dir": str(private), "uid": 61990, "gid": 61000, "limits": {}, "mount_writable_dirs": [str(private)]}
    without = _jail({**base, "want": ["uid"]}, argv)
    assert without.returncode == 127 and "Permission denied" in without.stderr  # the issue: the uid cannot start it
    spec = {**base, "want": ["uid", "mountns", "masks"], "hidden_dirs": [str(home), "/root"],
            "visible_paths": [str(venv), sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))]}
    res = _jail(spec, argv)
    assert res.returncode == 0, res.stderr
    got = dict(line.split(" ", 1) for line in res.stdout.splitlines())
    assert got["uid"] == "61990" and got["read"] == "FileNotFoundError"


def test_the_probe_retries_a_layer_dropped_before_the_one_that_was_at_fault(monkeypatch):
    """An H200 host lost its uid because the uid was dropped first while the namespaces kept
    CUDA from starting: each dropped layer gets one more try with the set that works."""
    def fake_once(policy, device, uid):
        if "netns" in policy.layers:  # the layer at fault
            return None, {}, "Error 304"
        return [x for x in policy.layers if x != "uid" or uid is not None], {}, ""

    monkeypatch.setattr(layer_probe, "_probe_once", fake_once)
    monkeypatch.setattr(layer_probe, "is_root", lambda: True)
    report, dropped = layer_probe._probe_all(sandbox_policy.SandboxPolicy(), "cuda")
    print(report.line(), dropped)
    assert set(dropped) == {"netns"} and "uid" in report.layers and "nounix" in report.layers
    assert "breaks CUDA" in report.notes["netns"] and "uid" not in report.notes


def test_probes_side_by_side_each_run_as_a_uid_of_their_own(monkeypatch):
    """RLIMIT_NPROC counts a uid's threads: thirteen CUDA starts as one uid went past a limit of
    128 on an H100, and every CUDA-fragile layer looked broken there. The CUDA start is replaced
    by a count of the attempts running at once per uid (no GPU here)."""
    import threading

    lock, running, most = threading.Lock(), {}, {}

    def fake_once(policy, device, uid):
        with lock:
            running[uid] = running.get(uid, 0) + 1
            most[uid] = max(most.get(uid, 0), running[uid])
        time.sleep(0.05)
        with lock:
            running[uid] -= 1
        return list(policy.layers), {}, ""

    monkeypatch.setattr(layer_probe, "_probe_once", fake_once)
    monkeypatch.setattr(layer_probe, "is_root", lambda: True)
    policy = sandbox_policy.SandboxPolicy()
    report, dropped = layer_probe._probe_all(policy, "cuda")
    assert not dropped and "uid" in report.layers
    assert len(most) == 2 + len(layer_probe.CUDA_FRAGILE_LAYERS) and set(most.values()) == {1}
    assert all(policy.uid_base + 1000 <= u <= policy.uid_base + layer_probe.PROBE_SLOT for u in most)


def test_json_is_bounded_before_it_is_decoded():
    assert sandbox.loads_bounded(b'{"a": [[1], "]]]]]]"]}', max_depth=3) == {"a": [[1], "]]]]]]"]}
    for raw in (b"[" * 200000, b"[" * 40 + b"]" * 40, b" " * (sandbox.MAX_MESSAGE_BYTES + 1)):
        with pytest.raises(sandbox.RefusedJSON):
            sandbox.loads_bounded(raw)
    with pytest.raises(ValueError):
        sandbox.loads_bounded(b"[1, 2")


def test_an_output_header_nested_past_the_decoder_is_refused_as_an_output(tmp_path):
    header = b'{"tree": ' + b"[" * 100000 + b"]" * 100000 + b', "tensors": []}'
    path = tmp_path / "out-000001.kco"
    path.write_bytes(shipping.MAGIC + len(header).to_bytes(8, "little") + header)
    with pytest.raises(shipping.ShippingError, match="refused"):
        shipping.read_output(path)


def test_the_read_through_cache_reads_the_shared_folder_and_writes_its_own(tmp_path, monkeypatch):
    from pipelines.profiling import triton_cache

    shared, own = tmp_path / "shared", tmp_path / "own"
    (shared / "KEY").mkdir(parents=True)
    (shared / "KEY" / "k.cubin").write_bytes(b"cubin")
    (shared / "KEY" / "__grp__k.json").write_text(json.dumps({"child_paths": {
        "k.cubin": str(shared / "KEY" / "k.cubin"), "evil": "/etc/passwd"}}))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(own))
    monkeypatch.setenv(triton_cache.SHARED_ENV, str(shared))
    c = triton_cache.ReadThroughCache("KEY")
    assert c.get_file("k.cubin") == str(shared / "KEY" / "k.cubin")
    assert c.get_group("k.json") == {"k.cubin": str(shared / "KEY" / "k.cubin")}  # nothing outside its folder
    written = c.put(b"new", "n.so")
    assert Path(written).parent == own / "KEY" and not (shared / "KEY" / "n.so").exists()
    assert c.get_file("n.so") == written
