"""The world a kernel-running child is allowed: which sandbox layers are wanted, its limits, its
environment, the paths it may see, its uid, and the jail spec that `jail.py` applies.

Read by the sandbox's parent (pipelines.profiling.sandbox), the layer probe
(pipelines.profiling.layer_probe) and the check and worker loops. Standard library only.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipelines.profiling import jail
from pipelines.profiling.processes import MARKER_ENV, kill_processes, processes_of_uid

REPO_ROOT = Path(__file__).resolve().parents[2]  # so `-m pipelines.profiling.child` imports
JAIL = Path(jail.__file__).resolve()
SKIP_ENV = "KERNELCAST_SANDBOX_SKIP"  # comma-separated layers not to apply (e.g. "uid,landlock")
MEMORY_ENV = "KERNELCAST_SANDBOX_MEMORY_GB"  # a child's memory limit, GiB (CPU: address space, CUDA: resident)
PROCESSES_ENV = "KERNELCAST_SANDBOX_PROCESSES"  # a child's processes + threads
GIB = 2**30

# Passed through to children when set; everything else (tokens, KERNELCAST_HOME, ...) is dropped.
ALLOWED_ENV = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME",
    "CUDA_PATH", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "TRITON_PTXAS_PATH",
    "TRITON_LIBCUDA_PATH", "TRITON_CACHE_DIR", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF",
    "CUBLAS_WORKSPACE_CONFIG", "TORCH_CUDA_ARCH_LIST", "CC", "CXX", "KERNELCAST_TASK_MODULES", "KERNELCAST_DEVICE",
    "KERNELCAST_SHIP",
)
WANTED_LAYERS = ("uid", "netns", "pidns", "mountns", "masks", "sockets", "shm", "proc", "rlimits", "seccomp", "nounix",
                 "landlock", "netlock")
ROOT_FALLBACK = "nocaps"  # as root without a sandbox uid: root's uid, no capabilities



@dataclass(frozen=True)
class SandboxPolicy:
    """What a kernel-running child may use. Defaults fit a check on a CPU and a GPU worker.

    memory_bytes: address space of a CPU child (RLIMIT_AS), resident memory of a CUDA child
        (watched by the parent: CUDA reserves far more address space than it touches).
    """

    layers: tuple[str, ...] = WANTED_LAYERS
    memory_bytes: int = 8 * GIB
    cuda_memory_bytes: int = 48 * GIB
    file_bytes: int = 4 * GIB  # largest file a child may write (a shipped output, a cache entry)
    processes: int = 512  # processes + threads of one child (torch and CUDA start dozens of threads)
    shm_bytes: int = 2 * GIB  # the child's own /dev/shm (layer `shm`)
    private_files: int = 10_000  # files in the private directory before the child counts as a bomb
    uid_base: int = 61000
    gid: int = 61000

    def without(self, *names: str) -> SandboxPolicy:
        return replace(self, layers=tuple(x for x in self.layers if x not in names))


def policy_from_env(base: SandboxPolicy | None = None) -> SandboxPolicy:
    """`base` (default SandboxPolicy()) minus the layers named in KERNELCAST_SANDBOX_SKIP, with
    the limits of KERNELCAST_SANDBOX_MEMORY_GB and KERNELCAST_SANDBOX_PROCESSES when set.

    Raises:
        ValueError: a limit that is not a positive number.
    """
    policy = base or SandboxPolicy()
    skip = [s.strip() for s in os.environ.get(SKIP_ENV, "").split(",") if s.strip()]
    if skip:
        policy = policy.without(*skip)
    try:
        if os.environ.get(MEMORY_ENV):
            gib = float(os.environ[MEMORY_ENV])
            if not gib > 0:
                raise ValueError
            policy = replace(policy, memory_bytes=int(gib * GIB), cuda_memory_bytes=int(gib * GIB),
                             shm_bytes=min(policy.shm_bytes, int(gib * GIB) // 4))
        if os.environ.get(PROCESSES_ENV):
            n = int(os.environ[PROCESSES_ENV])
            if n < 1:
                raise ValueError
            policy = replace(policy, processes=n)
    except ValueError:
        raise ValueError(f"{MEMORY_ENV} and {PROCESSES_ENV} must be positive numbers") from None
    return policy


def child_env(device: str, extra: dict[str, str] | None = None, private_dir: Path | None = None,
              marker: str | None = None) -> dict[str, str]:
    """The environment of a child: allow-listed variables, interpreter mode on CPU, the repository
    on PYTHONPATH, HOME and TMPDIR in its private directory."""
    env = {k: os.environ[k] for k in ALLOWED_ENV if k in os.environ}
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(REPO_ROOT), *inherited]))
    env["PATH"] = env.get("PATH") or os.defpath
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a segfault leaves a Python traceback in the log
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    env["USER"] = env["LOGNAME"] = "kernelcast-sandbox"  # getpass works without a passwd entry
    # torch.compile's inductor compiles in process: no pool of worker processes that outlive a
    # kernel's job (the parent treats processes left behind as tampering).
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    if private_dir is not None:
        env["HOME"] = env["TMPDIR"] = str(private_dir)
    if marker:
        env[MARKER_ENV] = marker
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"  # must be set before triton is imported in the child
        env["KERNELCAST_DEVICE"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU child never touches a GPU, even on a GPU host
    else:
        env.pop("TRITON_INTERPRET", None)
        env["KERNELCAST_DEVICE"] = "cuda"
    env.update(extra or {})
    return env


def describe_exit(returncode: int | None) -> str:
    """'signal SIGSEGV' / 'exit code 3' / 'still running'."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


