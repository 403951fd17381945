"""Build the library set into a folder outside the repository.

For each manifest entry: find its repository among the fetched copies, read its files at the
pinned commit, assemble one module with its adapter (assemble.py) and write

    FOLDER/<task>/<entry id>.py          the module (a kernel file the worker and
                                          benchmarks.third_party_batch read)
    FOLDER/kernels-library.parquet       KERNEL_BATCH_SCHEMA rows: kernel_id = sha256 of the
                                          normalised module, generator "library:<repo>",
                                          algorithm = entry id
    FOLDER/library-manifest.json         entry id -> kernel_id, task, repo, commit, paths, ...
    FOLDER/library-skipped.json          entry id -> why it was not assembled (when any was not)

An entry whose repository, commit or file is missing, or whose imports cannot be met on the
measuring host, is skipped with a one-line reason. The folder must lie outside the checkout: the
set is other people's code, read at run time and never committed.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.generation.library import assemble, repos
from pipelines.generation.library.manifest import Entry
from warehouse.formats import KERNEL_BATCH_SCHEMA
from warehouse.ids import kernel_id

GENERATOR_VERSION = "library-1"  # bumped when the assembly of a module changes
REPO_ROOT = Path(__file__).resolve().parents[3]
BATCH_FILE = "kernels-library.parquet"
MANIFEST_FILE = "library-manifest.json"  # also read by check.py, which keeps its own copy of the name
SKIPPED_FILE = "library-skipped.json"


class OutsideError(ValueError):
    """The output folder is inside the repository checkout."""


@dataclass
class BuildReport:
    rows: list[dict] = field(default_factory=list)  # KERNEL_BATCH_SCHEMA rows, manifest order
    built: dict[str, dict] = field(default_factory=dict)  # entry id -> library-manifest.json record
    skipped: dict[str, str] = field(default_factory=dict)  # entry id -> one-line reason

    def summary(self) -> str:
        per_task = Counter(r["task"] for r in self.rows)
        tasks = ", ".join(f"{t} {n}" for t, n in sorted(per_task.items()))
        return f"library set: {len(self.rows)} assembled, {len(self.skipped)} skipped ({tasks or 'none'})"


def check_outside(out: str | Path, checkout: Path = REPO_ROOT) -> Path:
    """`out` resolved, if it lies outside `checkout`.

    Raises:
        OutsideError: `out` is the checkout or inside it.
    """
    resolved = Path(out).expanduser().resolve()
    root = checkout.resolve()
    if resolved == root or root in resolved.parents:
        raise OutsideError(
            f"refusing --out {out}: it is inside the repository checkout {root}; the library set is "
            "published code read at run time and must stay outside the repository")
    return resolved


def assemble_entry(entry: Entry, repos_dir: str | Path,
                   host_packages: frozenset[str] = frozenset()) -> assemble.Assembled:
    """The module of one entry from the fetched repositories.

    Raises:
        repos.SourceMissing: repository, commit or file not found.
        assemble.Unusable: the files cannot make a module for the measuring host.
    """
    repo_dir = repos.find_repo(repos_dir, entry.repo)
    if repo_dir is None:
        raise repos.SourceMissing(f"repository {entry.repo} not found under {repos_dir}")
    files = {p: repos.read_file(repo_dir, entry.commit, p) for p in entry.paths}
    try:
        adapter = entry.adapter.read_text(encoding="utf-8")
    except OSError:
        raise assemble.Unusable(f"adapter {entry.adapter} not found") from None
    return assemble.assemble(entry, files, adapter, host_packages)


def build_set(entries: list[Entry], repos_dir: str | Path, out: str | Path,
              say: Callable[[str], None] = print, checkout: Path = REPO_ROOT,
              host_packages: frozenset[str] = frozenset()) -> BuildReport:
    """Assemble every entry into `out` (see the module docstring); one line per skipped entry.
    `host_packages`: packages the measuring host has beyond assemble.MEASURING_HOST_PACKAGES.

    Raises:
        OutsideError: `out` is inside the checkout.
    """
    folder = check_outside(out, checkout)
    report = BuildReport()
    for entry in entries:
        try:
            built = assemble_entry(entry, repos_dir, host_packages)
        except (repos.SourceMissing, assemble.Unusable) as exc:
            report.skipped[entry.id] = str(exc)
            say(f"skipped {entry.id}: {exc}")
            (folder / entry.task / f"{entry.id}.py").unlink(missing_ok=True)  # an earlier build's
            continue
        module = folder / entry.task / f"{entry.id}.py"
        module.parent.mkdir(parents=True, exist_ok=True)
        module.write_text(built.source, encoding="utf-8")
        kid = kernel_id(built.source)
        report.rows.append({
            "kernel_id": kid, "task": entry.task, "source": built.source, "language": entry.language,
            "generator": entry.generator, "generator_version": GENERATOR_VERSION, "algorithm": entry.id,
            "knobs_json": None, "parent_kernel_id": None, "mutation": None,
        })
        report.built[entry.id] = {
            "kernel_id": kid, "task": entry.task, "repo": entry.repo, "commit": entry.commit,
            "paths": list(entry.paths), "take": {p: list(n) for p, n in entry.take.items()},
            "language": entry.language, "license": entry.license, "kind": entry.kind,
            "file": str(module.relative_to(folder)), "shadowed": list(built.shadowed),
        }
        if built.shadowed:
            say(f"note {entry.id}: names bound by more than one file (the later wins): {', '.join(built.shadowed)}")
    _write(folder, report)
    say(report.summary())
    return report


def _write(folder: Path, report: BuildReport) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(report.rows, schema=KERNEL_BATCH_SCHEMA)
    tmp = folder / f".{BATCH_FILE}.tmp"
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, folder / BATCH_FILE)
    (folder / MANIFEST_FILE).write_text(json.dumps(report.built, indent=1, sort_keys=True) + "\n")
    skipped = folder / SKIPPED_FILE
    if report.skipped:
        skipped.write_text(json.dumps(report.skipped, indent=1, sort_keys=True) + "\n")
    elif skipped.exists():
        skipped.unlink()  # from an earlier build: it would describe entries that now assemble
