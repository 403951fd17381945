"""One self-contained kernel module from published files and our adapter.

The published files are concatenated in the manifest's order, then the adapter. The only changes
made to published code are to its imports, so that the module needs nothing but what the
measuring host has (MEASURING_HOST_PACKAGES, the standard library, and the GPU MODE modules the
harness installs):
  - an import of a file the entry also includes is removed (its names are already at module level),
    and so is an import from a package of the repository of a name one of the included files
    defines (`from fla.ops.utils import prepare_chunk_indices` with fla/ops/utils/index.py);
    `from m import a as b` leaves `b = a`, and `import m as x` / `from pkg import m` leaves
    `x = sys.modules[__name__]` (the module itself stands for the included file; the harness
    registers a kernel module in sys.modules before running it, as Triton needs);
  - an import of another package is kept where it cannot fail the import of the module (inside a
    function, under `try: ... except ImportError`, under `if TYPE_CHECKING:`), removed where no
    name it binds is used anywhere in the module, and otherwise makes the entry unusable;
  - `from __future__ import ...` lines move to the top, where Python requires them.
With `take`, only the named top-level definitions of a file (and its imports) are kept: tutorials
run their tests and benchmarks at module level.
"""

from __future__ import annotations

import ast
import builtins
import sys
from dataclasses import dataclass

from pipelines.generation.library.manifest import Entry

# Third-party packages every measuring host has: the worker's stack (torch, triton, numpy) and
# packaging, which the hosts' PyTorch images carry (the Hugging Face packages there require it).
MEASURING_HOST_PACKAGES = frozenset({"torch", "triton", "numpy", "packaging"})
# GPU MODE's `task`, `utils` and `reference` modules: the harness installs them before importing
# a kernel (pipelines.tasks.gpumode), so a GPU MODE problem's files import unmodified.
HARNESS_MODULES = frozenset({"task", "utils", "reference"})
_CATCHES_IMPORT_ERROR = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
_BUILTINS = frozenset(dir(builtins)) | {"__name__", "__file__", "__doc__", "__spec__", "__builtins__"}


class Unusable(Exception):
    """The entry cannot become a module that imports on the measuring host (one-line reason)."""


@dataclass(frozen=True)
class Assembled:
    source: str  # the module's text
    shadowed: tuple[str, ...]  # top-level names bound by more than one published file


def _available(top: str, host_packages: frozenset[str] = frozenset()) -> bool:
    return (top in MEASURING_HOST_PACKAGES or top in host_packages or top in HARNESS_MODULES
            or top in sys.stdlib_module_names)


def module_names(path: str) -> tuple[str, bool]:
    """(dotted module name, is a package __init__) of a file path in a repository.

    >>> module_names("src/liger_kernel/ops/utils.py")
    ('src.liger_kernel.ops.utils', False)
    """
    parts = path[:-3].split("/") if path.endswith(".py") else path.split("/")
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _matches(dotted: str, included: dict[str, str]) -> str | None:
    """The included file an absolute dotted import names: its full dotted path, or a suffix of
    it of at least two parts (`src/liger_kernel/ops/utils.py` is `liger_kernel.ops.utils`)."""
    for full, path in included.items():
        if dotted == full or (dotted.count(".") >= 1 and full.endswith("." + dotted)):
            return path
    return None


def _resolve_relative(node: ast.ImportFrom, this: str, is_package: bool) -> str:
    base = this.split(".") if is_package else this.split(".")[:-1]
    up = node.level - 1
    if up:
        base = base[:-up] if up <= len(base) else []
    return ".".join([*base, node.module] if node.module else base)


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str | None:
    """Why an import cannot fail the module's import ('function', 'try', 'type-checking'), or None."""
    child, node = node, parents.get(node)
    while node is not None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return "function"
        if isinstance(node, ast.Try) and child in node.body:
            for handler in node.handlers:
                caught = handler.type
                names = [caught] if not isinstance(caught, ast.Tuple) else list(caught.elts)
                if caught is None or any(isinstance(n, ast.Name) and n.id in _CATCHES_IMPORT_ERROR for n in names):
                    return "try"
        if isinstance(node, ast.If) and child in node.body:
            test = node.test
            if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                    isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
                return "type-checking"
        child, node = node, parents.get(node)
    return None


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)


