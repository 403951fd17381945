"""The import structure of the product: imports only run down the floors of docs/architecture.md
and no project module reaches itself through other modules. Imports inside functions count as much
as top-level ones: an import moved into a function still makes the arrow, it only hides it from
the interpreter.

Counted in imports, the assets stand on orchestration's resources, partitions and settings (every
asset takes a resource), and the code location (orchestration/definitions.py) collects the assets:
that is the one arrow allowed up; the CLI, the runner and the rest of orchestration reach assets
only through the code location.

The benchmarks, demos and fuzzers (benchmarks/) stand on top of every floor: they may import the
product, nothing in the product may import them.

Within pipelines/ the rooms stand in the order of the data's walk (ROOMS, lowest first): a room
imports only the rooms below it, so none reaches another through a circle of rooms."""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
FLOORS = ("benchmarks", "assets", "orchestration", "pipelines", "models", "warehouse")
# The rooms of pipelines/, lowest first: the order the data walks (docs/architecture.md).
ROOMS = ("pipelines.tasks", "pipelines.profiling", "pipelines.generation", "pipelines.curation",
         "pipelines.surrogates", "pipelines.forecasting", "pipelines.evaluation", "pipelines.promotion",
         "pipelines.search")
# The one arrow that may run up: the code location's Definitions collect the assets.
ALLOWED_UP = {("orchestration.definitions", "assets")}
# The GPU worker and the task contracts run on bare hosts: these packages reach, among project
# modules, only each other and the definitions the worker shares with the warehouse (kernel ids and
# the file formats, stdlib and pyarrow only); everything they reach needs only the worker's stack.
# The benchmarks a GPU host runs beside the worker are held to the same stack.
BARE = ("pipelines.profiling", "pipelines.tasks", "benchmarks.call_times", "benchmarks.fault_injection",
        "benchmarks.harness_bench", "benchmarks.independent_timing", "benchmarks.profiling", "benchmarks.protocol_bench",
        "benchmarks.third_party_batch")
BARE_SHARED = ("warehouse.ids", "warehouse.formats", "warehouse.bin_edges", "warehouse.fingerprint")
BARE_THIRD_PARTY = {"numpy", "torch", "triton", "pyarrow"}


@dataclass(frozen=True)
class Arrow:
    source: str
    target: str
    line: int
    in_function: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    found = {}
    for floor in FLOORS:
        for path in sorted((ROOT / floor).rglob("*.py")):
            found[module_name(path)] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module an imported dotted name lands in (the longest prefix that is one)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    drop = node.level - 1 if is_package else node.level
    base = base[: len(base) - drop] if drop else base
    return ".".join([*base, node.module] if node.module else base)


def _imported_names(tree: ast.AST, module: str, is_package: bool):
    """(dotted name, line, inside a function) for every import statement of a module."""
    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, child.lineno, in_function
            elif isinstance(child, ast.ImportFrom):
                base = _absolute(child, module, is_package)
                for alias in child.names:
                    # `from pkg import sub` names the submodule when there is one
                    yield f"{base}.{alias.name}", child.lineno, in_function
            yield from visit(child, inner)
    yield from visit(tree, False)


