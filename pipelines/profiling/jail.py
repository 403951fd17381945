"""The sandbox of a process that runs untrusted kernel code, applied before it starts.

    python3 -I -S pipelines/profiling/jail.py SPEC_JSON -- python3 -P -m pipelines.profiling.child ...

`Sandbox` (sandbox.py) starts every kernel-running child through this file; it is run as a
script, imports only the standard library and is done before any kernel code exists in the
process. It applies each layer the host allows, records which in the environment variable
KERNELCAST_SANDBOX_LAYERS of the program it executes, and writes one JSON line
`KERNELCAST_SANDBOX_NOTES {...}` to stderr naming every layer it could not apply and why.

Layers (names as recorded in the measurement row's `sandbox` column):
    env        the parent passes an allow-listed environment (sandbox.child_env)
    tmpdir     the working directory, HOME and TMPDIR are a private directory
    uid        runs as a dedicated unprivileged uid/gid (only when started as root)
    nocaps     started as root but kept root's uid (a sandbox uid could not run the interpreter):
               every capability dropped, from the bounding set too, so the child cannot read
               other users' files, ptrace or read the environment of processes with more
               privileges (the parent), or get capabilities back by executing anything
    netns      a new network namespace: no interface but a down loopback, so no network
    pidns      a new PID namespace: when its first process dies the kernel kills every process
               in it, so nothing the kernel spawns (setsid included) outlives the child
    rlimits    address space (CPU children; CUDA reserves far more virtual memory than it
               uses, so GPU children are watched by RSS in the parent instead), file size,
               processes (only where the count is per sandbox: own uid or own user namespace),
               no core files
    nonewprivs no setuid binary can give privileges back
    landlock   writes only inside the private directory, the shared Triton cache and the
               device files; no ptrace of or signals to processes outside (Linux Landlock)
    landlock-net  no TCP connect/bind, where there is no network namespace
    netlock    Landlock's network rules alone, no file rules (Linux 6.7, ABI 4): no TCP connect
               or bind and, from ABI 6 (Linux 6.12), no abstract Unix socket or signal outside
               the child. For hosts where the network namespace, seccomp and Landlock's file
               rules all keep CUDA from starting (an H100 host, 2026-12-05: a kernel reached a TCP
               port and an abstract Unix socket there)
    mountns    a private mount namespace in which every filesystem is read-only (remounted) but
               the private directory and the shared Triton cache (bound onto themselves first);
               device files stay usable, /proc/sys is read-only. It keeps files safe where
               Landlock cannot be used; root's capabilities must go (uid or nocaps), or the
               child could remount (then `mountns` and the three below are dropped)
    masks      (inside mountns) every home folder (/root, /home, this user's, KERNELCAST_HOME)
               and /etc/ssh are an empty tmpfs but for the paths the child needs (interpreter,
               libraries, repository, temporary and private directories) bound back; /etc/shadow
               and the like read as empty. So a child that keeps root's uid or the caller's
               cannot read their 0600 keys, and the folders to an interpreter under a 0700 home
               become traversable: a sandbox uid can start there
    shm        (inside mountns) /dev/shm is a tmpfs of the child's own, of at most
               spec["shm_bytes"] (the private directory bound back when it lies there), so
               shared memory counts against a limit and reaches no other process
    sockets    (inside mountns) no Unix socket file of the host by path, for hosts where `nounix`
               stops the CUDA driver: /run (and /var/run) an empty tmpfs but for the paths the
               child needs, and every socket file found at the child's start in the temporary
               folders (/tmp, /var/tmp, /dev/shm, TMPDIR; three levels deep) covered by /dev/null,
               so a connect is refused (ssh-agent, tmux, X11, a database, a container daemon).
               Abstract names are the network namespace's (`netns`); a socket made after the
               child started, or kept elsewhere, is not covered
    proc       (inside mountns) a procfs of the child's own on /proc with hidepid=invisible: in
               its PID namespace it shows only the namespace; without one (pidns dropped) only
               the processes the child may ptrace, so no other command line or environment
    seccomp    a seccomp filter: socket() of the IPv4, IPv6 and packet families and io_uring
               fail with EACCES, so no network even where a network namespace would keep the
               CUDA driver from starting
    nounix     the same filter also refuses socket() of AF_UNIX: no Unix socket file or abstract
               name of the host can be reached (socketpair() and pipes stay: the channel to the
               parent is the inherited stdin/stdout)

A process group of its own is what the parent kills without `pidns`; see sandbox.Sandbox.kill.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import signal
import stat
import sys
from collections.abc import Sequence
from typing import Any

LAYERS_ENV = "KERNELCAST_SANDBOX_LAYERS"
NOTES_PREFIX = "KERNELCAST_SANDBOX_NOTES "

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522

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


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _errno_text() -> str:
    return os.strerror(ctypes.get_errno())


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


# Mount flags (<sys/mount.h>).
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1 << 10, 1 << 11, 1 << 12
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 1 << 14, 1 << 18, 1 << 21, 1 << 24
MNT_DETACH = 2
# Per-mount options a bind remount must repeat: in a user namespace the kernel refuses (EPERM)
# to clear those it locked, and as root leaving one out would loosen the copy of the mount.
KEPT_MOUNT_OPTIONS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
                      "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
# procfs stays as it is (the jail writes its uid maps there, CUDA reads the driver's files) except
# /proc/sys, where a root uid without capabilities could still write many kernel settings.
LEFT_AS_IS = "/proc"
MADE_READ_ONLY_IN_PROC = "/proc/sys"


def _map_own_ids(uid: int, gid: int) -> None:
    """In a new user namespace, map our own ids onto themselves: files we create keep their
    owner outside."""
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")


def _mount(source: str | None, target: str, flags: int, fstype: str | None = None, data: str | None = None) -> None:
    libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    if libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None, flags,
                  data.encode() if data else None) != 0:
        raise OSError(ctypes.get_errno(), f"mount {target}: {_errno_text()}")


def _umount_detach(target: str) -> None:
    if _libc().umount2(target.encode(), ctypes.c_int(MNT_DETACH)) != 0:
        raise OSError(ctypes.get_errno(), f"umount {target}: {_errno_text()}")


def _unescape_mount_path(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes (\\040)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def read_mountinfo(text: str) -> list[tuple[str, str, str]]:
    """(mount point, per-mount options, optional fields) of each mountinfo line, in order.

    >>> read_mountinfo("27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw")
    [('/', 'rw,relatime', 'shared:1')]
    """
    out = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        out.append((_unescape_mount_path(fields[4]), fields[5], " ".join(fields[6:sep])))
    return out


def _mountinfo() -> list[tuple[str, str, str]]:
    with open("/proc/self/mountinfo") as f:
        return read_mountinfo(f.read())


def read_only_remount_flags(options: str) -> int:
    """The flags of a read-only bind remount that keeps a mount's other per-mount options.

    >>> read_only_remount_flags("rw,nosuid,nodev,noatime") == MS_REMOUNT | MS_BIND | MS_RDONLY | 2 | 4 | 1024
    True
    """
    given = set(options.split(","))
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY
    for name, bit in KEPT_MOUNT_OPTIONS.items():
        if name in given:
            flags |= bit
    if not given & {"noatime", "relatime"}:
        flags |= MS_STRICTATIME  # otherwise the kernel would default the copy to relatime
    return flags


def _mount_namespace() -> str:
    return os.readlink("/proc/self/ns/mnt")


def _unshare_mounts(root: bool, in_user_ns: bool) -> bool:
    """Enter a new mount namespace, private all the way down; returns whether a user namespace
    was made for it. Raises OSError unless both are certain: every remount that follows must
    happen in a namespace of our own, and no bind mount may propagate back to the host."""
    before = _mount_namespace()
    made_user_ns = not root and not in_user_ns
    uid, gid = os.getuid(), os.getgid()
    try:
        _unshare(CLONE_NEWNS | (CLONE_NEWUSER if made_user_ns else 0))
    except OSError as e:
        raise OSError(f"unshare: {e}") from None
    if made_user_ns:
        _map_own_ids(uid, gid)
    if _mount_namespace() == before:
        raise OSError("unshare reported success but the mount namespace is unchanged")
    _mount(None, "/", MS_REC | MS_PRIVATE)
    if any("shared:" in optional or "master:" in optional for _, _, optional in _mountinfo()):
        raise OSError("mounts still propagate after making the tree private")
    return made_user_ns


def _is_beneath(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _bind_writable(dirs: list[str]) -> list[str]:
    """Bind each existing directory onto itself: its own mount, kept writable below a read-only
    parent. Returns the resolved paths bound."""
    bound = []
    for d in dict.fromkeys(os.path.realpath(d) for d in dirs):
        if d == "/":
            raise OSError("the root directory cannot be a writable directory")
        if not os.path.isdir(d):
            continue
        _mount(d, d, MS_BIND)
        bound.append(d)
    return bound


def _outermost(paths: list[str]) -> list[str]:
    """The resolved, existing paths of `paths` that lie beneath no other of them (sorted)."""
    real = sorted({os.path.realpath(p) for p in paths if p and os.path.exists(p)})
    return [p for p in real if not any(q != p and _is_beneath(p, q) for q in real)]


def cover_with_tmpfs(top: str, keep: list[str], data: str) -> list[str]:
    """Mount a fresh tmpfs over the directory `top` and bind back each path of `keep` beneath it
    (opened before the tmpfs hides them, bound from the open descriptor): in this mount
    namespace `top` then holds those paths and nothing else. Returns the paths bound back.

    Raises OSError with the tmpfs taken off again, so a failure leaves `top` as it was.
    """
    held = []
    old_umask = os.umask(0o022)  # the folders leading to a kept path: traversable by a sandbox uid
    try:
        for path in _outermost(keep):
            if path != top and _is_beneath(path, top):
                held.append((path, os.path.isdir(path), os.open(path, os.O_PATH | os.O_CLOEXEC)))
        _mount("tmpfs", top, MS_NOSUID | MS_NODEV, "tmpfs", data)
        try:
            for path, is_dir, fd in held:
                os.makedirs(path if is_dir else os.path.dirname(path), exist_ok=True)
                if not is_dir:
                    os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
                _mount(f"/proc/self/fd/{fd}", path, MS_BIND | MS_REC)
        except OSError:
            _umount_detach(top)
            raise
    finally:
        os.umask(old_umask)
        for _, _, fd in held:
            os.close(fd)
    return [p for p, _, _ in held]


def empty_dirs(dirs: Sequence[str], visible: Sequence[str]) -> list[str]:
    """Each existing folder of `dirs` (outermost ones; never / or a visible path itself) becomes
    an empty tmpfs but for the `visible` paths beneath it, bound back. Returns the folders emptied."""
    keep = _outermost(list(visible))
    done = []
    for top in _outermost([d for d in dirs if os.path.isdir(d)]):
        if top == "/" or top in keep:
            continue
        cover_with_tmpfs(top, keep, "mode=0755,size=1m")
        done.append(top)
    return done


def hide_paths(hidden_dirs: list[str], hidden_files: list[str], visible: list[str]) -> list[str]:
    """The `masks` layer: each of `hidden_dirs` becomes an empty folder but for the `visible`
    paths beneath it (the interpreter, the libraries, the repository, the private directory),
    each of `hidden_files` reads as empty (/dev/null bound over it). A folder that is itself a
    visible path stays as it is (all of it is needed); one inside a visible path (a home under
    the temporary directory) is hidden all the same. Returns what was hidden.

    So a child that keeps the caller's uid (or root's, without capabilities) cannot read the
    caller's keys, tokens and password hashes, and the folders leading to the interpreter are
    traversable by a sandbox uid even where the caller's home is 0700.
    """
    done = empty_dirs(hidden_dirs, visible)
    for f in hidden_files:
        real = os.path.realpath(f)
        if os.path.isfile(real) and not any(_is_beneath(real, d) for d in done):
            _mount("/dev/null", real, MS_BIND)
            done.append(real)
    return done


# Where a host's daemons keep their socket files, and where users' programs do (ssh-agent, tmux,
# X11 in /tmp): the `sockets` layer empties the first and covers every socket file of the second.
SOCKET_RUN_DIRS = ("/run", "/var/run")
SOCKET_SCAN_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
SOCKET_SCAN_DEPTH = 3
SOCKET_SCAN_LIMIT = 20_000  # entries looked at, at most: a child's start must stay fast


def socket_files(tops: list[str], skip: list[str], depth: int = SOCKET_SCAN_DEPTH,
                 limit: int = SOCKET_SCAN_LIMIT) -> list[str]:
    """Unix socket files at most `depth` levels beneath each of `tops`, not beneath `skip`
    (the child's own folders: nothing of the host's is there); symlinks are not followed."""
    found, seen = [], 0
    stack = [(t, 0) for t in _outermost([t for t in tops if os.path.isdir(t)])]
    while stack and seen < limit:
        folder, level = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            path = entry.path
            if any(_is_beneath(path, k) for k in skip):
                continue
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISSOCK(mode):
                found.append(path)
            elif stat.S_ISDIR(mode) and level + 1 < depth:
                stack.append((path, level + 1))
    return found


def hide_unix_sockets(visible: list[str], own: list[str], scan: list[str] = ()) -> list[str]:
    """The `sockets` layer: /run and /var/run become an empty tmpfs but for the `visible` and
    `own` paths beneath them, and each socket file in the temporary folders (and `scan`), outside
    the child's `own` folders (private directory, shared caches), reads as /dev/null, so
    connecting to it is refused. Returns what was hidden.

    The AF_UNIX refusal of `nounix` is the complete answer; this is what holds where the CUDA
    driver will not start under it: the host's well-known socket files are out of reach.
    """
    done = empty_dirs(SOCKET_RUN_DIRS, list(visible) + list(own))
    tops = list(SOCKET_SCAN_DIRS) + [os.environ.get("TMPDIR", "")] + list(scan)
    own_real = [os.path.realpath(d) for d in own if d]
    for path in socket_files([t for t in tops if t], skip=done + own_real):
        try:
            _mount("/dev/null", path, MS_BIND)
        except OSError:
            if _is_socket(path):
                raise
            continue  # removed (or replaced) since the scan: nothing left to hide
        done.append(path)
    return done


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


SHM = "/dev/shm"


def private_shm(size_bytes: int, keep: list[str]) -> None:
    """The `shm` layer: a tmpfs of its own on /dev/shm of at most `size_bytes` (what a kernel
    puts there would otherwise count against the host's memory, not the child's limit), with
    the paths of `keep` beneath /dev/shm (the private directory) bound back into it."""
    if not os.path.isdir(SHM):
        raise OSError(f"no {SHM} on this host")
    cover_with_tmpfs(SHM, keep, f"mode=1777,size={int(size_bytes)}")


PROC_GID = 61999  # the group that may see every process in a private /proc: none of the children's


def mount_private_proc() -> None:
    """The `proc` layer: a procfs of our own on /proc that lists only the processes this one may
    ptrace (hidepid=invisible; in a PID namespace of its own, only the namespace's), so no other
    process's command line or environment can be read; /proc/sys read-only in it too. The group
    exempt from hidepid is one no child is in (by default it is root's, which a child without
    a sandbox uid keeps).

    Raises OSError (the /proc before is left in place) when the kernel refuses.
    """
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC

    def mount_new() -> None:
        # gid= names a group of this user namespace (refused, EINVAL, in one that maps only our
        # own, where root's group is not ours anyway); hidepid=2 for kernels before 5.8
        options = [f"hidepid=invisible,gid={PROC_GID}", "hidepid=invisible", f"hidepid=2,gid={PROC_GID}", "hidepid=2"]
        for i, data in enumerate(options):
            try:
                _mount("proc", "/proc", flags, "proc", data)
                return
            except OSError as e:
                if e.errno != errno.EINVAL or i == len(options) - 1:
                    raise

    try:
        mount_new()
    except OSError as first:
        if first.errno != errno.EPERM or not _is_mount_point(MADE_READ_ONLY_IN_PROC):
            raise
        # In a user namespace the kernel refuses a new procfs while the old one has a mount over
        # part of it (our read-only /proc/sys): take that one off first.
        _umount_detach(MADE_READ_ONLY_IN_PROC)
        mount_new()
    try:
        _mount(MADE_READ_ONLY_IN_PROC, MADE_READ_ONLY_IN_PROC, MS_BIND | MS_REC)
        _mount(None, MADE_READ_ONLY_IN_PROC, read_only_remount_flags("rw,nosuid,nodev,noexec,relatime"))
    except OSError:
        _umount_detach("/proc")  # never a procfs with a writable /proc/sys for a root child
        raise


def _is_mount_point(path: str) -> bool:
    return any(point == path for point, _, _ in _mountinfo())


def _remount_read_only(writable: list[str]) -> dict[str, str]:
    """Remount every mount point read-only except the writable binds and procfs (but for
    /proc/sys); returns {mount point: why it was left writable}. Raises OSError when the root
    filesystem stays writable."""
    if os.path.isdir(MADE_READ_ONLY_IN_PROC):
        try:
            _mount(MADE_READ_ONLY_IN_PROC, MADE_READ_ONLY_IN_PROC, MS_BIND | MS_REC)
        except OSError:
            pass  # then it is not in the list below, and the note says so
    mounts = _mountinfo()
    options = {point: opts for point, opts, _ in mounts}  # the last line of a point is its top mount
    skipped: dict[str, str] = {}
    for point in sorted(options, key=lambda p: (p != "/", p)):
        if any(_is_beneath(point, w) for w in writable):
            continue  # a writable bind, or what it covers
        if _is_beneath(point, LEFT_AS_IS) and not _is_beneath(point, MADE_READ_ONLY_IN_PROC):
            continue
        try:
            _mount(None, point, read_only_remount_flags(options[point]))
        except OSError as e:
            if point == "/":
                raise OSError(f"the root filesystem cannot be made read-only ({e.strerror})") from None
            skipped[point] = errno.errorcode.get(e.errno or 0, str(e.errno))
    if not os.statvfs("/").f_flag & os.ST_RDONLY:
        raise OSError("the root filesystem is still writable after its remount")
    if not any(_is_beneath(p, MADE_READ_ONLY_IN_PROC) for p in options):
        skipped[MADE_READ_ONLY_IN_PROC] = "no bind mount"
    return skipped


def enter_mount_namespace(writable_dirs: list[str], root: bool, in_user_ns: bool,
                          before_remount: Any = None) -> tuple[bool, dict[str, str]]:
    """A private mount namespace where every filesystem is read-only but `writable_dirs`.

    Character devices stay usable (a read-only mount does not stop opening them for writing) and
    so do Unix sockets; descriptors opened before (the log on stderr) keep writing.
    `before_remount()`, when given, runs inside the new namespace before anything is made
    read-only and returns further mount points to keep writable (the private /dev/shm).

    Returns:
        (whether a user namespace was made for it, {mount point: why it stayed writable}).
    Raises:
        OSError: the namespace or the read-only root could not be had (the layer is missing).
    """
    made_user_ns = _unshare_mounts(root, in_user_ns)
    extra = list(before_remount()) if before_remount is not None else []
    bound = _bind_writable(writable_dirs)
    return made_user_ns, _remount_read_only(bound + extra)


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


def _die_with(parent_signal: int = signal.SIGKILL) -> None:
    _libc().prctl(PR_SET_PDEATHSIG, parent_signal, 0, 0, 0)


def _supervise(child: int) -> None:
    """PID namespace: the namespace's first process is our child; relay its fate as our own."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)  # the channel must close when the child dies, not when we do
    os.dup2(devnull, 1)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: os.kill(child, signal.SIGKILL))
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