def _scope_bindings(node: ast.AST) -> set[str]:
    """Names a function, lambda, class body or comprehension binds in its own scope."""
    names: set[str] = set()
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        a = node.args
        names |= {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x is not None}
        body = node.body if isinstance(node.body, list) else [node.body]
    elif isinstance(node, ast.ClassDef):
        body = node.body
    else:  # a comprehension: its targets
        return {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
    declared_global: set[str] = set()
    stack = list(body)
    while stack:
        child = stack.pop()
        if isinstance(child, ast.Global):
            declared_global.update(child.names)
        elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store | ast.Del):
            names.add(child.id)
        elif isinstance(child, ast.Import | ast.ImportFrom):
            names.update(_bound_names(a) for a in child.names if a.name != "*")
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(child.name)
            stack.extend([*child.decorator_list, *getattr(child, "bases", [])])
            continue  # its body is a scope of its own
        elif isinstance(child, ast.ExceptHandler) and child.name:
            names.add(child.name)
        if not isinstance(child, _SCOPES):
            stack.extend(ast.iter_child_nodes(child))
    return names - declared_global


def global_reads(tree: ast.AST) -> set[str]:
    """Names read somewhere in `tree` that resolve to the module's global scope (not bound by an
    enclosing function, lambda or comprehension)."""
    reads: set[str] = set()

    def visit(node: ast.AST, enclosing: tuple[frozenset[str], ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load):
                if not any(child.id in scope for scope in enclosing):
                    reads.add(child.id)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                outer = [*getattr(child, "decorator_list", []), *child.args.defaults,
                         *[d for d in child.args.kw_defaults if d is not None]]
                for expr in outer:
                    visit(ast.Expression(body=expr), enclosing)
                inner = frozenset(_scope_bindings(child))
                for stmt in child.body if isinstance(child.body, list) else [child.body]:
                    visit(ast.Module(body=[stmt], type_ignores=[]) if isinstance(stmt, ast.stmt)
                          else ast.Expression(body=stmt), (*enclosing, inner))
            elif isinstance(child, ast.ClassDef):
                for expr in [*child.decorator_list, *child.bases, *[k.value for k in child.keywords]]:
                    visit(ast.Expression(body=expr), enclosing)
                own = frozenset(_scope_bindings(child))
                for stmt in child.body:  # methods do not see the class body's names
                    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                        visit(ast.Module(body=[stmt], type_ignores=[]), enclosing)
                    else:
                        visit(ast.Module(body=[stmt], type_ignores=[]), (*enclosing, own))
            elif isinstance(child, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
                visit(child, (*enclosing, frozenset(_scope_bindings(child))))
            else:
                visit(child, enclosing)

    visit(tree, ())
    return reads


def _bound_names(alias: ast.alias) -> str:
    return alias.asname or alias.name.split(".")[0]


def top_level_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level (definitions, assignments, imports, also inside
    top-level if/try blocks)."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names.update(_bound_names(a) for a in node.names if a.name != "*")
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.For | ast.With):
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                if isinstance(node, ast.With):
                    targets = [i.optional_vars for i in node.items]
                for t in targets:
                    if t is not None:
                        names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
                if isinstance(node, ast.For | ast.With):
                    visit(node.body)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                visit(node.orelse)
                visit(node.finalbody)
                for h in node.handlers:
                    visit(h.body)

    visit(tree.body)
    return names


# ---- take: the named top-level definitions of a script -----------------------------------
def _statement_names(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def _only_imports(node: ast.stmt) -> bool:
    """An import, or an if/try made only of imports, assignments and pass (an import fallback)."""
    if isinstance(node, ast.Import | ast.ImportFrom | ast.Pass):
        return True
    if isinstance(node, ast.If | ast.Try):
        inner = [*node.body, *node.orelse, *getattr(node, "finalbody", []),
                 *[s for h in getattr(node, "handlers", []) for s in h.body]]
        return all(_only_imports(s) or isinstance(s, ast.Assign) for s in inner)
    return False


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *[d.lineno for d in decorators]])


def take_definitions(text: str, names: tuple[str, ...], where: str) -> str:
    """The imports of `text` and the top-level statements that define `names`, in file order.

    Raises:
        Unusable: a name is not defined at top level, or the taken code uses a top-level name of
            the file that was left out.
    """
    tree = ast.parse(text)
    lines = text.splitlines()
    wanted = set(names)
    kept: list[ast.stmt] = []
    found: set[str] = set()
    for node in tree.body:
        defined = _statement_names(node)
        if _only_imports(node) or defined & wanted:
            kept.append(node)
            found |= defined & wanted
    if wanted - found:
        raise Unusable(f"{where}: take names {sorted(wanted - found)}, not defined at its top level")
    module = ast.Module(body=kept, type_ignores=[])
    left_out = (top_level_names(tree) - top_level_names(module)) & (global_reads(module) - _BUILTINS)
    if left_out:
        raise Unusable(f"{where}: the taken code uses {sorted(left_out)}, which take leaves out")
    return "\n\n".join("\n".join(lines[_first_line(n) - 1:n.end_lineno]) for n in kept) + "\n"


