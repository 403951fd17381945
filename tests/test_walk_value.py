"""scripts/walk_value.py's tracer: a value handed through two tiny functions of this file is found
in each of them, in call order, through the argument that holds it, and nowhere else."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[1]
NEEDLE = "kernel-0123456789abcdef"


@pytest.fixture(scope="module")
def walk_value():
    spec = importlib.util.spec_from_file_location("walk_value", ROOT / "scripts" / "walk_value.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def label(ids: list[str]) -> pl.DataFrame:
    """The first tiny function: a frame of the ids it is given."""
    return pl.DataFrame({"kernel_id": ids, "n": list(range(len(ids)))})


def count(frame: pl.DataFrame, other: str) -> int:
    """The second: it receives the frame (holding the value in a column) and an unrelated string."""
    return frame.height + len(other)


def untouched(text: str) -> int:
    """Called with another value only: must not be recorded."""
    return len(text)


def test_the_value_is_followed_through_two_functions(walk_value):
    project = walk_value.Project(ROOT, floors=("tests",))
    with walk_value.ValueTracer({"id": NEEDLE}, project) as tracer:
        frame = label(["other", NEEDLE])
        untouched("nothing to see")
        assert count(frame, "unrelated") == 11
    got = [(c.function, c.arguments, c.file, c.room) for c in tracer.calls]
    here = "tests/test_walk_value.py"
    assert got == [("label", ("ids (item)",), here, "tests"),
                   ("count", ("frame (column kernel_id)",), here, "tests")]
    s = walk_value.summary(tracer.calls)
    assert s["functions"] == 2 and s["files"] == {here: 2} and s["rooms"] == {"tests": 2}
    assert sys.gettrace() != tracer._on_call  # no tracer is left behind


def test_a_value_never_passed_is_not_found(walk_value):
    with walk_value.ValueTracer({"id": "absent"}, walk_value.Project(ROOT, floors=("tests",))) as tracer:
        count(label(["other", NEEDLE]), NEEDLE)
    assert tracer.calls == [] and tracer.functions_seen >= 2


@pytest.mark.parametrize(("obj", "how"), [
    (NEEDLE, "equal"), ([1, (NEEDLE,)], "item: item"), ({NEEDLE: 1}, "key"), ({"a": [NEEDLE]}, "item: item"),
    (pl.DataFrame({"ids": [["x", NEEDLE]]}), "column ids"), ("x" + NEEDLE, None), ([[[[NEEDLE]]]], None),
])
def test_what_holds_the_value(walk_value, obj, how):
    assert walk_value.holds(obj, NEEDLE) == how


def test_rooms_are_the_packages_of_the_floors(walk_value):
    project = walk_value.Project(ROOT)
    assert project.place(str(ROOT / "pipelines" / "curation" / "pairs.py")).room == "pipelines.curation"
    assert project.place(str(ROOT / "warehouse" / "ingest.py")).room == "warehouse"
    assert project.place(str(ROOT / "models" / "registry" / "versions.py")).room == "models.registry"
    assert project.place(str(ROOT / "tests" / "test_walk_value.py")) is None
    assert project.place("/usr/lib/python3/json/__init__.py") is None
