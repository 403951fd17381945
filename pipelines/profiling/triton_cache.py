"""A Triton cache that reads a shared folder without writing it, for the measuring child.

Each compile job writes its kernel's Triton cache into a folder of its own under the worker's
cache root (worker.py seals it, read-only, when the job is done); the measuring child only needs
what was compiled for the kernel it measures. It reads that kernel's folder (set per job) and
writes what it compiles itself into a cache of its own (TRITON_CACHE_DIR, in its private
directory), through Triton's documented hook for a cache manager:

    TRITON_CACHE_MANAGER=pipelines.profiling.triton_cache:ReadThroughCache
    TRITON_CACHE_DIR=<private cache>   KERNELCAST_TRITON_SHARED=<the kernel's folder, read-only>

So no kernel, compiled or measured, can leave a compiled kernel or a launcher library for
another kernel to load. `sandbox.read_only_triton_cache` builds that environment.
"""

from __future__ import annotations

import json
import os

from triton.runtime.cache import FileCacheManager

SHARED_ENV = "KERNELCAST_TRITON_SHARED"


class ReadThroughCache(FileCacheManager):
    """Triton's file cache in TRITON_CACHE_DIR, falling back to the same key in the folder named
    by KERNELCAST_TRITON_SHARED when an entry is not there; writes never go to the shared one."""

    def __init__(self, key, override=False, dump=False):
        super().__init__(key, override=override, dump=dump)
        shared = os.environ.get(SHARED_ENV)
        self.shared_dir = os.path.join(shared, key) if shared and not (override or dump) else None

    def get_file(self, filename):
        mine = super().get_file(filename)
        if mine is not None or self.shared_dir is None:
            return mine
        path = os.path.join(self.shared_dir, filename)
        return path if os.path.isfile(path) else None

    def get_group(self, filename):
        mine = super().get_group(filename)
        if mine is not None or self.shared_dir is None:
            return mine
        try:
            with open(os.path.join(self.shared_dir, f"__grp__{filename}")) as f:
                paths = json.load(f).get("child_paths")
        except (OSError, ValueError, AttributeError):
            return None
        if not isinstance(paths, dict):
            return None
        # A group file names its members by path: only those inside this entry's shared folder.
        inside = {c: p for c, p in paths.items() if isinstance(p, str)
                  and os.path.dirname(os.path.realpath(p)) == os.path.realpath(self.shared_dir)}
        return {c: p for c, p in inside.items() if os.path.isfile(p)}