# ---- imports ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Edit:
    first: int  # 1-based line numbers of the statement
    last: int
    indent: str
    replacement: list[str]  # lines without indentation; [] = remove


def _inside_included_package(base: str, included: dict[str, str]) -> bool:
    """Whether `base` names a package holding an included file (`fla.ops.utils` for
    fla/ops/utils/index.py): a name imported from it is one of its files' names re-exported."""
    return bool(base) and any(full.startswith(base + ".") or f".{base}." in full for full in included)


def _import_edits(text: str, path: str, included: dict[str, str], provided: set[str],
                  used: set[str], host_packages: frozenset[str] = frozenset()) -> tuple[list[_Edit], set[str]]:
    """The edits to one file's import statements, and the `from __future__` features it asks for.

    Raises:
        Unusable: a used import of a package the measuring host lacks, or an import form that
            cannot be rewritten.
    """
    tree = ast.parse(text)
    parents = _parents(tree)
    this, is_package = module_names(path)
    lines = text.splitlines()
    edits: list[_Edit] = []
    future: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        where = f"{path}:{node.lineno}"
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            future.update(a.name for a in node.names)
            edits.append(_edit(node, lines, [], where))
            continue
        kept: list[ast.alias] = []
        extra: list[str] = []
        for alias in node.names:
            if isinstance(node, ast.ImportFrom):
                base = _resolve_relative(node, this, is_package) if node.level else node.module or ""
                target_module = _matches(f"{base}.{alias.name}", included)
                target_from = _matches(base, included) if node.level == 0 else included_relative(base, included)
                if target_from is None and alias.name in provided and _inside_included_package(base, included):
                    target_from = base  # re-exported by the package from an included file
                if target_module is not None:  # `from pkg import module`: the module is this one
                    extra.append(f"{alias.asname or alias.name} = __import__('sys').modules[__name__]")
                elif target_from is not None:  # `from module import name`: the name is already here
                    if alias.name == "*":
                        continue
                    if alias.asname and alias.asname != alias.name:
                        extra.append(f"{alias.asname} = {alias.name}")
                elif _foreign(base, node.level, alias, node, parents, used, where, host_packages):
                    kept.append(alias)
            else:
                if _matches(alias.name, included) is not None:
                    if not alias.asname:
                        raise Unusable(f"{where}: `import {alias.name}` of an included file cannot be rewritten")
                    extra.append(f"{alias.asname} = __import__('sys').modules[__name__]")
                elif _foreign(alias.name, 0, alias, node, parents, used, where, host_packages):
                    kept.append(alias)
        if len(kept) == len(node.names) and not extra:
            continue  # untouched: keep the published formatting
        statement: list[str] = []
        if kept:
            names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in kept)
            if isinstance(node, ast.ImportFrom):
                statement = [f"from {'.' * node.level}{node.module or ''} import {names}"]
            else:
                statement = [f"import {names}"]
        edits.append(_edit(node, lines, statement + extra, where))
    return edits, future


def included_relative(base: str, included: dict[str, str]) -> str | None:
    """The included file a resolved relative import names (its full dotted path only)."""
    for full, path in included.items():
        if base == full:
            return path
    return None


def _foreign(base: str, level: int, alias: ast.alias, node: ast.stmt, parents, used: set[str], where: str,
             host_packages: frozenset[str] = frozenset()) -> bool:
    """Whether to keep an import of something the entry does not include: True when it cannot fail
    the module's import (an available package, or guarded), False when nothing reads what it binds.

    Raises:
        Unusable: an unguarded import of a missing package (or of a repository file the entry
            leaves out) whose name the module reads, or a star import of one.
    """
    top = "" if level else base.split(".")[0]
    if (top and _available(top, host_packages)) or _guarded(node, parents) is not None:
        return True
    bound = alias.asname or (alias.name if isinstance(node, ast.ImportFrom) else alias.name.split(".")[0])
    if bound != "*" and bound not in used:
        return False
    what = f"{'.' * level}{base}" if isinstance(node, ast.ImportFrom) else alias.name
    why = "a file of the repository the entry does not include" if level or not top else "not on the measuring host"
    raise Unusable(f"{where}: imports {what} ({why}) and uses {bound}")