MOUNT_SUBLAYERS = ("masks", "sockets", "shm", "proc")  # applied inside the mount namespace only


def _mountns_layer(spec: dict, root: bool, in_user_ns: bool, notes: dict[str, str]) -> tuple[list[str], bool]:
    """The `mountns` layer when wanted, with `masks` and `shm` inside it: (the layers entered,
    whether a user namespace was made)."""
    want = set(spec.get("want", ()))
    if "mountns" not in want:
        for name in MOUNT_SUBLAYERS:
            if name in want:
                notes[name] = "needs the mount namespace (mountns), which is not applied"
        return [], False
    writable = list(spec.get("mount_writable_dirs", spec.get("writable_dirs", ())))
    entered: list[str] = []

    def inside() -> list[str]:
        if "masks" in want:
            try:
                hide_paths(list(spec.get("hidden_dirs", ())), list(spec.get("hidden_files", ())),
                           list(spec.get("visible_paths", ())) + writable)
                entered.append("masks")
            except OSError as e:
                notes["masks"] = str(e)
        if "sockets" in want:
            try:
                hide_unix_sockets(list(spec.get("visible_paths", ())), writable, list(spec.get("socket_scan_dirs", ())))
                entered.append("sockets")
            except OSError as e:
                notes["sockets"] = str(e)
        if "shm" in want:
            try:
                private_shm(int(spec.get("shm_bytes") or 2**30), writable)
                entered.append("shm")
                return [SHM]
            except OSError as e:
                notes["shm"] = str(e)
        return []

    try:
        made_user_ns, skipped = enter_mount_namespace(writable, root, in_user_ns, before_remount=inside)
    except OSError as e:
        notes["mountns"] = str(e)
        for name in MOUNT_SUBLAYERS:
            if name in want:
                notes.setdefault(name, "needs the mount namespace (mountns), which could not be entered")
        return [], False
    if skipped:
        notes["mountns-skipped"] = "left writable: " + ", ".join(f"{p} ({why})" for p, why in sorted(skipped.items()))
    return ["mountns", *entered], made_user_ns


