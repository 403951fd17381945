"""The hand-written kernels: records, imports without a GPU, and CPU correctness on the tasks'
small correctness cases (Triton ones under the interpreter, in the sandboxed check)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from pipelines.generation import handwritten
from pipelines.tasks import TASK_MODULES, get_task
from warehouse.formats import KERNEL_BATCH_SCHEMA
from warehouse.ids import kernel_id

ROWWISE = ("softmax", "rms_norm", "layer_norm")
FILES = handwritten.kernel_files()


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module


def test_every_task_has_hand_written_kernels_in_several_styles():
    recs = handwritten.records()
    by_task: dict[str, list[dict]] = {}
    for r in recs:
        by_task.setdefault(r["task"], []).append(r)
    assert set(by_task) == set(TASK_MODULES)
    for task, rows in by_task.items():
        assert len(rows) >= (5 if task in ROWWISE else 3), task
        assert len({r["generator"] for r in rows}) == len(rows) or task not in ROWWISE
        assert any(r["generator"] == "handwritten:torch_compile" for r in rows), task
    assert sum(r["language"] == "triton" for r in recs) >= 9
    ids = [r["kernel_id"] for r in recs]
    assert len(set(ids)) == len(ids)
    for r in recs:
        assert list(r) == KERNEL_BATCH_SCHEMA.names
        assert r["kernel_id"] == kernel_id(r["source"])
        assert r["generator"].startswith("handwritten:") and r["algorithm"] is None and r["parent_kernel_id"] is None
        assert ("import triton" in r["source"]) == (r["language"] == "triton")


def test_a_module_without_style_is_refused(tmp_path):
    bad = tmp_path / "softmax" / "k.py"
    bad.parent.mkdir()
    bad.write_text("def custom_kernel(data):\n    return data\n")
    with pytest.raises(ValueError, match="STYLE"):
        handwritten.record(bad)


@pytest.mark.parametrize("path", [p for p in FILES if "torch_compile" in p.name], ids=lambda p: p.parent.name)
def test_torch_compile_kernels_import_lazily_and_are_correct_eagerly(path, monkeypatch):
    import torch

    compiled: list = []
    module = _load(path, f"hw_{path.parent.name}_{path.stem}")  # importing compiles nothing
    assert module._compiled is None
    # Inductor on this CPU takes minutes per graph: the compiled function is replaced by the
    # function itself, so this checks the code torch.compile is given, and that it is compiled
    # once, lazily
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(kw) or fn)
    task = get_task(path.parent.name)
    for case in task.correctness_cases:
        c = dict(case)
        data = task.generate_input(seed=c.pop("seed"), **c)
        ok, msg = task.check_implementation(data, module.custom_kernel(data))
        assert ok, f"{path.parent.name}/{path.name} {case}: {msg}"
    assert compiled == [{"dynamic": False}]


def test_hand_written_kernels_pass_the_cpu_check():
    from pipelines.profiling.check import check_sources

    paths = [p for p in FILES if "torch_compile" not in p.name]
    outcomes = check_sources([(p.parent.name, p.read_text()) for p in paths], n_workers=2, timeout_s=300)
    failed = [(f"{p.parent.name}/{p.name}", o.failure_kind, o.message)
              for p, o in zip(paths, outcomes, strict=True) if not o.ok]
    assert not failed, failed