def _edit(node: ast.stmt, lines: list[str], replacement: list[str], where: str) -> _Edit:
    first, last = node.lineno, node.end_lineno
    head, tail = lines[first - 1][: node.col_offset], lines[last - 1][node.end_col_offset:]
    if head.strip() or (tail.strip() and not tail.strip().startswith("#")):
        raise Unusable(f"{where}: an import shares its line with other code; cannot rewrite it")
    if not replacement and node.col_offset:
        replacement = ["pass"]  # a block must keep a statement
    return _Edit(first, last, head, replacement)


def _apply(text: str, edits: list[_Edit]) -> str:
    lines = text.splitlines()
    for e in sorted(edits, key=lambda e: e.first, reverse=True):
        lines[e.first - 1:e.last] = [e.indent + r for r in e.replacement]
    return "\n".join(lines) + "\n"


def _strip_future(text: str) -> tuple[str, set[str]]:
    tree = ast.parse(text)
    lines = text.splitlines()
    future = {a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__" for a in n.names}
    edits = [_edit(n, lines, [], "adapter") for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    return _apply(text, edits), future


# ---- the module ------------------------------------------------------------------------------
def _parse(text: str, where: str) -> ast.Module:
    try:
        return ast.parse(text)
    except SyntaxError as exc:
        raise Unusable(f"{where}: does not parse ({exc.msg}, line {exc.lineno})") from None


def _header(entry: Entry) -> str:
    files = ", ".join(entry.paths)
    return (
        f'"""{entry.task} kernel of the library set: entry {entry.id} ({entry.kind}).\n\n'
        f"Published code of {entry.repo} at commit {entry.commit} ({entry.license}): {files},\n"
        "read from a fetched copy of that repository; only its imports are rewritten so that this one\n"
        "module holds it all. Below it, kernelcast's adapter gives it the task's custom_kernel(data).\n"
        '"""\n'
    )


def _banner(text: str) -> str:
    return f"# ---- {text} " + "-" * max(4, 96 - len(text))


def assemble(entry: Entry, files: dict[str, str], adapter: str,
             host_packages: frozenset[str] = frozenset()) -> Assembled:
    """The kernel module of `entry` from its published `files` (path -> text) and `adapter` text;
    `host_packages` names packages the measuring host has beyond MEASURING_HOST_PACKAGES.

    Raises:
        Unusable: a file does not parse, an import cannot be satisfied on the measuring host, a
            `take` or `calls` name is missing, or the adapter defines no custom_kernel.
    """
    texts: dict[str, str] = {}
    for path in entry.paths:
        _parse(files[path], path)
        texts[path] = take_definitions(files[path], entry.take[path], path) if path in entry.take else files[path]
    adapter_tree = _parse(adapter, f"adapter {entry.adapter.name}")
    if "custom_kernel" not in top_level_names(adapter_tree):
        raise Unusable(f"adapter {entry.adapter.name} defines no custom_kernel(data)")
    included = {module_names(p)[0]: p for p in entry.paths}
    used = global_reads(adapter_tree).union(*(global_reads(ast.parse(t)) for t in texts.values()))
    future: set[str] = set()
    parts: list[str] = []
    bound_by: dict[str, list[str]] = {}
    provided = set().union(*(top_level_names(ast.parse(t)) for t in texts.values()))
    for path, text in texts.items():
        edits, wanted = _import_edits(text, path, included, provided, used, host_packages)
        future |= wanted
        rewritten = _apply(text, edits)
        for name in top_level_names(_parse(rewritten, path)):
            bound_by.setdefault(name, []).append(path)
        parts.append(_banner(f"{entry.repo}@{entry.commit[:12]}: {path}") + "\n" + rewritten.rstrip("\n") + "\n")
    missing = [c for c in entry.calls if c not in bound_by]
    if missing:
        raise Unusable(f"calls {missing}: not defined at the top level of {', '.join(entry.paths)}")
    adapter_text, adapter_future = _strip_future(adapter)
    future |= adapter_future
    head = _header(entry) + (f"from __future__ import {', '.join(sorted(future))}\n" if future else "")
    body = "\n\n".join([*parts, _banner(f"kernelcast adapter: {entry.id}") + "\n" + adapter_text.strip("\n") + "\n"])
    source = head + "\n" + body
    _parse(source, f"assembled module {entry.id}")
    shadowed = tuple(sorted(n for n, paths in bound_by.items() if len(paths) > 1 and not _is_import_only(n, texts)))
    return Assembled(source=source, shadowed=shadowed)


def _is_import_only(name: str, texts: dict[str, str]) -> bool:
    """True when every file binds `name` only by importing it (e.g. `torch`): no real clash."""
    for text in texts.values():
        for node in ast.parse(text).body:
            if name in _statement_names(node):
                return False
    return True