def _proc_layer(want: set[str], layers: list[str], notes: dict[str, str]) -> None:
    """The `proc` layer, in the first process of the PID namespace where there is one."""
    if "proc" not in want:
        return
    if "mountns" not in layers:
        notes.setdefault("proc", "needs the mount namespace (mountns), which is not applied")
        return
    try:
        mount_private_proc()
        layers.append("proc")
    except OSError as e:
        notes["proc"] = str(e)


def _give_up_root(spec: dict, want: set[str], root: bool, switch: bool, layers: list[str],
                  notes: dict[str, str]) -> None:
    """The sandbox uid, or as root without one no capabilities; `mountns` goes if neither held."""
    if switch:
        os.setgroups([])
        os.setgid(int(spec["gid"]))
        os.setuid(int(spec["uid"]))
        layers.append("uid")
    elif root and "nocaps" in want:
        try:
            drop_capabilities()
            layers.append("nocaps")
        except OSError as e:
            notes["nocaps"] = str(e)
    if root and "mountns" in layers and not ("uid" in layers or "nocaps" in layers):
        # a root child that keeps CAP_SYS_ADMIN could remount everything writable, unmount the masks
        for name in ("mountns", *MOUNT_SUBLAYERS):
            if name in layers:
                layers.remove(name)
                notes[name] = "the child keeps root's capabilities (no sandbox uid, none dropped): it could remount"


