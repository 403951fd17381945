"""Command line of the library set.

    python -m pipelines.generation.library repos               the repositories and commits to fetch
    python -m pipelines.generation.library build --repos DIR --out FOLDER [--manifest FILE]
                                           [--host-package einops ...]
    python -m pipelines.generation.library check --out FOLDER [--ids a,b] [--timeout S] [--device cuda]

Bad input (an unreadable manifest, an output folder inside the checkout, a folder never built)
gives one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipelines.generation.library.manifest import MANIFEST, load_manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.generation.library",
                                     description="Published kernels, assembled at run time outside the repository.")
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("repos", help="print owner/name and commit of every repository the manifest needs")
    build = sub.add_parser("build", help="assemble the set into FOLDER")
    check = sub.add_parser("check", help="run a built set's modules on their tasks' correctness cases")
    for p in (listing, build):
        p.add_argument("--manifest", default=str(MANIFEST), help="manifest TOML (default: the committed one)")
    build.add_argument("--repos", required=True, help="folder of fetched repositories (bare or checkouts)")
    build.add_argument("--out", required=True, help="output folder, outside the repository")
    build.add_argument("--host-package", action="append", default=[], metavar="NAME",
                       help="a package the measuring host has beyond torch, triton, numpy, packaging (repeatable)")
    check.add_argument("--out", required=True, help="a folder `build` wrote")
    check.add_argument("--ids", default="", help="comma-separated entry ids (default: all built)")
    check.add_argument("--timeout", type=float, default=180.0, help="seconds per module")
    check.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cpu: the Triton interpreter")
    check.add_argument("--workers", type=int, default=1, help="checking children at a time")
    check.add_argument("--json", default="", help="also write the outcomes to this JSON file")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            from pipelines.generation.library.check import check_set

            ids = [i for i in args.ids.split(",") if i] or None
            results = check_set(args.out, ids=ids, timeout_s=args.timeout, workers=args.workers, device=args.device)
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
            return 0
        entries = load_manifest(args.manifest)
        if args.command == "repos":
            for repo, commit in sorted({(e.repo, e.commit) for e in entries}):
                print(repo, commit)
            return 0
        if not Path(args.repos).is_dir():
            raise ValueError(f"--repos {args.repos}: not a folder")
        from pipelines.generation.library.build import build_set  # pyarrow: not needed by `check`

        build_set(entries, args.repos, args.out, host_packages=frozenset(args.host_package))
        return 0
    except ValueError as exc:  # build.OutsideError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
