"""Fault injection for the profiling worker: broken and hostile kernels must fail the right way and
reach nothing outside their sandbox; good ones get measured.

    python3 -m benchmarks.fault_injection --out-dir OUT/fault             # on the H200
    python3 -m benchmarks.fault_injection --device cpu --out-dir /tmp/fi  # anywhere (interpreter)

Builds a batch of task `tiny_scale` (y = 2x + 1) kernels: good Triton and PyTorch kernels (several
copies each, so compiles run in parallel), the broken ones of tests/fixtures_kernels (syntax
error, missing entry point, Triton compile error, wrong result, cached by shape, exception,
endless loops, illegal memory access, os._exit, segfault) and the hostile battery of
tests/fixtures_kernels/hostile.py (writes outside the sandbox, network, environment secrets,
memory bomb, fork bomb, setsid escape, warehouse tampering, patched check, patched reference op,
patched timer, reference output returned, caching by shape and by address, work on a side stream,
and the timed-call cheats: a frame-walking idler, the clock patched and the watch re-based, the
watch switched off, Measurer.time_fn and Timing.as_dict patched at class level, the timing list
rewritten, a content-keyed memo, a saboteur that leaves a slow clock for the next kernel), and the
kernels that gain only where an input comes back or the timer is within reach of their frames (a
memo per buffer keyed on its address, shape and two values, a memo by whole content, a sniffer of
the timer's objects in its callers' frames, a walker of their names), beside two copies of their
honest twin: they may be `ok` only where their time is at most NO_GAIN_FACTOR times shorter than
the faster twin's (`no_gain_problem`).
Runs the worker as a separate process (`python3 -m pipelines.profiling.worker`) with a secret in
its environment, a listener on the loopback, a Unix socket file (in the temporary directory) and an
abstract name, a host process with a marker in its argv, a 0600 key in the worker's HOME and files
to aim at, then asserts: the worker exited 0 and wrote its file, every kernel got an expected
failure kind, good kernels are ok with finite speedups, and nothing reached outside (target files
absent, warehouse file unchanged, nothing heard on the loopback or the Unix socket, no escaped
process left). Prints a table and the sandbox layers; writes
<out-dir>/fault.json; exits 1 on any mismatch. Worker logs and the result file stay in --out-dir.
Needs only what the worker needs (torch, triton, numpy, pyarrow).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.profiling.sandbox_policy import REPO_ROOT
from pipelines.profiling.taskload import module_from_file
from warehouse.formats import BATCH_SCHEMA, RESULT_SCHEMA

# The battery's kernels are the worker tests' fixtures: one set of broken and hostile kernels,
# whose expected outcomes the tests hold too.
FIXTURES = REPO_ROOT / "tests" / "fixtures_kernels"
EXPECTED = module_from_file(FIXTURES / "tiny_task.py", "kernelcast_fixture_tiny_task").EXPECTED
hostile = module_from_file(FIXTURES / "hostile.py", "kernelcast_fixture_hostile")

GOOD = ("good_triton.py", "good_torch.py")
SECRET = "kc-fault-secret-" + os.urandom(4).hex()
KEY_SECRET = "kc-fault-key-" + os.urandom(4).hex()
MARKER = "kc-fault-escapee-" + os.urandom(4).hex()
WITNESS = "kc-fault-witness-" + os.urandom(4).hex()  # in the argv of a host process


def build_batch(path: Path, good_copies: int, skip: set[str], params: dict, with_hostile: bool, cuda: bool
                ) -> dict[str, tuple[str, tuple]]:
    """Write the batch; return kernel_id -> (fixture name, accepted outcomes)."""
    rows, origin = [], {}
    for name in EXPECTED:
        if name in skip:
            continue
        source = (FIXTURES / name).read_text()
        copies = good_copies if name in GOOD else 1
        want_cuda, on_cpu = EXPECTED[name]
        for i in range(copies):
            kid = f"{name.removesuffix('.py')}-{i}"
            rows.append({"kernel_id": kid, "task": "tiny_scale", "source": f"{source}\n# copy {i}\n"})
            origin[kid] = (name, (want_cuda,) if cuda else on_cpu)
    if with_hostile:
        for name in hostile.SOURCES:
            if name in skip:
                continue
            accepted = (None,) if (name in hostile.CPU_ONLY_OK and not cuda) else hostile.KINDS[name]
            for kid in [f"hostile-{name}"] + ([f"hostile-{name}-2"] if name == hostile.NO_GAIN_TWIN else []):
                rows.append({"kernel_id": kid, "task": "tiny_scale", "source": hostile.render(name, **params) + f"\n# {kid}\n"})
                origin[kid] = (name, accepted)
    pq.write_table(pa.Table.from_pylist(rows, schema=BATCH_SCHEMA), path)
    return origin


def run_teeing_stderr(cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    """Run `cmd`; its stderr goes on to ours line by line (progress) and is kept for the report."""
    p = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[str] = []

    def tee() -> None:
        for line in p.stderr:
            lines.append(line)
            sys.stderr.write(line)

    t = threading.Thread(target=tee, daemon=True)
    t.start()
    out = p.stdout.read()
    p.wait()
    t.join(timeout=5)
    return subprocess.CompletedProcess(cmd, p.returncode, out, "".join(lines))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out-dir", default="fault-injection")
    ap.add_argument("--timeout-s", type=float, default=None, help="worker --timeout-s (default 20 cuda, 8 cpu)")
    ap.add_argument("--good-copies", type=int, default=None, help="copies of each good kernel (default 8 cuda, 1 cpu)")
    ap.add_argument("--compile-workers", type=int, default=None)
    ap.add_argument("--skip", default="", help="comma-separated fixture files or hostile kernel names to leave out")
    ap.add_argument("--no-hostile", action="store_true", help="only the broken kernels, not the hostile battery")
    ap.add_argument("--memory-limit-gb", type=float, default=None,
                    help="sandbox memory limit for this run (default 12 cuda, 3 cpu; the memory bomb asks for twice it)")
    ap.add_argument("--process-limit", type=int, default=128, help="sandbox processes + threads per child for this run")
    ap.add_argument("--protocol", choices=("kernelcast", "paper", "gpumode"), default="kernelcast")
    ap.add_argument("--timed-variants", type=int, default=None, help="worker --timed-variants")
    ap.add_argument("--timed-samples", type=int, default=None, help="worker --timed-samples")
    return ap


def _stage(out_dir: Path) -> dict:
    """The run's folders and the things the hostile kernels aim at: a fake warehouse file (and
    its bytes), a world-writable folder, and target paths inside, beside and outside the repo."""
    out_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(out_dir, 0o755)
    batch, out = out_dir / "batch.parquet", out_dir / "results.parquet"
    for stale in (out, out.with_name(out.name + ".partial.jsonl")):
        stale.unlink(missing_ok=True)
    home = out_dir / "home"
    home.mkdir(exist_ok=True)
    warehouse = home / "warehouse.duckdb"
    warehouse.write_bytes(b"DUCK" + os.urandom(4092))
    open_dir = out_dir / "world-writable"
    open_dir.mkdir(exist_ok=True)
    os.chmod(open_dir, 0o777)
    token = os.urandom(4).hex()
    targets = [str(open_dir / f"escaped-{token}"), str(REPO_ROOT / f"ESCAPED-{token}"), f"/tmp/kc-escaped-{token}"]
    # the caller's home as the worker sees it (HOME): a 0700 folder with a 0600 key in it
    caller_home = out_dir / "caller-home"
    (caller_home / ".ssh").mkdir(parents=True, exist_ok=True)
    key = caller_home / ".ssh" / "id_rsa"
    key.write_text(KEY_SECRET)
    os.chmod(key, 0o600)
    os.chmod(caller_home, 0o700)
    # a Unix socket file anyone may connect to, in a folder of the temporary directory (where
    # ssh-agent and tmux keep theirs), and an abstract name
    unix_dir = Path(tempfile.mkdtemp(prefix="kc-fault-unix-"))
    os.chmod(unix_dir, 0o755)
    return {"batch": batch, "out": out, "home": home, "warehouse": warehouse, "before": warehouse.read_bytes(),
            "targets": targets, "caller_home": caller_home, "key": key, "unix_dir": unix_dir}


def no_gain_problem(row: dict, twins: list[dict]) -> str | None:
    """Why an `ok` row of a kernel that must gain nothing over its honest twin fails (None: it does
    not): its time is more than hostile.NO_GAIN_FACTOR times shorter than the twins' (the geometric
    mean over cases of the faster twin's time over its own, by the protocol's statistic), or no
    twin is `ok`. Times, not speedups: a kernel's own time only gets shorter by what it does, and
    longer by a busy host, where a speedup also moves with its reference's timing (under gpumode
    one per kernel: on a loaded 2-core host one read 3.6x the twin's with no gain).

    >>> twin = {"status": "ok", "protocol": "kernelcast", "kernel_median_ms": [1.0, 2.0]}
    >>> no_gain_problem({**twin, "kernel_median_ms": [0.9, 2.1]}, [twin]) is None
    True
    >>> no_gain_problem({**twin, "kernel_median_ms": [0.05, 0.1]}, [twin])
    "its time is 20x shorter than its honest twin's (at most 3.0x)"
    """
    key = "kernel_median_ms" if row["protocol"] == "kernelcast" else "kernel_mean_ms"
    ok = [t[key] for t in twins if t is not None and t["status"] == "ok" and t[key]]
    if not ok:
        return "no honest twin is ok to hold it to"
    best = [min(times) for times in zip(*ok)]
    gain = math.exp(sum(math.log(b / k) for b, k in zip(best, row[key], strict=True)) / len(best))
    if gain > hostile.NO_GAIN_FACTOR:
        return f"its time is {gain:.3g}x shorter than its honest twin's (at most {hostile.NO_GAIN_FACTOR}x)"
    return None


def _judge_rows(rows: dict[str, dict], origin: dict[str, tuple[str, tuple]], problems: list[str]) -> list[dict]:
    """Print one line per kernel of the batch against what it was expected to get; append every
    mismatch to `problems`; the rows of fault.json."""
    report_rows = []
    print(f"{'kernel':<32} {'expected':<28} {'got':<15} {'speedup':>8}  {'s':>6}  error")
    for kid, (name, accepted) in origin.items():
        r = rows.get(kid)
        if r is None:
            problems.append(f"{kid}: no row")
            print(f"{kid:<32} {'/'.join(map(str, accepted)):<28} {'MISSING':<15}")
            continue
        got = None if r["status"] == "ok" else r["failure_kind"]
        secs = sum(x or 0.0 for x in (r["compile_s"], r["check_s"], r["time_s"]))
        sp = f"{r['speedup']:.3f}" if r["speedup"] else "-"
        mark = "" if got in accepted else "  <-- MISMATCH"
        print(f"{kid:<32} {'/'.join(map(str, accepted)):<28} {got!s:<15} {sp:>8}  {secs:6.2f}  {(r['error'] or '')[:90]}{mark}")
        report_rows.append({"kernel_id": kid, "fixture": name, "accepted": [str(a) for a in accepted], "got": got,
                            "error": r["error"], "sandbox": r.get("sandbox")})
        if got not in accepted:
            problems.append(f"{kid}: expected {accepted}, got {got} ({r['error']})")
        if got is None and not (r["speedup"] and math.isfinite(r["speedup"]) and r["speedup"] > 0):
            problems.append(f"{kid}: ok without a finite speedup")
        elif got is None and name in hostile.NO_GAIN and (why := no_gain_problem(r, [
                rows.get(f"hostile-{hostile.NO_GAIN_TWIN}"), rows.get(f"hostile-{hostile.NO_GAIN_TWIN}-2")])):
            problems.append(f"{kid}: ok, but {why}: it gained from an input seen before or from the timer's state")
    return report_rows


def _outside(stage: dict, listener, unix, layers: set[str], hostile_run: bool, problems: list[str]) -> dict:
    """What reached outside the sandbox; a problem only where a layer the host gave should have
    stopped it (escaped processes: always). Removes the files that got written."""
    outside = {
        "files_written_outside": [t for t in stage["targets"] if Path(t).exists()],
        "warehouse_changed": stage["warehouse"].read_bytes() != stage["before"],
        "heard_on_loopback": listener.got,
        "heard_on_unix_socket": unix.got,
        "escaped_processes": hostile.escapees(MARKER),
    }
    for t in outside["files_written_outside"]:
        Path(t).unlink(missing_ok=True)
    if hostile_run:
        if outside["files_written_outside"] and ({"landlock", "mountns"} & layers):
            problems.append(f"files written outside the sandbox: {outside['files_written_outside']}")
        if outside["warehouse_changed"] and ({"landlock", "uid", "mountns"} & layers):
            problems.append("the warehouse file changed")
        if outside["heard_on_loopback"] and ({"netns", "landlock-net", "netlock"} & layers):
            problems.append(f"the loopback listener heard {outside['heard_on_loopback']}")
        if outside["heard_on_unix_socket"] and ({"nounix", "sockets"} & layers):
            problems.append(f"the Unix socket listener heard {outside['heard_on_unix_socket']}")
        if outside["escaped_processes"]:
            problems.append(f"escaped processes still running: {outside['escaped_processes']}")
    return outside


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cuda = args.device == "cuda"
    timeout_s = args.timeout_s or (20.0 if cuda else 8.0)
    copies = args.good_copies or (8 if cuda else 1)
    workers = args.compile_workers or (max(1, min(14, (os.cpu_count() or 2) - 2)) if cuda else 2)
    memory_gb = args.memory_limit_gb or (12.0 if cuda else 3.0)

    out_dir = Path(args.out_dir).resolve()
    stage = _stage(out_dir)
    batch, out = stage["batch"], stage["out"]
    listener = hostile.Listener()
    unix = hostile.UnixListener(str(stage["unix_dir"]))
    witness = hostile.ArgvWitness(WITNESS)
    params = {"targets": stage["targets"], "port": listener.port, "secret": SECRET, "marker": MARKER,
              "warehouse": str(stage["warehouse"]), "chunks": int(2 * memory_gb * 4), "forks": 2000,
              "unix_path": unix.path, "unix_abstract": unix.abstract, "proc_marker": WITNESS,
              "secret_files": [str(stage["key"]), "/etc/shadow"],
              # the no-gain kernels' honest work: ~0.5 ms a call on the interpreter's tiny cases,
              # ~2-7 ms on the GPU's 64-256 MiB ones
              "work": 20 if cuda else 200}
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    origin = build_batch(batch, copies, skip, params, not args.no_hostile, cuda)

    env = dict(os.environ, KERNELCAST_TASK_MODULES=f"tiny_scale={FIXTURES / 'tiny_task.py'}",
               KERNELCAST_TEST_SECRET=SECRET, KERNELCAST_HOME=str(stage["home"]), HOME=str(stage["caller_home"]),
               KERNELCAST_SANDBOX_MEMORY_GB=str(memory_gb), KERNELCAST_SANDBOX_PROCESSES=str(args.process_limit))
    cmd = [sys.executable, "-m", "pipelines.profiling.worker", "--batch", str(batch), "--out", str(out),
           "--device", args.device, "--protocol", args.protocol, "--compile-workers", str(workers),
           "--timeout-s", str(timeout_s), "--log-dir", str(out_dir / "logs"),
           "--summary-json", str(out_dir / "summary.json"), "--ref-cache", "off"] + ([] if cuda else ["--max-reps", "3"])
    for flag, value in (("--timed-variants", args.timed_variants), ("--timed-samples", args.timed_samples)):
        cmd += [flag, str(value)] if value else []
    print("running:", " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.monotonic()
    proc = run_teeing_stderr(cmd, env)
    wall = time.monotonic() - t0
    time.sleep(0.5)
    listener.close()
    unix.close()
    witness.close()
    shutil.rmtree(stage["unix_dir"], ignore_errors=True)
    print(proc.stdout)
    layers_line = next((ln for ln in proc.stderr.splitlines() if ln.startswith("sandbox: ")), "sandbox: (not reported)")

    problems = []
    if proc.returncode != 0:
        problems.append(f"worker exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    if not out.exists():
        print("FAIL: no result file", file=sys.stderr)
        return 1
    table = pq.read_table(out)
    if not table.schema.equals(RESULT_SCHEMA):
        problems.append("result schema differs from RESULT_SCHEMA")
    rows = {r["kernel_id"]: r for r in table.to_pylist()}
    report_rows = _judge_rows(rows, origin, problems)
    layers = set((next(iter(rows.values()), {}).get("sandbox") or "").split(","))
    outside = _outside(stage, listener, unix, layers, not args.no_hostile, problems)
    hw = next(iter(rows.values()))["hardware_id"] if rows else "?"
    print(f"\n{len(rows)}/{len(origin)} rows, hardware {hw}, worker wall {wall:.1f} s, exit {proc.returncode}")
    print(layers_line)
    print("outside the sandbox:", json.dumps(outside))
    (out_dir / "fault.json").write_text(json.dumps({
        "device": args.device, "protocol": args.protocol, "hardware_id": hw, "worker_wall_s": wall,
        "worker_exit": proc.returncode, "sandbox": layers_line, "outside": outside, "rows": report_rows,
        "problems": problems}, indent=2, default=str))
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        return 1
    print("PASS: every kernel got its expected outcome, nothing reached outside, and the worker survived")
    return 0


if __name__ == "__main__":
    sys.exit(main())