def _filter(spec: dict, want: set[str], in_netns: bool, layers: list[str], notes: dict[str, str]) -> None:
    """no_new_privs, then the seccomp filter and Landlock (both need no_new_privs)."""
    if _libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        layers.append("nonewprivs")
    families = (DENIED_FAMILIES if "seccomp" in want else ()) + ((AF_UNIX,) if "nounix" in want else ())
    if families and "nonewprivs" in layers:
        try:
            seccomp_deny_network(families)
            layers += [name for name in ("seccomp", "nounix") if name in want]
        except OSError as e:
            for name in ("seccomp", "nounix"):
                if name in want:
                    notes[name] = str(e)
    if "landlock" in want:
        try:
            layers += apply_landlock(list(spec.get("writable_dirs", ())), list(spec.get("writable_files", ())),
                                     block_tcp=not in_netns)
        except OSError as e:
            notes["landlock"] = str(e)
    if "netlock" in want:  # in a network namespace too: nothing there needs TCP, and a layer more holds
        try:
            layers += apply_landlock_net()
        except OSError as e:
            notes["netlock"] = str(e)


def run(spec: dict, argv: list[str]) -> None:
    """Apply the layers of `spec` to this process and execute `argv` (never returns).

    Spec keys: private_dir, uid, gid (ints or null), want (layer names), limits
    ({as, fsize, nproc, core}: bytes / counts or null), writable_dirs, writable_files (Landlock),
    mount_writable_dirs (the directories `mountns` keeps writable; default writable_dirs), umask (int),
    hidden_dirs, hidden_files, visible_paths (`masks`), shm_bytes (`shm`).
    """
    want = set(spec.get("want", ()))
    root = os.geteuid() == 0
    layers = ["env", "tmpdir"]
    notes: dict[str, str] = {}
    uid, gid = spec.get("uid"), spec.get("gid")
    switch = "uid" in want and root and uid is not None and gid is not None
    if "uid" in want and not switch:
        notes["uid"] = "not started as root: the child keeps this user's uid" if not root else "no uid given"

    _die_with()  # the parent's death ends us (and through us, a PID namespace's processes)
    entered, missing = enter_namespaces("netns" in want, "pidns" in want, root)
    notes.update(missing)
    layers += entered
    # Before the uid switch, the capability drop and Landlock: remounting needs CAP_SYS_ADMIN.
    mounted, made_user_ns = _mountns_layer(spec, root, in_user_ns=not root and bool(entered), notes=notes)
    layers += mounted
    if "pidns" in entered:
        child = os.fork()  # the first process of the new PID namespace
        if child:
            _supervise(child)
        _die_with()
        if os.getppid() == 1:  # the supervisor died before prctl took effect
            os._exit(1)
    _proc_layer(want, layers, notes)  # here: a procfs shows the PID namespace of the process mounting it
    per_sandbox_nproc = switch or not root and (bool(entered) or made_user_ns)  # counted per uid / user namespace
    try:
        layers += set_limits(spec.get("limits", {}), per_sandbox_nproc)
        if not per_sandbox_nproc:
            notes["rlimits-nproc"] = "no own uid or user namespace: a process limit would count this user's processes"
    except (OSError, ValueError) as e:
        notes["rlimits"] = str(e)
    _give_up_root(spec, want, root, switch, layers, notes)
    _filter(spec, want, "netns" in entered, layers, notes)
    os.umask(int(spec.get("umask", 0o002)))
    private = spec["private_dir"]
    os.chdir(private)
    env = dict(os.environ)
    env[LAYERS_ENV] = ",".join(layers)
    if notes:
        sys.stderr.write(NOTES_PREFIX + json.dumps(notes, sort_keys=True) + "\n")
        sys.stderr.flush()
    try:
        os.execve(argv[0], argv, env)
    except OSError as e:
        sys.stderr.write(f"sandbox: cannot execute {argv[0]}: {e}\n")
        os._exit(127)


def main(args: list[str]) -> None:
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write("usage: jail.py SPEC_JSON -- PROGRAM [ARGS...]\n")
        os._exit(2)
    run(json.loads(args[0]), args[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
