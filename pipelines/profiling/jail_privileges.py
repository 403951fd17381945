"""The jail's privilege layers: `rlimits` (memory, file size, processes, no core files), `nocaps`
(every capability dropped) and the seccomp filter of `seccomp` and `nounix` (no socket() of the
network families, io_uring, and for `nounix` AF_UNIX).

jail.py lists the layers and applies them in order. Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import resource

from pipelines.profiling.jail_libc import _errno_text, _libc

PR_CAPBSET_DROP = 24


PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522


def set_limits(limits: dict, per_sandbox_nproc: bool) -> list[str]:
    """Soft = hard limits, so the kernel cannot raise them again. Returns ["rlimits"] or []."""
    names = {"as": resource.RLIMIT_AS, "fsize": resource.RLIMIT_FSIZE, "core": resource.RLIMIT_CORE}
    if per_sandbox_nproc:
        names["nproc"] = resource.RLIMIT_NPROC
    for key, which in names.items():
        value = limits.get(key)
        if value is None:
            continue
        resource.setrlimit(which, (int(value), int(value)))
    return ["rlimits"]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Drop every capability: bounding set, ambient set, then effective/permitted/inheritable.

    Raises OSError when the kernel refuses.
    """
    libc = _libc()
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 40
    for cap in range(last + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: unknown cap
            raise OSError(f"dropping capability {cap}: {_errno_text()}")
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(f"capset: {_errno_text()}")


# seccomp-bpf: struct seccomp_data is {int nr; u32 arch; u64 ip; u64 args[6]}
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
EACCES = 13
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
X32_SYSCALL_BIT = 0x40000000
# machine -> (audit arch, socket, io_uring_setup)
SECCOMP_ARCH = {"x86_64": (0xC000003E, 41, 425), "aarch64": (0xC00000B7, 198, 425)}
DENIED_FAMILIES = (2, 10, 17)  # AF_INET, AF_INET6, AF_PACKET
AF_UNIX = 1  # refused by the `nounix` layer: socket files and abstract names of the host


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def network_filter(machine: str, families: tuple[int, ...] = DENIED_FAMILIES) -> list[tuple[int, int, int, int]]:
    """The BPF program (code, jt, jf, k) denying socket() of `families` and io_uring on `machine`.

    A call of another architecture (its numbers differ) or of the x32 ABI is denied outright
    rather than misread. socketpair() is another call and stays: a connected pair reaches
    nothing outside the process.
    """
    arch, nr_socket, nr_uring = SECCOMP_ARCH[machine]
    # (code, jump-if-true label, jump-if-false label, k); labels resolve to relative offsets
    code: list[tuple[int, str | None, str | None, int]] = [
        (BPF_LD_W_ABS, None, None, 4),  # arch
        (BPF_JEQ_K, None, "deny", arch),
        (BPF_LD_W_ABS, None, None, 0),  # nr
        (BPF_JGE_K, "deny", None, X32_SYSCALL_BIT),
        (BPF_JEQ_K, "deny", None, nr_uring),
        (BPF_JEQ_K, None, "allow", nr_socket),
        (BPF_LD_W_ABS, None, None, 16),  # args[0], the address family (low word)
        *[(BPF_JEQ_K, "deny", None, family) for family in families],
    ]
    labels = {"allow": len(code), "deny": len(code) + 1}
    code += [(BPF_RET_K, None, None, SECCOMP_RET_ALLOW), (BPF_RET_K, None, None, SECCOMP_RET_ERRNO | EACCES)]

    def offset(pc: int, label: str | None) -> int:
        return 0 if label is None else labels[label] - pc - 1

    return [(c, offset(pc, jt), offset(pc, jf), k) for pc, (c, jt, jf, k) in enumerate(code)]


def seccomp_deny_network(families: tuple[int, ...] = DENIED_FAMILIES) -> None:
    """Install network_filter for this process and what it executes (no_new_privs must be set).

    Raises OSError when the kernel refuses it or the machine is not one the filter knows.
    """
    machine = os.uname().machine
    if machine not in SECCOMP_ARCH:
        raise OSError(f"no seccomp filter for {machine}")
    prog = network_filter(machine, families)
    filters = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), filters)
    if _libc().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(f"seccomp: {_errno_text()}")
