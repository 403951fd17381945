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

This module decides which layers apply and applies them in order (`run`); the layers themselves
live beside it: jail_namespaces (netns, pidns), jail_mounts (mountns, masks, sockets, shm, proc),
jail_privileges (rlimits, nocaps, seccomp, nounix), jail_landlock (landlock, netlock), and the C
library they call (jail_libc). Run as a script with `-I`, which leaves this file's folder off the
import path, the jail finds them from the repository root.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys

if not __package__:  # run as a script under -I: the layer modules are found from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from pipelines.profiling.jail_landlock import apply_landlock, apply_landlock_net
from pipelines.profiling.jail_libc import PR_SET_NO_NEW_PRIVS, _libc
from pipelines.profiling.jail_mounts import (
    SHM,
    enter_mount_namespace,
    hide_paths,
    hide_unix_sockets,
    mount_private_proc,
    private_shm,
)
from pipelines.profiling.jail_namespaces import enter_namespaces
from pipelines.profiling.jail_privileges import (
    AF_UNIX,
    DENIED_FAMILIES,
    drop_capabilities,
    seccomp_deny_network,
    set_limits,
)

LAYERS_ENV = "KERNELCAST_SANDBOX_LAYERS"
NOTES_PREFIX = "KERNELCAST_SANDBOX_NOTES "
PR_SET_PDEATHSIG = 1


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