# ---- host facts ---------------------------------------------------------------------------
def is_root() -> bool:
    return os.geteuid() == 0


def private_root() -> Path:
    """Where private directories go: /dev/shm when it has room (shipped outputs are read back at
    memory speed), else the temporary directory."""
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize >= 8 * GIB and os.access("/dev/shm", os.W_OK):
            return Path("/dev/shm")
    except OSError:
        pass
    return Path(tempfile.gettempdir())


def device_files() -> list[str]:
    """Device files a child may open for writing (CUDA's, and the harmless ones)."""
    found = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"]
    for pattern in ("/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/dri/*"):
        found += [p for p in glob.glob(pattern) if not os.path.isdir(p)]
    return found


_STALE_SWEPT: list[bool] = []


def remove_stale_private_dirs() -> None:
    """Private directories of parents that were killed (and could not remove them): once per
    process, every kc-<role>-<pid>-* folder whose <pid> no longer runs."""
    if _STALE_SWEPT:
        return
    _STALE_SWEPT.append(True)
    root = private_root()
    for d in root.glob("kc-*-*-*"):
        parts = d.name.split("-")
        if len(parts) >= 4 and parts[2].isdigit() and not Path(f"/proc/{parts[2]}").exists():
            shutil.rmtree(d, ignore_errors=True)


class UidPool:
    """Dedicated uids for the children of this process, one per live child.

    A uid is claimed with an exclusive lock on a file named after it (the lock goes with the
    process that holds it, dead or alive), so two workers on one host (one per GPU) never hand
    out the same uid, and one's sweep cannot end the other's children.
    """

    LOCKS = Path(tempfile.gettempdir()) / "kernelcast-sandbox-uids"

    def __init__(self) -> None:
        self.held: dict[int, int] = {}  # uid -> lock file descriptor

    def take(self, base: int) -> int:
        import fcntl

        self.LOCKS.mkdir(mode=0o700, exist_ok=True)
        for slot in range(1000):
            uid = base + slot
            if uid in self.held:
                continue
            fd = os.open(self.LOCKS / f"{uid}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)  # another worker's child has it
                continue
            self.held[uid] = fd
            kill_processes(processes_of_uid(uid))  # leftovers of a run that died holding it
            return uid
        raise RuntimeError("no free sandbox uid")

    def give_back(self, uid: int) -> None:
        fd = self.held.pop(uid, None)
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the lock


UID_POOL = UidPool()


# Read by nobody but their owner, yet a child keeping root's uid (or the caller's) could read them:
# the `masks` layer empties these folders (but for what a child needs) and these files.
HIDDEN_DIRS = ("/root", "/home", "/etc/ssh", "/etc/sudoers.d")
HIDDEN_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers", "/etc/security/opasswd")


def hidden_dirs() -> list[str]:
    """Folders a child sees empty (but for `visible_paths`): every user's home, this process's
    home (HOME and its passwd entry) and KERNELCAST_HOME (the warehouse, the settings)."""
    out = list(HIDDEN_DIRS) + [os.path.expanduser("~")]
    try:
        import pwd

        out.append(pwd.getpwuid(os.geteuid()).pw_dir)
    except (ImportError, KeyError):
        pass
    if os.environ.get("KERNELCAST_HOME"):
        out.append(os.environ["KERNELCAST_HOME"])
    return [d for d in dict.fromkeys(out) if d and d != "/"]


def visible_paths(private: Path, shared_dirs: tuple[Path, ...]) -> list[str]:
    """What a child needs to read even where it lies inside a hidden folder: the interpreter and
    its libraries, the repository, the temporary directory (kernel files), the CUDA and Triton
    paths the environment names, its private directory and the shared ones."""
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), str(REPO_ROOT), tempfile.gettempdir(),
             str(private), *map(str, shared_dirs), *(p for p in sys.path if p and os.path.exists(p))]
    for var in ("PYTHONPATH", "LD_LIBRARY_PATH"):
        paths += os.environ.get(var, "").split(os.pathsep)
    for var in ("CUDA_HOME", "CUDA_PATH", "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH", "TRITON_CACHE_DIR"):
        if os.environ.get(var):
            paths.append(os.environ[var])
    return [p for p in dict.fromkeys(paths) if p and os.path.realpath(p) != "/"]