def import_graph() -> tuple[dict[str, Path], list[Arrow], dict[str, set[str]]]:
    """Project modules, arrows between them, and the top-level packages each one imports."""
    modules = project_modules()
    arrows, external = [], {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        external[name] = set()
        for dotted, line, in_function in _imported_names(tree, name, path.name == "__init__.py"):
            target = _resolve(dotted, modules)
            if target is None:
                external[name].add(dotted.split(".")[0])
            elif target != name:
                arrows.append(Arrow(name, target, line, in_function))
    return modules, arrows, external


def floor(module: str) -> int:
    return FLOORS.index(module.split(".")[0])


def upward(arrows: list[Arrow]) -> list[Arrow]:
    return [a for a in arrows if floor(a.target) < floor(a.source)
            and not any(a.source == s and a.target.startswith(t) for s, t in ALLOWED_UP)]


def room(module: str) -> int | None:
    """The place of a module's room in ROOMS; None outside the rooms (pipelines.sharding, the other floors)."""
    return next((i for i, r in enumerate(ROOMS) if module == r or module.startswith(r + ".")), None)


def up_the_rooms(arrows: list[Arrow]) -> list[Arrow]:
    """Arrows from a room of pipelines/ to a room above it."""
    return [a for a in arrows if (s := room(a.source)) is not None and (t := room(a.target)) is not None and t > s]


def circles(arrows: list[Arrow]) -> list[list[str]]:
    graph = nx.DiGraph((a.source, a.target) for a in arrows)
    return [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]


def summary() -> dict[str, int]:
    """The counts a reviewer reads off the structure (printed by `python tests/test_import_structure.py`)."""
    modules, arrows, _ = import_graph()
    edges = {(a.source, a.target) for a in arrows}
    return {"modules": len(modules), "arrows": len(edges),
            "upward arrows": len({(a.source, a.target) for a in upward(arrows)}),
            "arrows up the rooms": len({(a.source, a.target) for a in up_the_rooms(arrows)}),
            "circles": len(circles(arrows)), "imports inside functions": sum(a.in_function for a in arrows)}


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_graph_sees_the_product(graph):
    modules, arrows, _ = graph
    assert "pipelines.profiling.worker" in modules and "orchestration.cli" in modules
    assert any(a.source == "orchestration.definitions" for a in arrows)
    assert "benchmarks.fault_injection" in modules


def test_no_circles(graph):
    found = circles(graph[1])
    assert not found, "import circles among project modules:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_imports_only_run_down_the_floors(graph):
    bad = upward(graph[1])
    assert not bad, "upward imports:\n" + "\n".join(
        f"{a.source}:{a.line} -> {a.target}{' (inside a function)' if a.in_function else ''}" for a in bad)


def test_the_rooms_are_every_package_of_pipelines():
    packages = {f"pipelines.{p.name}" for p in (ROOT / "pipelines").iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(ROOMS), f"ROOMS lacks {sorted(packages - set(ROOMS))}, names {sorted(set(ROOMS) - packages)}"


def test_imports_only_run_down_the_rooms_of_pipelines(graph):
    bad = up_the_rooms(graph[1])
    assert not bad, "imports up the rooms of pipelines (" + " < ".join(ROOMS) + "):\n" + "\n".join(
        f"{a.source}:{a.line} -> {a.target}{' (inside a function)' if a.in_function else ''}" for a in bad)


def test_bare_packages_need_only_the_worker_stack(graph):
    _, arrows, external = graph
    reached = {a.source for a in arrows if a.source.startswith(BARE)} | set(BARE_SHARED)
    bad = [f"{a.source}:{a.line} -> {a.target}" for a in arrows
           if a.source in reached and not a.target.startswith(BARE) and a.target not in BARE_SHARED]
    allowed = set(sys.stdlib_module_names) | BARE_THIRD_PARTY | {"__future__"}
    bad += [f"{m} -> {pkg}" for m in sorted(reached) for pkg in sorted(external.get(m, set()) - allowed)]
    assert not bad, "the worker's packages reach beyond stdlib, numpy, torch, triton, pyarrow:\n" + "\n".join(bad)


def test_a_circle_and_an_upward_arrow_are_caught():
    """The checks can fail: a made-up graph with a circle hidden in a function and an arrow up."""
    made_up = [Arrow("pipelines.a", "pipelines.b", 1, False), Arrow("pipelines.b", "pipelines.a", 9, True),
               Arrow("warehouse.db", "models.bins", 3, False),
               Arrow("orchestration.definitions", "assets.training", 5, False),
               Arrow("orchestration.runner", "assets.profiling", 7, True),
               Arrow("pipelines.profiling.runner", "benchmarks.call_times", 2, False)]
    assert circles(made_up) == [["pipelines.a", "pipelines.b"]]
    assert [(a.source, a.target) for a in upward(made_up)] == [("warehouse.db", "models.bins"),
                                                               ("orchestration.runner", "assets.profiling"),
                                                               ("pipelines.profiling.runner", "benchmarks.call_times")]


def test_an_arrow_up_the_rooms_is_caught():
    """An import from a lower room to a higher one is caught, inside a function too; arrows down
    the rooms, within a room, or to a module outside the rooms are not."""
    made_up = [Arrow("pipelines.surrogates.classical", "pipelines.forecasting.pyfunc", 4, True),
               Arrow("pipelines.evaluation.report", "pipelines.promotion.summary", 8, False),
               Arrow("pipelines.promotion.summary", "pipelines.evaluation.decisions", 2, False),
               Arrow("pipelines.forecasting.plan", "pipelines.forecasting.references", 3, False),
               Arrow("pipelines.forecasting.llm_shards", "pipelines.sharding", 5, False),
               Arrow("pipelines.tasks", "warehouse.ids", 6, False)]
    assert [(a.source, a.target) for a in up_the_rooms(made_up)] == [
        ("pipelines.surrogates.classical", "pipelines.forecasting.pyfunc"),
        ("pipelines.evaluation.report", "pipelines.promotion.summary")]


if __name__ == "__main__":
    for key, value in summary().items():
        print(f"{key}: {value}")
