"""Read published files at a pinned commit from fetched copies of their repositories.

A folder of fetched repositories holds each one under a name made of its owner and name; any of
    DIR/owner+name/repo   DIR/owner+name   DIR/owner/name   DIR/owner__name   DIR/name
is found, as a bare git directory or a checkout. Files are read with `git show COMMIT:PATH`, so
a checkout's working tree (whatever branch it is on) is never looked at.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


class SourceMissing(Exception):
    """A repository, commit or file the manifest names is not in the fetched copies (one line)."""


def _git_args(repo: Path) -> list[str] | None:
    """The git arguments that address `repo` (bare or checkout), or None if it is not one."""
    if (repo / ".git").exists():
        return ["git", "-C", str(repo)]
    if (repo / "HEAD").is_file() and (repo / "objects").is_dir():
        return ["git", "--git-dir", str(repo)]
    return None


def find_repo(repos_dir: str | Path, repo: str) -> Path | None:
    """The fetched copy of `repo` ("owner/name") under `repos_dir`, or None."""
    owner, name = repo.split("/", 1)
    root = Path(repos_dir)
    for candidate in (root / f"{owner}+{name}" / "repo", root / f"{owner}+{name}", root / owner / name,
                      root / f"{owner}__{name}", root / name):
        if candidate.is_dir() and _git_args(candidate) is not None:
            return candidate
    return None


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*_git_args(repo), *args], capture_output=True, timeout=120)


def read_file(repo_dir: Path, commit: str, path: str) -> str:
    """The text of `path` at `commit` in the git repository `repo_dir`.

    Raises:
        SourceMissing: the commit is not in the copy, or the file is not at that commit.
    """
    if _git(repo_dir, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        raise SourceMissing(f"commit {commit[:12]} not in the fetched copy {repo_dir}")
    shown = _git(repo_dir, "show", f"{commit}:{path}")
    if shown.returncode != 0:
        raise SourceMissing(f"{path} not found at commit {commit[:12]}")
    try:
        return shown.stdout.decode("utf-8")
    except UnicodeDecodeError:
        raise SourceMissing(f"{path} at {commit[:12]} is not UTF-8 text") from None
