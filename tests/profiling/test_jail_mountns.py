"""The `mountns` layer of the jail on its own: a child in a private mount namespace where every
filesystem is read-only but its private directory and the shared Triton cache. Real jailed
processes (jail.py run as a script), real files; the layer is only ever applied in those
children, and each test checks that this process's own mount table is left as it was.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from pipelines.profiling import jail_mounts, layer_probe, sandbox_policy
from tests.profiling.test_sandbox_hostile import _jail

# What the jailed program tries; each line it prints is "<what> ok" or "<what> <error name>".
WRITER = """
import os, sys
def attempt(what, path):
    try:
        with open(path, "w") as f:
            f.write("x")
        print(what, "ok")
    except OSError as e:
        print(what, type(e).__name__)
for arg in sys.argv[1:]:
    what, path = arg.split("=", 1)
    attempt(what, path)
with open("/dev/null", "w") as f:  # a device file on a read-only /dev stays usable
    f.write("x")
print("layers", os.environ["KERNELCAST_SANDBOX_LAYERS"])
"""


def _mount_table() -> str:
    return Path("/proc/self/mountinfo").read_text()


@pytest.fixture
def dirs():
    """A private directory on the host's private root (/dev/shm where it has room), a shared
    cache, and a folder anyone may write: the worst case for a write outside."""
    made = {"private": Path(tempfile.mkdtemp(prefix="kc-mountns-test-", dir=sandbox_policy.private_root())),
            "top": Path(tempfile.mkdtemp(prefix="kc-mountns-test-"))}
    made["cache"] = made["top"] / "triton-cache"
    made["outside"] = made["top"] / "world-writable"
    for d in (made["cache"], made["outside"]):
        d.mkdir()
    for d in made.values():
        os.chmod(d, 0o777)
    yield made
    for key in ("private", "top"):
        shutil.rmtree(made[key], ignore_errors=True)


def _want() -> list[str]:
    # As root the jail keeps the layer only with root's capabilities gone (else it could remount).
    return ["mountns", "nocaps"] if os.geteuid() == 0 else ["mountns"]


def test_a_child_under_mountns_writes_only_its_private_dir_and_the_cache(dirs):
    sibling = sandbox_policy.private_root() / f"{dirs['private'].name}-sibling"
    spec = {"private_dir": str(dirs["private"]), "want": _want(), "limits": {},
            "mount_writable_dirs": [str(dirs["private"]), str(dirs["cache"])]}
    targets = {"private": dirs["private"] / "out.bin", "cache": dirs["cache"] / "entry", "outside": dirs["outside"] / "f",
               "sibling": sibling}
    before = _mount_table()
    res = _jail(spec, [sys.executable, "-I", "-c", WRITER, *(f"{k}={v}" for k, v in targets.items())])
    assert _mount_table() == before  # nothing of it reached this process's mounts
    notes = layer_probe.read_notes(res.stderr)
    got = dict(line.split(" ", 1) for line in res.stdout.splitlines())
    print(got, notes)
    if os.geteuid() != 0 and "mountns" in notes:
        pytest.skip(f"no mount namespace for an unprivileged user here: {notes['mountns']}")
    assert res.returncode == 0, res.stderr
    assert "mountns" in got["layers"].split(","), notes
    assert got["private"] == "ok" and got["cache"] == "ok"
    assert got["outside"] == "OSError" and got["sibling"] == "OSError"  # EROFS
    assert not targets["outside"].exists() and not sibling.exists()
    assert targets["private"].read_text() == "x" and targets["cache"].read_text() == "x"


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid and capability rules are those of a root child")
def test_a_root_child_keeping_its_capabilities_gets_no_mountns_and_the_reason(dirs):
    spec = {"private_dir": str(dirs["private"]), "want": ["mountns"], "limits": {},
            "mount_writable_dirs": [str(dirs["private"])]}
    res = _jail(spec, [sys.executable, "-I", "-c", WRITER, f"outside={dirs['outside'] / 'f'}"])
    notes = layer_probe.read_notes(res.stderr)
    assert res.returncode == 0, res.stderr
    assert "mountns" not in res.stdout.split("layers ", 1)[1].split(",")
    assert "could remount" in notes["mountns"] and "\n" not in notes["mountns"]


def test_the_root_directory_is_never_a_writable_directory(dirs):
    spec = {"private_dir": str(dirs["private"]), "want": _want(), "limits": {}, "mount_writable_dirs": ["/"]}
    res = _jail(spec, [sys.executable, "-I", "-c", WRITER, f"outside={dirs['outside'] / 'f'}"])
    notes = layer_probe.read_notes(res.stderr)
    assert res.returncode == 0, res.stderr
    assert "mountns" in notes and "mountns" not in res.stdout.split("layers ", 1)[1].split(",")
    if os.geteuid() == 0:
        assert "root directory" in notes["mountns"]


@pytest.mark.parametrize(("options", "kept", "absent"), [
    ("rw,relatime", jail_mounts.MS_RELATIME, jail_mounts.MS_NOSUID | jail_mounts.MS_STRICTATIME),
    ("ro,nosuid,nodev,noexec,relatime", jail_mounts.MS_NOSUID | jail_mounts.MS_NODEV | jail_mounts.MS_NOEXEC, jail_mounts.MS_STRICTATIME),
    ("rw,noatime,nodiratime", jail_mounts.MS_NOATIME | jail_mounts.MS_NODIRATIME, jail_mounts.MS_RELATIME | jail_mounts.MS_STRICTATIME),
    ("rw", jail_mounts.MS_STRICTATIME, jail_mounts.MS_RELATIME | jail_mounts.MS_NOATIME),  # no atime option shown: strictatime
])
def test_a_read_only_remount_repeats_the_mounts_other_options(options, kept, absent):
    flags = jail_mounts.read_only_remount_flags(options)
    base = jail_mounts.MS_REMOUNT | jail_mounts.MS_BIND | jail_mounts.MS_RDONLY
    assert flags & base == base and flags & kept == kept and not flags & absent


def test_mountinfo_paths_with_escaped_spaces_and_shared_fields_are_read():
    text = ("27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
            "30 27 0:27 / /mnt/with\\040space rw,nosuid master:3 propagate_from:2 - tmpfs tmpfs rw\n")
    assert jail_mounts.read_mountinfo(text) == [("/", "rw,relatime", "shared:1"),
                                         ("/mnt/with space", "rw,nosuid", "master:3 propagate_from:2")]


def test_the_probe_gives_mountns_and_the_skip_switch_turns_it_off(monkeypatch):
    monkeypatch.setattr(layer_probe, "_PROBES", {})
    report = layer_probe.probe(sandbox_policy.SandboxPolicy(), "cpu")
    print(report.line())
    if os.geteuid() == 0:
        assert "mountns" in report.layers
    else:
        assert "mountns" in report.layers or "mountns" in report.notes  # entered, or why not
    monkeypatch.setenv(sandbox_policy.SKIP_ENV, "mountns")
    off = layer_probe.probe(sandbox_policy.policy_from_env(), "cpu")
    assert "mountns" not in off.layers and "turned off" in off.notes["mountns"]
