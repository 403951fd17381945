"""The hostile-kernel battery on the CPU path: every kernel is recorded with a failure kind and none
reaches outside its sandbox (files, network, secrets, memory, processes, the warehouse, the
verdict, the timer). Real child processes, real sandboxes (jail.py), the Triton interpreter.

Which layers a host gives depends on its privileges (root or not, user namespaces, Landlock):
each test prints the layer line, and asserts containment from the layers the probe reports, so
the same tests hold on a root CI machine and on an unprivileged one.
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

from benchmarks import fault_injection
from pipelines.profiling import jail, jail_landlock, layer_probe, sandbox_policy, taskload
from pipelines.profiling.check import check_sources
from pipelines.profiling.worker import run_batch
from pipelines.profiling.worker_config import WorkerConfig
from warehouse.formats import BATCH_SCHEMA

FIXTURES = Path(__file__).parent.parent / "fixtures_kernels"
REPO = Path(__file__).resolve().parents[2]
hostile = taskload.module_from_file(FIXTURES / "hostile.py", "hostile_kernels")

POLICY = sandbox_policy.SandboxPolicy(memory_bytes=3 * sandbox_policy.GIB, processes=64, shm_bytes=256 * 2**20,
                               private_files=500)  # small: a bomb stays cheap here
SECRET = "kc-test-secret-7f3a9c"
MARKER = "kc-escapee-marker-5d21"


@pytest.fixture
def battery_env(tmp_path, monkeypatch):
    """Targets a hostile kernel aims at, and the environment a secret lives in."""
    monkeypatch.setenv(taskload.ENV_VAR, f"tiny_scale={FIXTURES / 'tiny_task.py'}")
    monkeypatch.setenv("KERNELCAST_TEST_SECRET", SECRET)
    home = tmp_path / "kc-home"
    home.mkdir()
    monkeypatch.setenv("KERNELCAST_HOME", str(home))
    warehouse = home / "warehouse.duckdb"
    warehouse.write_bytes(b"DUCK" + os.urandom(4092))
    outside = tmp_path / "world-writable"
    outside.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(outside, 0o777)  # the worst case: a folder anyone may write
    token = os.urandom(4).hex()
    targets = [str(outside / "f"), str(REPO / f"ESCAPED-{token}"), f"/tmp/kc-escaped-{token}"]
    listener = hostile.Listener()
    params = {"targets": targets, "port": listener.port, "secret": SECRET, "marker": MARKER,
              "warehouse": str(warehouse), "chunks": 24, "forks": 600, "files": 2000, "shm_mb": 512}
    yield {"params": params, "listener": listener, "warehouse": warehouse, "before": warehouse.read_bytes()}
    listener.close()
    for t in targets:
        Path(t).unlink(missing_ok=True)


# Kernels whose containment rests on a layer the host may not give; every other one is contained
# on any host (the environment allow-list, the verifier, the integrity watch, the parent's
# process watchdog and sweeps need no privilege).
NEEDS = {"write_outside": {"landlock", "mountns"}, "warehouse_tampering": {"landlock", "uid", "mountns"}, "memory_bomb": {"rlimits"},
         "network": {"netns", "landlock-net", "seccomp"}, "caller_secrets": {"uid", "masks"}, "proc_snoop": {"proc", "pidns"},
         "shm_hoard": {"shm", "landlock"}, "triton_cache_write": {"landlock", "mountns"}}


def _report(outcomes: dict[str, tuple[str | None, str]]) -> None:
    print(layer_probe.probe(POLICY, "cpu").line())
    for name, (kind, msg) in outcomes.items():
        print(f"  {name:28s} {kind!s:14s} {msg[:100]}")


def test_probe_names_every_layer_it_lacks():
    report = layer_probe.probe(POLICY, "cpu")
    print(report.line())
    assert {"env", "tmpdir"} <= set(report.layers)
    for layer in sandbox_policy.WANTED_LAYERS:
        assert layer in report.layers or layer in report.notes, f"{layer}: neither active nor explained"
    assert report.line().count("\n") == 0


@pytest.mark.slow
def test_hostile_kernels_on_the_check_path(battery_env):
    params, listener = battery_env["params"], battery_env["listener"]
    names = [n for n in hostile.SOURCES if n not in hostile.TIMING_KINDS]
    t0 = time.monotonic()
    outcomes = check_sources([("tiny_scale", hostile.render(n, **params)) for n in names], n_workers=2,
                             timeout_s=30, policy=POLICY)
    got = {n: (None if o.ok else o.failure_kind, o.message) for n, o in zip(names, outcomes)}
    _report(got)
    assert time.monotonic() - t0 < 150
    layers = set(outcomes[0].sandbox.split(","))
    uncontainable = [n for n, need in NEEDS.items() if not need & layers]
    if uncontainable:
        print("not contained on this host (its row says which layers it had):", ", ".join(uncontainable))
    for name, (kind, msg) in got.items():
        assert "\n" not in msg
        if name not in uncontainable:
            assert kind in hostile.KINDS[name], f"{name}: {kind} ({msg})"
    # ... and nothing reached outside
    if "write_outside" not in uncontainable:
        assert not any(Path(t).exists() for t in params["targets"])
    if "warehouse_tampering" not in uncontainable:
        assert battery_env["warehouse"].read_bytes() == battery_env["before"]
    time.sleep(0.5)  # let the listener threads read anything in flight
    if "netns" in layers:
        assert listener.got == []
    elif "landlock-net" in layers or "seccomp" in layers:
        assert not [g for g in listener.got if g.startswith("tcp")]
    assert not hostile.escapees(MARKER)
    assert "KERNELCAST_HOME absent" in got["env_secrets"][1] and SECRET not in got["env_secrets"][1]


@pytest.mark.slow
def test_the_listener_hears_the_host_but_not_the_sandbox(battery_env):
    """The network check above means something: the same listener does hear a host process."""
    listener = battery_env["listener"]
    outcome = check_sources([("tiny_scale", hostile.render("network", port=battery_env["params"]["port"]))],
                            n_workers=1, timeout_s=30, policy=POLICY)[0]
    with socket.create_connection(("127.0.0.1", battery_env["params"]["port"]), timeout=2) as s:
        s.sendall(b"from-the-test")
    time.sleep(0.5)
    print(outcome, listener.got)
    assert "tcp from-the-test" in listener.got
    if "netns" in outcome.sandbox.split(","):
        assert outcome.failure_kind == "runtime_error" and listener.got == ["tcp from-the-test"]


@pytest.mark.slow
def test_hostile_kernels_on_the_worker_path(battery_env, tmp_path):
    """The timing cheats under gpumode's protocol; under kernelcast's, the fault battery below
    runs every hostile kernel through the worker and judges each row the same way."""
    names = list(hostile.TIMING_KINDS) + ["shape_keyed_caching", "reference_output_returned", "patched_check"]
    rows = [{"kernel_id": n, "task": "tiny_scale", "source": hostile.render(n)} for n in names]
    twin_copy = f"{hostile.NO_GAIN_TWIN}-2"  # the no-gain kernels are held to the faster of two honest runs
    rows.append({"kernel_id": twin_copy, "task": "tiny_scale", "source": hostile.render(hostile.NO_GAIN_TWIN) + "\n# 2\n"})
    rows.append({"kernel_id": "good", "task": "tiny_scale", "source": (FIXTURES / "good_torch.py").read_text()})
    batch = tmp_path / "batch.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=BATCH_SCHEMA), batch)
    for protocol in ("gpumode",):
        out = tmp_path / f"out-{protocol}.parquet"
        run_batch(batch, out, WorkerConfig(device="cpu", compile_workers=2, timeout_s=20, max_reps=3, protocol=protocol))
        got = {r["kernel_id"]: r for r in pq.read_table(out).to_pylist()}
        _report({k: (r["failure_kind"], f"{r['speedup'] or '-'} {r['error'] or ''}") for k, r in got.items()})
        assert got["good"]["status"] == "ok" and got["good"]["speedup"] > 0
        twins = [got[hostile.NO_GAIN_TWIN], got[twin_copy]]
        assert all(t["status"] == "ok" for t in twins), [t["error"] for t in twins]
        for name in names:
            r = got[name]
            accepted = (None,) if name in hostile.CPU_ONLY_OK else hostile.KINDS[name]
            assert (r["failure_kind"] if r["status"] != "ok" else None) in accepted, f"{protocol} {name}: {r['error']}"
            assert r["status"] == "ok" or r["speedup"] is None
            if r["status"] == "ok" and name in hostile.NO_GAIN:  # an answer kept or a clock forged gains 10x or more
                assert fault_injection.no_gain_problem(r, twins) is None, f"{name}: {fault_injection.no_gain_problem(r, twins)}"
            assert r["sandbox"] and {"env", "tmpdir"} <= set(r["sandbox"].split(","))
            assert r["protocol"] == protocol


@pytest.mark.slow
def test_without_namespaces_escapees_still_end_and_the_row_says_so(battery_env, monkeypatch):
    monkeypatch.setenv(sandbox_policy.SKIP_ENV, "pidns,netns")
    policy = sandbox_policy.policy_from_env(POLICY)
    report = layer_probe.probe(policy, "cpu")
    assert "pidns" in report.notes and "netns" in report.notes and "turned off" in report.line()
    names = ["setsid_escape", "fork_bomb"]
    outcomes = check_sources([("tiny_scale", hostile.render(n, marker=MARKER, forks=600)) for n in names],
                             n_workers=1, timeout_s=30, policy=POLICY)
    for name, o in zip(names, outcomes):
        print(name, o)
        assert o.failure_kind in hostile.KINDS[name]
        assert "pidns" not in o.sandbox.split(",") and "pgkill" in o.sandbox.split(",")
    time.sleep(0.3)
    assert not hostile.escapees(MARKER)


@pytest.mark.slow
def test_where_namespaces_and_landlock_are_off_seccomp_still_keeps_the_network_out(battery_env, monkeypatch):
    """The H200 host's situation: the namespaces and Landlock keep CUDA from starting there."""
    monkeypatch.setenv(sandbox_policy.SKIP_ENV, "netns,pidns,landlock")
    listener = battery_env["listener"]
    outcome = check_sources([("tiny_scale", hostile.render("network", port=battery_env["params"]["port"]))],
                            n_workers=1, timeout_s=30, policy=POLICY)[0]
    time.sleep(0.5)
    layers = set(outcome.sandbox.split(","))
    assert "seccomp" in layers and not {"netns", "landlock"} & layers
    assert outcome.failure_kind == "runtime_error" and not [g for g in listener.got if g.startswith("tcp")]



