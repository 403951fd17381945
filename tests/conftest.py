"""Shared test setup: CPU hosts run Triton kernels through its interpreter; state goes to tmp;
rendered kernels are imported from files; each test process (pytest-xdist) keeps to its share of
the cores."""

import gc
import hashlib
import os

import pytest
import torch

if not torch.cuda.is_available():
    # Must be set before any @triton.jit function is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")

    from pipelines.tasks.interpreter_fixes import patch_triton_interpreter

    patch_triton_interpreter()  # bf16 tl.dot is wrong in Triton 3.6's interpreter

# skops (MLflow's format for the classical forecasters) scans every loaded module on its first
# import; after transformers is loaded that scan imports transformers' lazy submodules and takes
# seconds instead of well under one (models.classical.registry.import_serializer). A test process
# runs tests of both, in whatever order the files come: import it first, as `kernelcast run` does.
from models.classical.registry import import_serializer  # noqa: E402

import_serializer()

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    THREADS = max(1, (os.cpu_count() or 1) // _WORKERS)
    # torch sizes its pool to every core; N test processes doing so each make N times too many
    # threads and spend the cores switching between them.
    torch.set_num_threads(THREADS)
    # The same for the children (OpenMP reads it at start: torch, scikit-learn): two threads of
    # a child on two loaded cores spin at every barrier for a descheduled partner (the GPU job's
    # test took 231 s instead of 70 s beside one busy core).
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))


def pytest_configure(config):
    """pytest-xdist's --dist loadfile hands out the files in the order of the collection
    (pytest_collection_modifyitems below), not re-sorted by their number of tests: its default
    (--loadscope-reorder) put the files of many quick parametrized tests first and left long
    files for the end."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Side by side (pytest-xdist hands out whole files in this order), the files that hold a
    `slow` test go first and the quick ones fill in behind them: a long file handed out last
    would leave the other processes idle while it runs. One process keeps the files' order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)  # stable: a file's tests keep their order


@pytest.fixture(autouse=True)
def frozen_heap():
    """Everything the test process held before this test (the libraries, the fixtures, what earlier
    tests left) frozen while it runs: a full collection, which every kernel unload makes
    (pipelines.profiling.kernel_loading.unload_kernel), then scans only what the test made. The
    measuring child freezes its baseline heap the same way (start_watch); a test process that ran
    Dagster, MLflow and transformers before measuring in process holds many times that heap, and
    each collection scanned it all (tests/profiling/test_fresh_values.py: 35 s in a whole run,
    4 s alone). What the test makes is collected as before; the rest is unfrozen after it."""
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(scope="session", autouse=True)
def isolated_home(tmp_path_factory):
    """A state folder of this test process, for the tests that do not make their own: nothing
    lands in the checkout's .kernelcast or in a home named by the environment, and processes
    running side by side do not share one."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNELCAST_HOME", str(tmp_path_factory.mktemp("kernelcast-home")))
        yield


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


@pytest.fixture()
def small_data(tmp_path):
    """A data folder with two of the committed H200 files (run B and its kernels): a whole run on
    real measurements in a fraction of the time the full set takes, for the tests that need a
    run but not the size of the committed data."""
    import shutil
    from pathlib import Path

    source = Path(__file__).resolve().parent.parent / "data" / "measurements" / "h200"
    data = tmp_path / "data"
    (data / "measurements" / "h200").mkdir(parents=True)
    for name in ("kernels-2026-11-29-harness1.parquet", "results-2026-11-29-harness1-run-b.parquet"):
        shutil.copy(source / name, data / "measurements" / "h200" / name)
    return data
