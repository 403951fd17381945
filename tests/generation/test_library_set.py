"""The library set: a manifest of published files at pinned commits, assembled at run time into a
folder outside the repository. The repositories here are tiny git repositories the tests write
themselves (our own code), so the assembly, the batch file, the skip reasons and the refusal of
an output folder inside the checkout are checked end to end without fetching anything."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.curation.splits import is_external_generator
from pipelines.generation.library import assemble, build, check, manifest
from pipelines.generation.library.__main__ import main
from pipelines.tasks import TASK_MODULES, get_task
from warehouse.formats import KERNEL_BATCH_SCHEMA
from warehouse.ids import kernel_id

CHECKOUT = Path(__file__).resolve().parents[2]

# A two-file "library": helpers first, then the kernel that imports them three ways. The unused
# import of a package no host has must go; the __future__ import must end up first.
HELPERS = '''"""Row statistics."""
from __future__ import annotations

import torch
import not_a_package_anywhere  # imported, never used


def row_max(x):
    return x.max(dim=-1, keepdim=True).values


SHIFT = 0.0
'''
KERNEL = '''"""A softmax over rows, in plain PyTorch."""
import torch

from tinylib.helpers import row_max as _max
from . import helpers as h
from tinylib import SHIFT


def softmax_rows(x):
    z = (x.float() - _max(x.float()) - h.SHIFT - SHIFT).exp()
    return z / z.sum(dim=-1, keepdim=True)


print("this runs at import, as scripts do")
'''
ADAPTER = '''"""Adapter of the tiny softmax: bf16 out."""
# ruff: noqa: F821
from __future__ import annotations


def custom_kernel(data):
    (x,) = data
    return softmax_rows(x).to(x.dtype)
'''


def _git(*args: str, cwd: Path) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture()
def fetched(tmp_path: Path) -> tuple[Path, str]:
    """(folder of fetched repositories holding a bare copy of test-owner/tinylib, its commit)."""
    work = tmp_path / "work"
    (work / "tinylib").mkdir(parents=True)
    (work / "tinylib" / "__init__.py").write_text("from tinylib.helpers import SHIFT\n")
    (work / "tinylib" / "helpers.py").write_text(HELPERS)
    (work / "tinylib" / "kernel.py").write_text(KERNEL)
    _git("init", "-q", cwd=work)
    _git("add", ".", cwd=work)
    _git("commit", "-q", "-m", "tiny library", cwd=work)
    commit = _git("rev-parse", "HEAD", cwd=work)
    repos = tmp_path / "repos"
    repos.mkdir()
    _git("clone", "-q", "--bare", str(work), str(repos / "test-owner+tinylib" / "repo"), cwd=tmp_path)
    return repos, commit


def _manifest(folder: Path, commit: str, extra: str = "", adapter: str = ADAPTER) -> Path:
    (folder / "adapters").mkdir(parents=True, exist_ok=True)
    (folder / "adapters" / "tiny_softmax.py").write_text(adapter)
    path = folder / "manifest.toml"
    path.write_text(f'''
[[entry]]
id = "tiny-softmax"
task = "softmax"
repo = "test-owner/tinylib"
commit = "{commit}"
paths = ["tinylib/helpers.py", "tinylib/kernel.py"]
take = {{ "tinylib/kernel.py" = ["softmax_rows"] }}
calls = ["softmax_rows", "row_max"]
language = "pytorch"
license = "MIT"
kind = "library"
''' + extra)
    return path


def _entry(eid: str, repo: str, commit: str, paths: str, folder: Path) -> str:
    (folder / "adapters" / f"{eid.replace('-', '_')}.py").write_text(ADAPTER)
    return f'''
[[entry]]
id = "{eid}"
task = "softmax"
repo = "{repo}"
commit = "{commit}"
paths = [{paths}]
calls = []
language = "pytorch"
license = "MIT"
kind = "library"
'''


def _import(path: Path):
    """Import a kernel file as the harness does (pipelines.profiling.runner.load_kernel): registered
    in sys.modules first, where Triton and the rewritten `import m as x` find the module."""
    spec = importlib.util.spec_from_file_location("library_set_test_module", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(spec.name, None)
    return module


def test_build_assembles_one_module_writes_the_batch_and_skips_with_reasons(fetched, tmp_path, capsys):
    repos, commit = fetched
    folder = tmp_path / "m"
    (folder / "adapters").mkdir(parents=True)
    extra = (_entry("absent-repo", "nobody/absent", commit, '"tinylib/kernel.py"', folder)
             + _entry("bad-commit", "test-owner/tinylib", "0" * 40, '"tinylib/kernel.py"', folder)
             + _entry("missing-path", "test-owner/tinylib", commit, '"tinylib/nowhere.py"', folder))
    entries = manifest.load_manifest(_manifest(folder, commit, extra))
    out = tmp_path / "set"

    report = build.build_set(entries, repos, out, checkout=CHECKOUT)

    lines = capsys.readouterr().out.splitlines()
    assert report.skipped == {
        "absent-repo": f"repository nobody/absent not found under {repos}",
        "bad-commit": f"commit {'0' * 12} not in the fetched copy {repos / 'test-owner+tinylib' / 'repo'}",
        "missing-path": f"tinylib/nowhere.py not found at commit {commit[:12]}",
    }
    assert [ln.split(":")[0] for ln in lines[:3]] == ["skipped absent-repo", "skipped bad-commit", "skipped missing-path"]
    assert lines[-1] == "library set: 1 assembled, 3 skipped (softmax 1)"

    table = pq.read_table(out / build.BATCH_FILE)
    assert table.schema.names == KERNEL_BATCH_SCHEMA.names
    (row,) = table.to_pylist()
    source = (out / "softmax" / "tiny-softmax.py").read_text()
    assert row["source"] == source and row["kernel_id"] == kernel_id(source)
    assert (row["task"], row["language"], row["generator"], row["algorithm"]) == (
        "softmax", "pytorch", "library:test-owner/tinylib", "tiny-softmax")
    record = json.loads((out / build.MANIFEST_FILE).read_text())["tiny-softmax"]
    assert (record["kernel_id"], record["repo"], record["commit"]) == (row["kernel_id"], "test-owner/tinylib", commit)
    assert record["paths"] == ["tinylib/helpers.py", "tinylib/kernel.py"]
    assert set(json.loads((out / build.SKIPPED_FILE).read_text())) == {"absent-repo", "bad-commit", "missing-path"}

    # The module: one file, __future__ first, the intra-package imports gone, the unused import of
    # a package no host has gone, the script's module-level print left out by `take`.
    tree = ast.parse(source)
    assert isinstance(tree.body[1], ast.ImportFrom) and tree.body[1].module == "__future__"
    assert "not_a_package_anywhere" not in source and "from tinylib" not in source and "print(" not in source
    assert "_max = row_max" in source and "h = __import__('sys').modules[__name__]" in source

    # ... and it runs the task's smallest correctness case and passes the task's check.
    task = get_task("softmax")
    case = min(task.correctness_cases, key=lambda c: c["M"] * c["N"])
    data = task.generate_input(**case)
    ok, message = task.check_implementation(data, _import(out / "softmax" / "tiny-softmax.py").custom_kernel(data))
    assert ok, message


def test_check_runs_the_built_modules_on_their_correctness_cases(fetched, tmp_path, capsys):
    repos, commit = fetched
    entries = manifest.load_manifest(_manifest(tmp_path / "m", commit))
    build.build_set(entries, repos, tmp_path / "set", say=lambda _: None, checkout=CHECKOUT)

    results = check.check_set(tmp_path / "set", timeout_s=120)

    assert check.MANIFEST_FILE == build.MANIFEST_FILE
    assert results["tiny-softmax"]["ok"], results
    assert capsys.readouterr().out.splitlines()[-1] == "cpu check: 1 of 1 correct on every correctness case"
    with pytest.raises(ValueError, match="not in .*: nope"):
        check.check_set(tmp_path / "set", ids=["nope"])


def test_a_checkout_is_read_at_the_commit_not_its_working_tree(fetched, tmp_path):
    repos, commit = fetched
    checkout = tmp_path / "other" / "test-owner" / "tinylib"
    _git("clone", "-q", str(repos / "test-owner+tinylib" / "repo"), str(checkout), cwd=tmp_path)
    (checkout / "tinylib" / "kernel.py").write_text("raise SystemExit('the working tree was read')\n")
    entries = manifest.load_manifest(_manifest(tmp_path / "m", commit))

    report = build.build_set(entries, tmp_path / "other", tmp_path / "set", say=lambda _: None, checkout=CHECKOUT)

    assert list(report.built) == ["tiny-softmax"] and "SystemExit" not in report.rows[0]["source"]


def test_an_output_folder_inside_the_checkout_is_refused(fetched, tmp_path, capsys):
    repos, commit = fetched
    entries = manifest.load_manifest(_manifest(tmp_path / "m", commit))
    inside = CHECKOUT / "library-set-must-not-exist"

    with pytest.raises(build.OutsideError, match="inside the repository checkout"):
        build.build_set(entries, repos, inside, checkout=CHECKOUT)
    code = main(["build", "--repos", str(repos), "--out", str(CHECKOUT / "data"), "--manifest", str(tmp_path / "m" / "manifest.toml")])

    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: refusing --out") and err.count("\n") == 1
    assert not inside.exists()


def test_a_used_import_of_a_package_the_host_lacks_makes_the_entry_unusable(fetched, tmp_path):
    repos, commit = fetched
    adapter = ADAPTER.replace("return softmax_rows(x)", "return not_a_package_anywhere.softmax(x)")
    entries = manifest.load_manifest(_manifest(tmp_path / "m", commit, adapter=adapter))

    report = build.build_set(entries, repos, tmp_path / "set", say=lambda _: None, checkout=CHECKOUT)

    assert report.skipped["tiny-softmax"] == (
        "tinylib/helpers.py:5: imports not_a_package_anywhere (not on the measuring host) and uses not_a_package_anywhere")
    assert pq.read_table(tmp_path / "set" / build.BATCH_FILE).num_rows == 0
    # On a host said to have that package, the import stays and the entry assembles.
    kept = build.build_set(entries, repos, tmp_path / "set", say=lambda _: None, checkout=CHECKOUT,
                           host_packages=frozenset({"not_a_package_anywhere"}))
    assert not kept.skipped, kept.skipped
    assert "import not_a_package_anywhere" in kept.rows[0]["source"]


def test_take_names_a_missing_definition_or_leaves_out_one_the_code_reads(fetched, tmp_path):
    script = "import torch\nLIMIT = 4\n\ndef f(x):\n    return x[:LIMIT]\n\nf(torch.ones(9))\n"
    assert assemble.take_definitions(script, ("LIMIT", "f"), "s.py") == "import torch\n\nLIMIT = 4\n\ndef f(x):\n    return x[:LIMIT]\n"
    with pytest.raises(assemble.Unusable, match=r"take names \['g'\]"):
        assemble.take_definitions(script, ("f", "g"), "s.py")
    with pytest.raises(assemble.Unusable, match=r"uses \['LIMIT'\], which take leaves out"):
        assemble.take_definitions(script, ("f",), "s.py")


def test_global_reads_follow_python_scopes():
    tree = ast.parse("y = 1\ndef f(x, z=y):\n    a = [i for i in x]\n    def g():\n        return a, q\n"
                     "    return x + w\nclass C(B):\n    k = 1\n    m = k\n    def h(self):\n        return k\n")
    assert assemble.global_reads(tree) == {"y", "q", "w", "B", "k"}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("commit", '"abc"', "is not 40 hex digits"),
    ("task", '"matmul"', "is not a task of the suite"),
    ("repo", '"no-slash"', "is not owner/name"),
    ("language", '"cuda"', "language 'cuda' not in"),
])
def test_a_malformed_entry_is_one_line_naming_the_field(tmp_path, field, value, message):
    path = _manifest(tmp_path, "a" * 40)
    text = path.read_text()
    start = text.index(f"\n{field} = ") + 1
    path.write_text(text[:start] + f"{field} = {value}" + text[text.index("\n", start):])
    with pytest.raises(ValueError, match=message) as info:
        manifest.load_manifest(path)
    assert "\n" not in str(info.value)


# ---- the committed manifest ------------------------------------------------------------------
COMMITTED = manifest.load_manifest()


def test_the_committed_manifest_spans_every_task():
    assert len(COMMITTED) >= 40
    assert {e.task for e in COMMITTED} == set(TASK_MODULES)


@pytest.mark.parametrize("entry", COMMITTED, ids=[e.id for e in COMMITTED])
def test_every_committed_entry_is_pinned_and_has_an_adapter_defining_custom_kernel(entry):
    assert len(entry.commit) == 40 and all(c in "0123456789abcdef" for c in entry.commit)
    assert entry.task in TASK_MODULES and entry.license and entry.paths
    tree = ast.parse(entry.adapter.read_text())
    assert "custom_kernel" in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"torch", "math", "__future__"}, f"an adapter imports only torch and math: {imported}"


def test_the_set_is_external_so_the_curation_keeps_it_out_of_training():
    assert all(is_external_generator(e.generator) and e.generator == f"library:{e.repo}" for e in COMMITTED)


def test_every_adapter_file_belongs_to_an_entry():
    adapters = sorted(p.name for p in (Path(manifest.MANIFEST).parent / "adapters").glob("*.py"))
    assert adapters == sorted(e.adapter.name for e in COMMITTED)


def test_the_package_runs_as_a_module():
    done = subprocess.run([sys.executable, "-m", "pipelines.generation.library", "repos"], cwd=CHECKOUT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    assert {tuple(line.split()) for line in done.stdout.splitlines()} == {(e.repo, e.commit) for e in COMMITTED}
