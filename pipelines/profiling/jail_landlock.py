"""The jail's Landlock layers: `landlock` (writes only where the child must write, no TCP without a
network namespace) and `netlock` (Landlock's network and scope rules alone).

Linux Landlock restricts the process and everything it executes, unprivileged; each rule is
applied only as far as the running kernel's ABI knows it. jail.py lists the layers and applies
them in order. Standard library only.
"""

from __future__ import annotations

import ctypes
import os

from pipelines.profiling.jail_libc import PR_SET_NO_NEW_PRIVS, _errno_text, _libc

# Landlock (include/uapi/linux/landlock.h); syscall numbers are the same on x86_64 and arm64.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_WRITE_FILE = 1 << 1
FS_REMOVE_DIR, FS_REMOVE_FILE = 1 << 4, 1 << 5
FS_MAKE_CHAR, FS_MAKE_DIR, FS_MAKE_REG, FS_MAKE_SOCK = 1 << 6, 1 << 7, 1 << 8, 1 << 9
FS_MAKE_FIFO, FS_MAKE_BLOCK, FS_MAKE_SYM = 1 << 10, 1 << 11, 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The Landlock ABI version of the running kernel; 0 when there is none."""
    try:
        libc = _libc()
        libc.syscall.restype = ctypes.c_long
        abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                           ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(0, int(abi))


def _restrict_self(attr: _RulesetAttr, size: int, path_rules: list[tuple[str, int]]) -> None:
    """Create a Landlock ruleset of `attr` (its first `size` bytes: the fields this ABI has), add
    `path_rules` ((path, rights) allowed beneath it; a path this host lacks is skipped), and
    restrict this process with it (no_new_privs first). Raises OSError when the kernel refuses."""
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(f"landlock_create_ruleset: {_errno_text()}")
    try:
        for path, rights in path_rules:
            try:
                target = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a device file this host does not have
            try:
                rule = _PathBeneathAttr(allowed_access=rights, parent_fd=target)
                if libc.syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    raise OSError(f"landlock_add_rule {path}: {_errno_text()}")
            finally:
                os.close(target)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(f"no_new_privs: {_errno_text()}")
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            raise OSError(f"landlock_restrict_self: {_errno_text()}")
    finally:
        os.close(fd)


def apply_landlock(writable_dirs: list[str], writable_files: list[str], block_tcp: bool) -> list[str]:
    """Allow writes only beneath `writable_dirs` and to `writable_files`; returns the layers set.

    Reads and execution stay allowed everywhere (the child imports torch, runs ptxas).
    Raises OSError when the kernel refuses the ruleset.
    """
    abi = landlock_abi()
    if abi < 1:
        raise OSError("Landlock is not available in this kernel")
    dir_rights = (FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_CHAR | FS_MAKE_DIR | FS_MAKE_REG
                  | FS_MAKE_SOCK | FS_MAKE_FIFO | FS_MAKE_BLOCK | FS_MAKE_SYM)
    file_rights = FS_WRITE_FILE
    if abi >= 2:
        dir_rights |= FS_REFER
    if abi >= 3:
        dir_rights |= FS_TRUNCATE
        file_rights |= FS_TRUNCATE
    attr = _RulesetAttr(handled_access_fs=dir_rights)
    size = 8
    layers = ["landlock"]
    if abi >= 4:
        size = 16
        if block_tcp:
            attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP  # no rule allows any port
            layers.append("landlock-net")
    if abi >= 6:
        size = 24
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    _restrict_self(attr, size, [(d, dir_rights) for d in writable_dirs] + [(f, file_rights) for f in writable_files])
    return layers


def apply_landlock_net() -> list[str]:
    """Landlock with network rules and scopes only (the `netlock` layer): no TCP connect or bind,
    and from ABI 6 no abstract Unix socket or signal outside this process's domain. Files are
    left alone. Raises OSError where the kernel has no Landlock network rules."""
    abi = landlock_abi()
    if abi < 4:
        raise OSError(f"Landlock network rules need ABI 4 (Linux 6.7); this kernel has {abi or 'none'}")
    attr = _RulesetAttr(handled_access_net=NET_BIND_TCP | NET_CONNECT_TCP)  # no rule allows any port
    size = 16
    if abi >= 6:
        attr.scoped, size = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL, 24
    _restrict_self(attr, size, [])
    return ["netlock"]