GPU_HOST_SKIP = "netns,pidns,landlock,uid"  # what keeps CUDA from starting on the H200 host


@pytest.mark.slow
def test_where_namespaces_landlock_and_the_uid_are_off_the_mount_namespace_keeps_files_safe(battery_env, monkeypatch):
    """The H200 host's situation for files: a read-only mount namespace is what stops writes
    outside the private folder, the warehouse under KERNELCAST_HOME included; a normal kernel
    (which ships its output through the private folder) still passes."""
    monkeypatch.setenv(sandbox_policy.SKIP_ENV, GPU_HOST_SKIP)
    params = battery_env["params"]
    names = ["write_outside", "warehouse_tampering"]
    sources = [("tiny_scale", hostile.render(n, **params)) for n in names]
    sources.append(("tiny_scale", (FIXTURES / "good_torch.py").read_text()))
    outcomes = check_sources(sources, n_workers=1, timeout_s=30, policy=POLICY)
    layers = set(outcomes[0].sandbox.split(","))
    print(outcomes[0].sandbox, [(o.failure_kind, o.message[:80]) for o in outcomes])
    if os.geteuid() != 0 and "mountns" not in layers:
        pytest.skip("no mount namespace for an unprivileged user on this host")
    assert "mountns" in layers and not set(GPU_HOST_SKIP.split(",")) & layers
    for name, o in zip(names, outcomes):
        assert not o.ok and o.failure_kind in hostile.KINDS[name], f"{name}: {o.failure_kind} ({o.message})"
    assert outcomes[-1].ok, outcomes[-1].message
    assert not any(Path(t).exists() for t in params["targets"])
    assert battery_env["warehouse"].read_bytes() == battery_env["before"]


