"""The jail's mount layers: `mountns` (every filesystem read-only but the child's own folders) and,
inside it, `masks` (home folders and keys hidden), `sockets` (the host's Unix socket files covered),
`shm` (a /dev/shm of the child's own) and `proc` (a procfs that shows only the child's processes).

They keep files safe where Landlock cannot be used; jail.py lists the layers, decides which apply
and applies them in order. Standard library only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Sequence
from typing import Any

from pipelines.profiling.jail_libc import _errno_text, _libc
from pipelines.profiling.jail_namespaces import CLONE_NEWNS, CLONE_NEWUSER, _map_own_ids, _unshare

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
