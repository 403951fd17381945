"""Draw the product's import structure: rooms (packages) on their floors, imports as arrows.

    python3 scripts/draw_structure.py --out docs/images/structure.png [--repo CHECKOUT]

A room is a package one level below a floor (pipelines.profiling, models.training, ...); a floor's
own top-level modules are one room named after the floor. An arrow is every import between
modules of two rooms, inside functions included, drawn once with its count; an arrow that runs
up the floors of docs/architecture.md is red (the code location's one arrow up to the assets is
grey), and rooms that reach each other through a circle of modules are ringed in red. The
counts come from tests/test_import_structure.py, the check that holds the structure, run over
the checkout given by --repo (default: this one), so an older commit can be drawn beside today's.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parents[1]


def load_structure(repo: Path):
    """tests/test_import_structure.py of this checkout, pointed at `repo`."""
    spec = importlib.util.spec_from_file_location("import_structure", HERE / "tests" / "test_import_structure.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    module.ROOT = repo.resolve()
    return module


def room(module: str, packages: set[str]) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and ".".join(parts[:2]) in packages else parts[0]


def draw(repo: Path, out: Path, title: str) -> dict[str, int]:
    s = load_structure(repo)
    modules, arrows, _ = s.import_graph()
    packages = {name for name, path in modules.items() if path.name == "__init__.py"}
    rooms = Counter(room(m, packages) for m in modules)
    edges = Counter((room(a.source, packages), room(a.target, packages)) for a in arrows
                    if room(a.source, packages) != room(a.target, packages))
    up = {(room(a.source, packages), room(a.target, packages)) for a in s.upward(arrows)}
    allowed = {(room(a.source, packages), room(a.target, packages)) for a in arrows
               if (a.source, a.target.split(".")[0]) in s.ALLOWED_UP}
    in_circle = {room(m, packages) for c in s.circles(arrows) for m in c}

    by_floor: dict[str, list[str]] = {f: [] for f in s.FLOORS}
    for r in sorted(rooms):
        by_floor[r.split(".")[0]].append(r)
    pos = {}
    for level, f in enumerate(s.FLOORS):
        names = by_floor[f]
        for i, r in enumerate(names):  # a crowded floor staggers its rooms so the labels stay apart
            stagger = (0.05 if i % 2 else -0.05) if len(names) > 6 else 0.0
            pos[r] = ((i + 1) / (len(names) + 1), 1.0 - level / (len(s.FLOORS) - 1) + stagger)

    fig, ax = plt.subplots(figsize=(18, 10))
    for (a, b), n in sorted(edges.items(), key=lambda e: ((e[0] in up), e[1])):
        colour = "#d62728" if (a, b) in up else "#aaaaaa" if (a, b) in allowed else "#4c72b0"
        ax.annotate("", xy=pos[b], xytext=pos[a],
                    arrowprops={"arrowstyle": "-|>", "color": colour, "alpha": 0.9 if (a, b) in up else 0.35,
                                "lw": 0.6 + min(n, 40) / 12, "shrinkA": 14, "shrinkB": 14,
                                "connectionstyle": "arc3,rad=0.08"})
    for r, (x, y) in pos.items():
        label = r.split(".", 1)[1] + "/" if "." in r else f"{r} (top level)" if r in packages else r
        ax.text(x, y, f"{label}\n{rooms[r]} modules", ha="center", va="center", fontsize=8,
                bbox={"boxstyle": "round,pad=0.3", "fc": "#fff4d6" if r in in_circle else "#eef3fb",
                      "ec": "#d62728" if r in in_circle else "#4c72b0", "lw": 2 if r in in_circle else 1})
    for level, f in enumerate(s.FLOORS):
        ax.text(-0.02, 1.0 - level / (len(s.FLOORS) - 1), f, ha="right", va="center", fontsize=11, weight="bold")
    counts = s.summary()
    ax.set_title(f"{title}: {len(rooms)} rooms, {counts['modules']} modules, {counts['arrows']} module arrows, "
                 f"{counts['upward arrows']} upward, {counts['circles']} circles, "
                 f"{counts['imports inside functions']} imports inside functions", fontsize=11)
    ax.set_xlim(-0.12, 1.02)
    ax.set_ylim(-0.08, 1.08)
    ax.axis("off")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return {"rooms": len(rooms), "room arrows": len(edges), **counts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--repo", type=Path, default=HERE, help="the checkout to draw (default: this one)")
    parser.add_argument("--title", default="import structure")
    args = parser.parse_args(argv)
    if not (args.repo / "pipelines").is_dir():
        print(f"error: {args.repo} is not a kernelcast checkout (no pipelines/)", file=sys.stderr)
        return 2
    for key, value in draw(args.repo, args.out, args.title).items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