@pytest.mark.slow
def test_the_measurement_row_names_mountns_and_a_normal_kernel_is_measured_under_it(battery_env, tmp_path,
                                                                                      monkeypatch):
    monkeypatch.setenv(sandbox_policy.SKIP_ENV, GPU_HOST_SKIP)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))  # shared, bound writable
    params = battery_env["params"]
    rows = [{"kernel_id": "good", "task": "tiny_scale", "source": (FIXTURES / "good_torch.py").read_text()},
            {"kernel_id": "write_outside", "task": "tiny_scale", "source": hostile.render("write_outside", **params)}]
    batch, out = tmp_path / "batch.parquet", tmp_path / "out.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=BATCH_SCHEMA), batch)
    run_batch(batch, out, WorkerConfig(device="cpu", compile_workers=1, timeout_s=20, max_reps=3))
    got = {r["kernel_id"]: r for r in pq.read_table(out).to_pylist()}
    print({k: (r["status"], r["sandbox"], r["error"]) for k, r in got.items()})
    if os.geteuid() != 0 and "mountns" not in got["good"]["sandbox"].split(","):
        pytest.skip("no mount namespace for an unprivileged user on this host")
    assert got["good"]["status"] == "ok" and got["good"]["speedup"] > 0
    assert "mountns" in got["good"]["sandbox"].split(",") and "landlock" not in got["good"]["sandbox"].split(",")
    assert got["write_outside"]["failure_kind"] in hostile.KINDS["write_outside"]
    assert not any(Path(t).exists() for t in params["targets"])


