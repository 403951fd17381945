"""One forecaster type: every class of the product named *Forecaster descends from
pipelines.forecasting.base.PairForecaster, the interface the evaluation, the search and the
command line share, except the ones listed below, which are what remains of the older types.

The list may only shrink: a new *Forecaster class outside the one base fails here, and so does
an entry whose class is gone (delete the entry with the class). Classes are read from the
source (ast), as tests/test_import_structure.py reads imports, so nothing heavy is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_import_structure import _absolute, project_modules

BASE = ("pipelines.forecasting.base", "PairForecaster")

# module -> classes named *Forecaster allowed outside the one base, each with why it remains.
# Empty: the search's copies of the references and its protocol, the LLM backends (prompt
# answerers), the scikit-learn base (BinClassifier), the listing record (ForecasterListing) and
# the source reader (SourceForecaster, now a PairForecaster) are gone, renamed or folded in.
ALLOWED: dict[str, set[str]] = {}


def _bases(node: ast.ClassDef) -> list[str]:
    """The dotted names a class's bases are written as (`Base`, `base.PairForecaster`)."""
    out = []
    for b in node.bases:
        parts = []
        while isinstance(b, ast.Attribute):
            parts.append(b.attr)
            b = b.value
        if isinstance(b, ast.Name):
            out.append(".".join([b.id, *reversed(parts)]))
    return out


def _bindings(tree: ast.Module, module: str, is_package: bool) -> dict[str, str]:
    """Local name -> the dotted name it was imported as (module-level imports only)."""
    names = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:  # import a.b as c: c is a.b
                    names[alias.asname] = alias.name
                else:  # import a.b: a is a
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, is_package)
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
    return names


def classes(sources: dict[str, tuple[str, bool]]) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(module, class) -> its bases as (module, class), for every top-level class of `sources`
    (module -> (text, is a package)). A base resolves through the module's imports; one that
    resolves to no class of the sources keeps its dotted name as (name, "")."""
    found: dict[tuple[str, str], list[str]] = {}
    bindings = {}
    for module, (text, is_package) in sources.items():
        tree = ast.parse(text)
        bindings[module] = _bindings(tree, module, is_package)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                found[(module, node.name)] = _bases(node)

    def resolve(module: str, written: str) -> tuple[str, str]:
        head, _, rest = written.partition(".")
        if not rest and (module, head) in found:
            return module, head
        dotted = bindings[module].get(head, head) + (f".{rest}" if rest else "")
        target_module, _, name = dotted.rpartition(".")
        if (target_module, name) in found:
            return target_module, name
        # a package re-exporting the class (e.g. pipelines.forecasting's lazy names): one class by that name
        same = [k for k in found if k[1] == name]
        return same[0] if len(same) == 1 else (dotted, "")

    return {key: [resolve(key[0], b) for b in written] for key, written in found.items()}


def outside_the_base(sources: dict[str, tuple[str, bool]]) -> set[tuple[str, str]]:
    """(module, class) of every class named *Forecaster that does not descend from BASE."""
    graph = classes(sources)
    memo: dict[tuple[str, str], bool] = {}

    def descends(key: tuple[str, str], seen: frozenset = frozenset()) -> bool:
        if key == BASE:
            return True
        if key not in graph or key in seen:
            return False
        if key not in memo:
            memo[key] = any(descends(b, seen | {key}) for b in graph[key])
        return memo[key]

    return {k for k in graph if k[1].endswith("Forecaster") and k != BASE and not descends(k)}


def _product() -> dict[str, tuple[str, bool]]:
    return {m: (Path(p).read_text(), Path(p).name == "__init__.py") for m, p in project_modules().items()}


def test_every_forecaster_is_the_one_type_or_listed():
    allowed = {(m, c) for m, names in ALLOWED.items() for c in names}
    new = sorted(outside_the_base(_product()) - allowed)
    assert not new, ("forecaster classes outside pipelines.forecasting.base.PairForecaster (subclass it, "
                     "or delete the class):\n" + "\n".join(f"{m}.{c}" for m, c in new))


def test_the_list_only_names_classes_that_remain_outside():
    """An entry whose class is gone, or now descends from the base, is taken off the list."""
    product = _product()
    graph, outside = classes(product), outside_the_base(product)
    listed = sorted((m, c) for m, names in ALLOWED.items() for c in names)
    stale = [f"{m}.{c} ({'gone' if (m, c) not in graph else 'now a PairForecaster'})"
             for m, c in listed if (m, c) not in outside]
    assert not stale, "shrink ALLOWED:\n" + "\n".join(stale)


def test_the_adapters_are_seen_as_the_one_type():
    """The walk recognises the base through imports (the references, the language adapter)."""
    graph = classes(_product())
    inside = set(graph) - outside_the_base(_product())
    assert {("pipelines.forecasting.references", "UniformForecaster"),
            ("pipelines.forecasting.sources", "SourceForecaster"),
            ("pipelines.forecasting.base", "RecordsForecaster"),
            ("pipelines.forecasting.language", "LanguageForecaster"),
            ("pipelines.forecasting.classical", "ClassicalForecaster")} <= inside


def test_a_second_base_is_caught():
    """Made-up modules: a new base and its subclass are flagged, subclasses of the one base
    (directly, through a module alias or through another subclass) are not."""
    made_up = {
        "pipelines.forecasting.base": ("class PairForecaster:\n    pass\n", False),
        "pipelines.x": ("from pipelines.forecasting.base import PairForecaster\n"
                        "class GoodForecaster(PairForecaster):\n    pass\n"
                        "class AlsoGoodForecaster(GoodForecaster):\n    pass\n", False),
        "pipelines.y": ("from pipelines.forecasting import base\n"
                        "class AliasForecaster(base.PairForecaster):\n    pass\n"
                        "class NewForecaster:\n    pass\n"
                        "class ChildForecaster(NewForecaster):\n    pass\n", False),
    }
    assert outside_the_base(made_up) == {("pipelines.y", "NewForecaster"), ("pipelines.y", "ChildForecaster")}
