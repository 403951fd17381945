"""The jail's namespace layers: `netns` (no network) and `pidns` (nothing outlives the child).

Unshared together where the host allows, each alone where only one works; without root in a user
namespace that maps the caller's own ids. jail.py lists the layers and applies them in order.
Standard library only.
"""

from __future__ import annotations

import ctypes
import os

from pipelines.profiling.jail_libc import _errno_text, _libc

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000


def _unshare(flags: int) -> None:
    libc = _libc()
    if libc.unshare(ctypes.c_int(flags)) != 0:
        raise OSError(_errno_text())


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter_namespaces(want_net: bool, want_pid: bool, root: bool) -> tuple[list[str], dict[str, str]]:
    """Unshare the network and PID namespaces (in a user namespace when not root).

    Returns:
        (layers entered, {layer: why not} for the wanted ones that could not be entered).
    """
    wanted = [(name, flag) for name, flag, want in (("netns", CLONE_NEWNET, want_net), ("pidns", CLONE_NEWPID, want_pid))
              if want]
    if not wanted:
        return [], {}
    uid, gid = os.getuid(), os.getgid()

    def attempt(flags: int) -> None:
        _unshare(flags | (0 if root else CLONE_NEWUSER))
        if not root:
            _map_own_ids(uid, gid)

    try:
        attempt(sum(flag for _, flag in wanted))
        return [name for name, _ in wanted], {}
    except OSError as both:
        entered, missing = [], {}
        for name, flag in wanted:  # one may work without the other (e.g. no CLONE_NEWPID in a container)
            try:
                attempt(flag)
                entered.append(name)
            except OSError as e:
                missing[name] = f"unshare: {e or both}"
        return entered, missing


def _map_own_ids(uid: int, gid: int) -> None:
    """In a new user namespace, map our own ids onto themselves: files we create keep their
    owner outside."""
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
