"""Draw the rooms of pipelines/ (its packages, in the order docs/architecture.md gives them) and
the imports between them, counted as tests/test_import_structure.py counts them (in-function
imports included): an arrow that runs up the order is red.

    python3 scripts/draw_rooms.py --out docs/images/rooms-after.png [--repo DIR] [--title T]

`--repo` draws another checkout (e.g. a `git worktree` of an older commit) with today's walker.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tests.test_import_structure as structure  # noqa: E402

ROOMS = structure.ROOMS


def room_arrows(repo: Path) -> Counter:
    """(source room, target room) -> imports, between the rooms of pipelines/ in `repo`."""
    structure.ROOT = repo.resolve()
    _, arrows, _ = structure.import_graph()
    counts: Counter = Counter()
    for a in arrows:
        s, t = structure.room(a.source), structure.room(a.target)
        if s is not None and t is not None and s != t:
            counts[(ROOMS[s], ROOMS[t])] += 1
    return counts


def draw(counts: Counter, out: Path, title: str) -> None:
    x = {r: i for i, r in enumerate(ROOMS)}
    fig, ax = plt.subplots(figsize=(12, 4.8))
    for r, i in x.items():
        ax.text(i, 0, r.removeprefix("pipelines."), ha="center", va="center", fontsize=9,
                bbox={"boxstyle": "round", "fc": "#eef", "ec": "#558"})
    up = 0
    for (s, t), n in sorted(counts.items()):
        going_up = x[t] > x[s]
        up += going_up
        ax.annotate("", xy=(x[t], 0.12 if going_up else -0.12), xytext=(x[s], 0.12 if going_up else -0.12),
                    arrowprops={"arrowstyle": "->", "color": "#c22" if going_up else "#888", "lw": 0.6 + 0.25 * min(n, 8),
                                "connectionstyle": "arc3,rad=-0.35"})
    ax.set_xlim(-0.7, len(ROOMS) - 0.3)
    ax.set_ylim(-2.2, 2.2)
    ax.axis("off")
    ax.text(len(ROOMS) - 0.5, -2.0, "imports down the order below, up the order above (red)", ha="right", fontsize=8)
    ax.set_title(f"{title}: {len(counts)} arrows between the rooms, {up} up the order (red), "
                 f"{sum(counts.values())} imports", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--title", default="pipelines/")
    args = ap.parse_args(argv)
    counts = room_arrows(Path(args.repo))
    draw(counts, Path(args.out), args.title)
    up = [(s, t, n) for (s, t), n in counts.items() if ROOMS.index(t) > ROOMS.index(s)]
    print(f"{args.out}: {len(counts)} arrows, {len(up)} up the order")
    for s, t, n in sorted(up):
        print(f"  up: {s} -> {t} ({n} imports)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
