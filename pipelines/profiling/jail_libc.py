"""The C library as the jail's layers call it (ctypes), and the text of the last error it set.

Every layer of jail.py makes raw system calls (unshare, mount, prctl, capset, Landlock's); they share
this one handle, and the prctl option that both the jail and Landlock set. Standard library only:
the jail runs before anything else is set up.
"""

from __future__ import annotations

import ctypes
import os

PR_SET_NO_NEW_PRIVS = 38  # prctl: set by the jail, required by Landlock and seccomp


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _errno_text() -> str:
    return os.strerror(ctypes.get_errno())
