"""What this host provides: which sandbox layers a child can run under here, found by starting
probe children through the jail (on a GPU host all at once: every wanted layer, none of the
CUDA-fragile ones, and each fragile one alone), remembered per host for a day.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from pipelines.profiling import jail
from pipelines.profiling.sandbox_policy import (
    JAIL,
    REPO_ROOT,
    SKIP_ENV,
    WANTED_LAYERS,
    SandboxPolicy,
    child_env,
    is_root,
    jail_spec,
    one_line,
)


@dataclass
class LayerReport:
    """The layers a child gets on this host and, for each wanted one it does not, why."""

    layers: tuple[str, ...]
    notes: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        """One line for logs and `kernelcast check`."""
        text = "sandbox: " + ",".join(self.layers)
        if self.notes:
            text += "; not on this host: " + "; ".join(f"{k} ({v})" for k, v in sorted(self.notes.items()))
        return text


_PROBES: dict[tuple, LayerReport] = {}


def read_notes(text: str) -> dict[str, str]:
    for line in text.splitlines():
        if line.startswith(jail.NOTES_PREFIX):
            try:
                return dict(json.loads(line[len(jail.NOTES_PREFIX):]))
            except ValueError:
                return {}
    return {}


# What the probe runs inside the jail: everything a child needs must be readable and usable there.
_PROBE_CODE = """
import importlib.util, os, sys
open(sys.argv[1]).close()
for name in ("torch", "triton", "numpy"):
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.origin:
        open(spec.origin).close()
if sys.argv[2] == "cuda":
    for dev in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm"):
        if os.path.exists(dev):
            os.close(os.open(dev, os.O_RDWR))
    import torch  # the driver itself must start: opening the device files is not enough
    if torch.cuda.device_count() < 1:
        raise SystemExit("CUDA initialisation failed inside the sandbox: no CUDA device visible")
    torch.zeros(1, device="cuda").sum().item()