# ---- the jail on its own ----------------------------------------------------------------------
def _jail(spec: dict, argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-S", jail.__file__, json.dumps(spec), "--", *argv],
                          capture_output=True, text=True, timeout=60, **kw)


@pytest.fixture
def open_dir():
    """A folder every uid can reach (pytest's tmp_path sits under a 0700 folder)."""
    d = Path(tempfile.mkdtemp(prefix="kc-jail-test-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
def test_jail_runs_a_program_as_the_sandbox_uid_and_it_cannot_write_root_files(open_dir):
    private = open_dir / "private"
    private.mkdir()
    uid = 61990
    os.chown(private, uid, 61000)
    owned = open_dir / "root-owned"
    owned.write_text("root")
    spec = {"private_dir": str(private), "uid": uid, "gid": 61000, "want": ["uid"], "limits": {}}
    res = _jail(spec, ["/bin/sh", "-c", f'id -u; echo "$KERNELCAST_SANDBOX_LAYERS"; echo x > {owned} || echo denied'])
    lines = res.stdout.split()
    assert lines[0] == str(uid) and "uid" in lines[1].split(",") and "denied" in res.stdout, res.stderr
    assert owned.read_text() == "root"


def test_jail_as_an_unprivileged_user_enters_its_own_namespaces(open_dir):
    """The path a non-root CI host takes: a user namespace carries the network and PID namespaces
    and makes a process limit count this sandbox alone."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() == 0 and setpriv is None:
        pytest.skip("root without setpriv: cannot drop to an unprivileged user for this test")
    private = open_dir / "private"
    private.mkdir()
    spec = {"private_dir": str(private), "uid": None, "gid": None, "want": ["netns", "pidns", "rlimits", "landlock"],
            "limits": {"nproc": 64, "fsize": 2**20, "core": 0}, "writable_dirs": [str(private)], "writable_files": []}
    argv = ["/bin/sh", "-c", 'echo "$KERNELCAST_SANDBOX_LAYERS"; echo "pid $$"']
    cmd = [sys.executable, "-I", "-S", jail.__file__, json.dumps(spec), "--", *argv]
    if os.geteuid() == 0:
        os.chown(private, 65534, 65534)
        cmd = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if res.returncode != 0 and "Permission denied" in res.stderr:
        pytest.skip(f"this host's interpreter is not usable by an unprivileged user: {res.stderr.strip()[:120]}")
    layers = res.stdout.split()[0].split(",")
    notes = layer_probe.read_notes(res.stderr)
    print(layers, notes)
    for layer in ("netns", "pidns"):
        assert layer in layers or layer in notes  # entered, or the one-line reason it was not
    if "pidns" in layers:
        assert "pid 1" in res.stdout  # the program is the first process of its own namespace
        assert "rlimits" in layers and "rlimits-nproc" not in notes  # counted per user namespace


@pytest.mark.slow
def test_the_fault_battery_passes_on_the_cpu(tmp_path, capsys):
    """benchmarks.fault_injection, the GPU battery, on the interpreter: broken and hostile
    kernels get their kinds, nothing reaches outside (it checks), the worker survives."""
    code = fault_injection.main(["--device", "cpu", "--out-dir", str(tmp_path / "fi")])
    assert code == 0, capsys.readouterr().out[-3000:]
    report = json.loads((tmp_path / "fi" / "fault.json").read_text())
    assert report["problems"] == [] and len(report["rows"]) >= len(hostile.SOURCES)  # judged by the host's layers
    assert all({"env", "tmpdir"} <= set(r["sandbox"].split(",")) for r in report["rows"])
    print(report["sandbox"], report["outside"])
    assert report["outside"]["escaped_processes"] == []  # whatever the layers
    given = report["sandbox"].split(";")[0].removeprefix("sandbox: ").split(",")
    if {"landlock", "mountns"} & set(given):
        assert report["outside"]["files_written_outside"] == [] and not report["outside"]["warehouse_changed"]


def test_two_workers_on_one_host_never_share_a_sandbox_uid():
    """Each uid is claimed with a file lock, so one worker's sweep cannot end another's children."""
    pool = sandbox_policy.UidPool()
    mine = [pool.take(61700), pool.take(61700)]
    other = subprocess.run([sys.executable, "-c", "from pipelines.profiling.sandbox_policy import UidPool; "
                            "print(UidPool().take(61700))"], capture_output=True, text=True, cwd=REPO,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    # the pool is host-wide: uids another worker on this host holds are skipped, so compare
    # with each other rather than with fixed numbers
    theirs = int(other.stdout)
    assert len({*mine, theirs}) == 3 and all(u >= 61700 for u in (*mine, theirs)) and mine[0] < mine[1]
    pool.give_back(mine[0])
    assert sandbox_policy.UidPool().take(61700) == mine[0]  # given back: the lowest free one again


def test_the_seccomp_layer_alone_refuses_network_sockets_and_keeps_unix_ones(open_dir):
    code = ("import os, socket\n"
            "a, b = socket.socketpair(); a.close(); b.close()\n"
            "for fam in (socket.AF_INET, socket.AF_INET6):\n"
            "    try:\n"
            "        socket.socket(fam, socket.SOCK_STREAM)\n"
            "    except PermissionError:\n"
            "        print('refused', int(fam))\n"
            "print(os.environ['KERNELCAST_SANDBOX_LAYERS'])\n")
    res = _jail({"private_dir": str(open_dir), "want": ["seccomp"], "limits": {}}, [sys.executable, "-I", "-c", code])
    assert res.returncode == 0, res.stderr
    if '"seccomp"' in res.stderr:
        pytest.skip(f"this host refuses seccomp filters: {res.stderr.strip()}")
    lines = res.stdout.split()
    assert res.stdout.count("refused") == 2 and "seccomp" in lines[-1].split(",")


def test_netlock_alone_refuses_tcp_and_abstract_unix_sockets_and_leaves_files_alone(open_dir):
    """The `netlock` layer (Landlock's network rules and scopes, no file rules), on its own: no
    TCP connect to a listener of this process, no abstract Unix socket of it (ABI 6), and writes
    where the child may write still work. For hosts where the network namespace, seccomp and
    Landlock's file rules keep CUDA from starting."""
    abi = jail_landlock.landlock_abi()
    if abi < 4:
        pytest.skip(f"Landlock network rules need ABI 4; this kernel has {abi}")
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(4)
    abstract = socket.socket(socket.AF_UNIX)
    name = f"\0kc-netlock-{os.getpid()}"
    abstract.bind(name)
    abstract.listen(4)
    private = open_dir / "private"
    private.mkdir()
    program = f"""
import os, socket
def attempt(what, make, address):
    s = make()
    try:
        s.connect(address)
        print(what, "connected")
    except OSError as e:
        print(what, type(e).__name__)
attempt("tcp", socket.socket, ("127.0.0.1", {tcp.getsockname()[1]}))
attempt("abstract", lambda: socket.socket(socket.AF_UNIX), {name!r})
open({str(private / "f")!r}, "w").write("x")
print("layers", os.environ["KERNELCAST_SANDBOX_LAYERS"])
"""
    spec = {"private_dir": str(private), "uid": None, "gid": None, "want": ["netlock"], "limits": {}}
    try:
        res = _jail(spec, [sys.executable, "-c", program])
    finally:
        tcp.close()
        abstract.close()
    out = dict(line.split(" ", 1) for line in res.stdout.splitlines())
    assert "netlock" in out["layers"].split(","), (res.stdout, res.stderr)
    assert out["tcp"] == "PermissionError", out
    assert out["abstract"] == ("PermissionError" if abi >= 6 else "connected"), out
    assert (private / "f").read_text() == "x"