def jail_spec(policy: SandboxPolicy, device: str, private: Path, uid: int | None,
               shared_dirs: tuple[Path, ...]) -> dict[str, Any]:
    limits: dict[str, int | None] = {"fsize": policy.file_bytes, "core": 0, "nproc": policy.processes}
    if device == "cpu":
        limits["as"] = policy.memory_bytes
    writable = [str(private), *map(str, shared_dirs)]
    if device == "cuda":
        writable.append("/dev/shm")  # the CUDA driver may keep shared memory there
    # `mountns` gives the child a /dev/shm of its own (`shm`), else leaves it read-only but for
    # the private directory: were the CUDA driver to need more, the probe drops the layer.
    mount_writable = [str(private), *map(str, shared_dirs)]
    want = [x for x in policy.layers if x != "uid" or uid is not None]
    if uid is None and is_root():
        want.append(ROOT_FALLBACK)
    return {
        "private_dir": str(private), "uid": uid, "gid": policy.gid if uid is not None else None,
        "want": want, "limits": limits,
        "writable_dirs": writable, "writable_files": device_files(), "mount_writable_dirs": mount_writable,
        "umask": 0o002, "hidden_dirs": hidden_dirs(), "hidden_files": list(HIDDEN_FILES),
        "visible_paths": visible_paths(private, shared_dirs), "shm_bytes": policy.shm_bytes,
    }


def read_only_triton_cache(shared: Path) -> dict[str, str]:
    """The environment of a child that reads the shared Triton cache `shared` without writing it
    (give it no shared_dirs): it compiles into a cache of its own (triton_cache.py)."""
    return {"TRITON_CACHE_MANAGER": "pipelines.profiling.triton_cache:ReadThroughCache",
            "KERNELCAST_TRITON_SHARED": str(shared)}


def prepare_shared_dir(path: Path, policy: SandboxPolicy) -> None:
    """A directory every child may write (the Triton cache root): group-owned by the sandbox gid;
    sticky, so no child renames or removes an entry it does not own (another kernel's folder)."""
    path.mkdir(parents=True, exist_ok=True)
    if is_root() and "uid" in policy.layers:
        os.chown(path, -1, policy.gid)
        os.chmod(path, 0o3775)  # setgid: entries keep the shared group; sticky: owners alone unlink


def kernel_cache_dir(root: Path, uid: int | None, gid: int) -> Path:
    """A new folder under `root` for one compile job's Triton cache, named unpredictably (no
    kernel can make it before it exists) and writable by the compile child's uid alone."""
    import secrets

    path = root / f"k-{secrets.token_hex(12)}"
    path.mkdir(mode=0o700)
    if uid is not None and is_root():
        os.chown(path, uid, gid)
    return path


def seal_dir(path: Path) -> None:
    """Make a compile job's cache folder read-only for every child: owned by us, 0755 folders and
    0644 files. What a kernel could have planted to turn our chown or chmod on something else is
    removed first: symbolic links, files with other names elsewhere (hard links), anything that is
    not a plain file or folder. Nothing is followed."""
    import stat

    mine = os.geteuid(), os.getegid()
    for top, dirs, files in os.walk(path, topdown=True, followlinks=False):
        for name in dirs + files:
            entry = os.path.join(top, name)
            try:
                st = os.lstat(entry)
                if stat.S_ISDIR(st.st_mode):
                    continue
                if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
                    os.unlink(entry)
                    continue
                os.chown(entry, *mine, follow_symlinks=False)
                os.chmod(entry, 0o644, follow_symlinks=False)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(entry)
    for top, dirs, _ in os.walk(path, topdown=False, followlinks=False):
        for name in dirs + [""]:
            entry = os.path.join(top, name) if name else top
            with contextlib.suppress(OSError):
                if not os.path.islink(entry):
                    os.chown(entry, *mine, follow_symlinks=False)
                    os.chmod(entry, 0o755)


def make_traversable(*paths: Path) -> None:
    """Let sandbox uids read the kernel files the parent writes (directories 0755)."""
    if is_root():
        for p in paths:
            os.chmod(p, 0o755)


def one_line(text: Any, limit: int = 300) -> str:
    """Collapse any message to one line of at most `limit` characters."""
    s = " | ".join(ln.strip() for ln in str(text).splitlines() if ln.strip())
    return s if len(s) <= limit else s[: limit - 3] + "..."