sys.stdout.write(os.environ.get("KERNELCAST_SANDBOX_LAYERS", ""))
"""


# Dropped in this order when CUDA will not start; `mountns` last: where Landlock has to go, it is
# what still keeps a kernel from writing outside its private directory.
CUDA_FRAGILE_LAYERS = ("nounix", "proc", "sockets", "shm", "masks", "landlock", "netlock", "netns", "pidns", "seccomp",
                       "mountns")


def _probe_once(policy: SandboxPolicy, device: str, uid: int | None) -> tuple[list[str] | None, dict[str, str], str]:
    """(layers, notes, error) of one trivial child started through the jail."""
    with tempfile.TemporaryDirectory(prefix="kc-probe-") as d:
        if uid is not None:
            os.chown(d, uid, policy.gid)
        spec = jail_spec(policy, device, Path(d), uid=uid, shared_dirs=())
        child = REPO_ROOT / "pipelines" / "profiling" / "child.py"
        argv = [sys.executable, "-I", "-S", str(JAIL), json.dumps(spec), "--", sys.executable, "-I", "-c", _PROBE_CODE,
                str(child), device]
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=d,
                                 env=child_env(device, private_dir=Path(d)))
        except (OSError, subprocess.SubprocessError) as e:
            return None, {}, one_line(e)
    notes = read_notes(res.stderr)
    if res.returncode != 0:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip() and not ln.startswith(jail.NOTES_PREFIX)]
        return None, notes, one_line(lines[-1] if lines else f"exit code {res.returncode}")
    return [x for x in res.stdout.strip().split(",") if x], notes, ""


PROBE_SLOT = 1023  # uid_base + this, and the slots below it down to the pool's last (sandbox_policy.UidPool: 0-999)
MEMO_ENV = "KERNELCAST_SANDBOX_MEMO"  # the memo file; "off" probes every layer every time
MEMO_TTL_S = 24 * 3600.0


def _memo_path() -> Path | None:
    where = os.environ.get(MEMO_ENV)
    if where == "off":
        return None
    if where:
        return Path(where)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kernelcast" / "sandbox-layers.json"


def _host_key(policy: SandboxPolicy, device: str) -> str:
    """What the memo is valid for: this kernel, driver, interpreter, user and policy."""
    try:
        driver = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
    except (OSError, IndexError):
        driver = ""
    return json.dumps([os.uname().release, driver, sys.executable, os.geteuid(), device, list(policy.layers)])


def _read_memo(policy: SandboxPolicy, device: str) -> dict[str, str] | None:
    """The layers a recent probe of this host had to drop for CUDA to start, with their notes."""
    path = _memo_path()
    try:
        entry = json.loads(path.read_text()) if path else None
    except (OSError, ValueError):
        return None
    if (not isinstance(entry, dict) or entry.get("key") != _host_key(policy, device)
            or not time.time() - float(entry.get("at", 0)) < MEMO_TTL_S):
        return None
    dropped = entry.get("dropped")
    ok = isinstance(dropped, dict) and all(k in policy.layers and isinstance(v, str) for k, v in dropped.items())
    return dropped if ok else None


def _write_memo(policy: SandboxPolicy, device: str, dropped: dict[str, str]) -> None:
    path = _memo_path()
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")
        tmp.write_text(json.dumps({"key": _host_key(policy, device), "at": time.time(), "dropped": dropped}))
        tmp.replace(path)
    except OSError:
        pass  # a memo is an optimisation: without it the next worker probes every layer again


def probe(policy: SandboxPolicy, device: str) -> LayerReport:
    """Start a trivial program through the jail with `policy` (as a sandbox uid when root);
    report the layers it got. A uid that cannot read the interpreter, the libraries or the
    repository (or open the GPU) is dropped with a note. Cached per (policy, device).

    On a GPU host each attempt starts CUDA (seconds), and a host where the namespaces break the
    driver needs five; the layers dropped there are remembered for a day (MEMO_ENV) and the
    next worker confirms them with one attempt, probing everything again if that one fails.
    A memo only ever names layers to leave out, keyed by kernel, driver, interpreter and user.
    """
    key = (policy, device)
    if key in _PROBES:
        return _PROBES[key]
    memo = _read_memo(policy, device) if device == "cuda" else None
    report = _probe_remembered(policy, device, memo) if memo is not None else None
    if report is None:
        report, dropped = _probe_all(policy, device)
        if device == "cuda":
            _write_memo(policy, device, dropped)
    _PROBES[key] = report
    return report


def _sandbox_uid(policy: SandboxPolicy, notes: dict[str, str]) -> int | None:
    if "uid" not in policy.layers:
        return None
    if is_root():
        return policy.uid_base + PROBE_SLOT  # slots the children never take (this one and the ones below it)
    notes["uid"] = "not started as root: children keep this user's uid"
    return None


def _finish(got: list[str] | None, found: dict[str, str], error: str, notes: dict[str, str]) -> LayerReport:
    if got is None:
        got, found = ["env", "tmpdir"], {"jail": error}
    notes.update(found)
    if "pidns" not in got:
        got.append("pgkill")  # the tree is ended by process group, uid and orphan sweeps
    return LayerReport(tuple(dict.fromkeys(got)), {k: v for k, v in notes.items() if k not in got})


def _probe_remembered(policy: SandboxPolicy, device: str, dropped: dict[str, str]) -> LayerReport | None:
    """One attempt with the remembered layers left out; None when it fails (a stale memo)."""
    notes = {name: f"turned off ({SKIP_ENV})" for name in WANTED_LAYERS if name not in policy.layers}
    notes.update(dropped)
    reduced = policy.without(*dropped)
    got, found, error = _probe_once(reduced, device, _sandbox_uid(reduced, notes))
    return None if got is None else _finish(got, found, error, notes)


def _probe_all(policy: SandboxPolicy, device: str) -> tuple[LayerReport, dict[str, str]]:
    """Every attempt the host needs: (report, the layers dropped to make CUDA start).

    Each attempt starts CUDA (4-5 s on an H200 host), and one after another the sixteen an H200
    VM needed took 66 s of a worker's start-up. On a GPU host they run side by side instead:
    every wanted layer, none of the CUDA-fragile ones, and each fragile one alone on top of
    none; the fragile layers that start alone are then confirmed together in one more attempt.
    Where that does not settle it (the sandbox uid cannot start the child, or layers that start
    alone fail together), the attempts go one after another as before (`_probe_in_turn`)."""
    notes = {name: f"turned off ({SKIP_ENV})" for name in WANTED_LAYERS if name not in policy.layers}
    uid = _sandbox_uid(policy, notes)
    fragile = [x for x in CUDA_FRAGILE_LAYERS if x in policy.layers] if device == "cuda" else []
    if not fragile:
        return _probe_in_turn(policy, device, notes, uid)
    base = policy.without(*fragile)
    trials = {"": policy, "-": base} | {layer: _with(base, layer) for layer in fragile}
    # Each attempt as a uid of its own: RLIMIT_NPROC counts a uid's threads, and thirteen CUDA
    # starts as one uid went past a limit of 128 (`fault_injection`'s), so every fragile layer
    # looked broken on an H100 where a worker with the default limit had them all.
    uids = [uid if uid is None else uid - i for i in range(len(trials))]
    with ThreadPoolExecutor(max_workers=len(trials)) as pool:
        done = dict(zip(trials, pool.map(lambda p, u: _probe_once(p, device, u), trials.values(), uids)))
    got, found, error = done[""]
    if got is not None:
        return _finish(got, found, error, notes), {}
    if done["-"][0] is None:  # not even the layers CUDA never minds: the uid, or something else
        return _probe_in_turn(policy, device, notes, uid)
    dropped = {layer: f"breaks CUDA initialisation on this host ({done[layer][2] or error})"
               for layer in fragile if done[layer][0] is None}
    kept = policy.without(*dropped)
    got, found, error = _probe_once(kept, device, uid)
    if got is None:
        return _probe_in_turn(policy, device, notes, uid)
    notes.update(dropped)
    return _finish(got, found, error, notes), dropped


def _with(policy: SandboxPolicy, layer: str) -> SandboxPolicy:
    """`policy` with `layer` added back, in the wanted order."""
    return replace(policy, layers=tuple(x for x in WANTED_LAYERS if x in policy.layers or x == layer))


def _probe_in_turn(policy: SandboxPolicy, device: str, notes: dict[str, str],
                   uid: int | None) -> tuple[LayerReport, dict[str, str]]:
    """The attempts one after another: the sandbox uid dropped if it cannot start the child,
    then the CUDA-fragile layers one by one, then each dropped one tried again."""
    dropped: dict[str, str] = {}
    got, found, error = _probe_once(policy, device, uid)
    if got is None and uid is not None:
        notes["uid"] = dropped["uid"] = f"a sandbox uid cannot start the child here ({error})"
        uid = None
        policy = policy.without("uid")
        got, found, error = _probe_once(policy, device, None)
    # On a GPU host a layer may keep the CUDA driver from starting (seen on an H200 VM: Landlock
    # hid the device, the network and PID namespaces made cuInit fail with error 304). Such
    # layers are dropped one by one, each with its reason in the measurement rows.
    for layer in CUDA_FRAGILE_LAYERS if device == "cuda" else ():
        if got is not None or layer not in policy.layers:
            continue
        notes[layer] = dropped[layer] = f"breaks CUDA initialisation on this host ({error})"
        policy = policy.without(layer)
        got, found, error = _probe_once(policy, device, uid)
    if got is None:
        dropped = {}  # nothing started at all: nothing worth remembering
    # A layer dropped while a later one still kept CUDA from starting may not have been at fault
    # (an H200 host lost its sandbox uid this way): each gets one more try with what works.
    for layer in list(dropped)[:-1]:
        trial = replace(policy, layers=tuple(x for x in WANTED_LAYERS if x in policy.layers or x == layer))
        trial_uid = uid if layer != "uid" else _sandbox_uid(trial, {})
        t_got, t_found, _ = _probe_once(trial, device, trial_uid)
        if t_got is not None:
            policy, uid, got, found = trial, trial_uid, t_got, t_found
            del dropped[layer]
            notes.pop(layer, None)
    return _finish(got, found, error, notes), dropped

