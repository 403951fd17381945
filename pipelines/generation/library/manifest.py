"""The library set's manifest: which published files make each kernel, pinned to a commit.

`manifest.toml` beside this module holds one `[[entry]]` table per kernel:

    id        stable short key, e.g. "liger-rms-norm"; also names the adapter, our module
              adapters/<id with "-" as "_">.py beside the manifest
    task      a task of the suite (pipelines.tasks.TASK_MODULES)
    repo      "owner/name" on GitHub
    commit    the 40-hex commit the files are read at
    paths     the published files, in the order they are concatenated (helpers first)
    calls     the published names the adapter calls (documentation, checked to exist)
    language  "triton" | "pytorch"
    license   the SPDX id the repository states
    kind      "library" (a library's kernel as shipped), "tutorial", "model-code" (a model's
              module in plain PyTorch), "reference" (a benchmark's own reference code) or
              "library+epilogue" (a published kernel followed by an epilogue of ours, which the
              entry's note names)
    take      optional {path = [names]}: from that file only these top-level definitions (and
              the file's imports), for scripts whose module level also runs tests or benchmarks
    note      optional, one line: what the adapter adds or converts

The kernel ids are not in the manifest: they are the hashes of the assembled sources, known only
once the repositories are fetched (`library-manifest.json` of a built set maps entry -> kernel id).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.tasks import TASK_MODULES

MANIFEST = Path(__file__).resolve().parent / "manifest.toml"
LANGUAGES = ("triton", "pytorch")
KINDS = ("library", "tutorial", "model-code", "reference", "library+epilogue")
_ID = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_FIELDS = ("id", "task", "repo", "commit", "paths", "calls", "language", "license", "kind")
_OPTIONAL = ("take", "note")


@dataclass(frozen=True)
class Entry:
    """One kernel of the library set: published files at a pinned commit, and our adapter."""

    id: str
    task: str
    repo: str  # "owner/name"
    commit: str  # 40 hex
    paths: tuple[str, ...]
    calls: tuple[str, ...]
    language: str
    license: str
    kind: str
    adapter: Path  # our adapter module: <manifest folder>/adapters/<id, '-' as '_'>.py
    take: dict[str, tuple[str, ...]] = field(default_factory=dict)
    note: str = ""

    @property
    def generator(self) -> str:
        return f"library:{self.repo}"


def adapter_file(manifest: Path, entry_id: str) -> Path:
    """Where the adapter of `entry_id` lives: adapters/ beside the manifest, '-' written '_'."""
    return manifest.resolve().parent / "adapters" / f"{entry_id.replace('-', '_')}.py"


def _entry(raw: dict, where: str, manifest: Path) -> Entry:
    """An Entry from one TOML table; ValueError (one line, naming `where`) when a field is wrong."""
    missing = [k for k in _FIELDS if k not in raw]
    unknown = sorted(set(raw) - set(_FIELDS) - set(_OPTIONAL))
    if missing or unknown:
        raise ValueError(f"{where}: missing {missing or '-'}, unknown {unknown or '-'}")
    eid = raw["id"]
    checks = (
        (isinstance(eid, str) and bool(_ID.match(eid)), f"id {eid!r} is not lower-case letters, digits and '-'"),
        (raw["task"] in TASK_MODULES, f"task {raw['task']!r} is not a task of the suite"),
        (isinstance(raw["repo"], str) and bool(_REPO.match(raw["repo"])), f"repo {raw['repo']!r} is not owner/name"),
        (isinstance(raw["commit"], str) and bool(_COMMIT.match(raw["commit"])), f"commit {raw['commit']!r} is not 40 hex digits"),
        (isinstance(raw["paths"], list) and raw["paths"] and all(isinstance(p, str) and p for p in raw["paths"]),
         "paths must be a non-empty list of file paths"),
        (isinstance(raw["calls"], list) and all(isinstance(c, str) for c in raw["calls"]), "calls must be a list of names"),
        (raw["language"] in LANGUAGES, f"language {raw['language']!r} not in {LANGUAGES}"),
        (raw["kind"] in KINDS, f"kind {raw['kind']!r} not in {KINDS}"),
        (isinstance(raw["license"], str) and raw["license"].strip() != "", "license is empty"),
    )
    for ok, message in checks:
        if not ok:
            raise ValueError(f"{where} ({eid}): {message}")
    take = raw.get("take", {})
    if not isinstance(take, dict) or any(p not in raw["paths"] or not isinstance(n, list) for p, n in take.items()):
        raise ValueError(f"{where} ({eid}): take must map some of its paths to lists of names")
    return Entry(
        id=eid, task=raw["task"], repo=raw["repo"], commit=raw["commit"], paths=tuple(raw["paths"]),
        calls=tuple(raw["calls"]), language=raw["language"], license=raw["license"], kind=raw["kind"],
        adapter=adapter_file(manifest, eid), take={p: tuple(n) for p, n in take.items()}, note=str(raw.get("note", "")),
    )


def load_manifest(path: str | Path = MANIFEST) -> list[Entry]:
    """The entries of a manifest file, in file order.

    Raises:
        ValueError: the file is not TOML, an entry is malformed, or two entries share an id.
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"manifest {path}: {exc}") from None
    tables = raw.get("entry", [])
    if not isinstance(tables, list):
        raise ValueError(f"manifest {path}: expected [[entry]] tables")
    entries = [_entry(t, f"manifest {path.name} entry {i + 1}", path) for i, t in enumerate(tables)]
    seen: set[str] = set()
    for e in entries:
        if e.id in seen:
            raise ValueError(f"manifest {path.name}: id {e.id!r} appears twice")
        seen.add(e.id)
    return entries
