"""Shared test setup: CPU hosts run Triton kernels through its interpreter; state goes to tmp;
rendered kernels are imported from files."""

import hashlib
import os

import pytest
import torch

if not torch.cuda.is_available():
    # Must be set before any @triton.jit function is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")

    from pipelines.tasks.interpreter_fixes import patch_triton_interpreter

    patch_triton_interpreter()  # bf16 tl.dot is wrong in Triton 3.6's interpreter


@pytest.fixture(scope="session")
def load_kernel(tmp_path_factory):
    """A function that writes a rendered kernel source to a file and imports it (triton.jit reads
    a kernel's source from its file)."""
    from pipelines.profiling.taskload import module_from_file

    directory = tmp_path_factory.mktemp("kernels")

    def load(source: str):
        name = "kc_kernel_" + hashlib.sha256(source.encode()).hexdigest()[:16]
        path = directory / f"{name}.py"
        path.write_text(source)
        return module_from_file(path, name)

    return load


@pytest.fixture(scope="module")
def toy():
    """The toy search space of tests/search_toy.py (known speedups), registered for one module;
    its measured table."""
    import search_toy

    search_toy.install()
    yield search_toy.toy_table()
    search_toy.uninstall()
