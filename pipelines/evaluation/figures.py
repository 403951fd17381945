"""Evaluation figures as PNG bytes (matplotlib, Agg backend: no display needed).

Each function takes {model name: evaluate_forecasts result} and draws every model it is given on
one set of axes, from the result's "curves" block, so a report never recomputes metrics. The
report hands them a handful (`pick_series`): a dozen lines in ten colours cannot be told apart.
Legends sit below the axes, never over the data.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless hosts, Dagster workers
import matplotlib.pyplot as plt

Results = Mapping[str, Mapping[str, Any]]
SERIES = 5  # forecasters per figure: each keeps a colour of its own
COLOURS = plt.get_cmap("tab10").colors
ORACLE = "baseline:oracle"


def pick_series(results: Results, first: Sequence[str] = (), limit: int = SERIES) -> list[str]:
    """The forecasters a figure draws: those in `first` (the champions), then the lowest Brier,
    then the bin prior as the reference a forecaster must beat; never the oracle (it knows the
    answer) and at most `limit`.

    >>> r = {n: {"brier": b} for n, b in [("a", 0.3), ("b", 0.2), ("c", 0.4), ("baseline:oracle", 0.0),
    ...                                    ("baseline:bin_prior", 0.45)]}
    >>> pick_series(r, first=["c"], limit=3)
    ['c', 'b', 'baseline:bin_prior']
    """
    def base(name: str) -> str:
        return name.split("|")[0]

    def brier(name: str) -> float:
        b = results[name].get("brier")
        return b if isinstance(b, (int, float)) and b == b else float("inf")

    candidates = [n for n in results if base(n) != ORACLE]
    prior = [n for n in candidates if base(n) == "baseline:bin_prior"][:1]
    chosen = [n for n in candidates if base(n) in {base(f) for f in first}]
    for name in sorted(candidates, key=lambda n: (brier(n), n)):
        if len(chosen) >= limit - len(prior):
            break
        if name not in chosen and name not in prior:
            chosen.append(name)
    return (chosen[:limit - len(prior)] + prior)[:limit]


def _legend(ax) -> None:
    """Below the axes: a spot inside hides some model's curve (and matplotlib's "best" search
    against every vertex of every step curve took about 1 s a figure)."""
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.16), ncol=1, frameon=False)


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def reliability_figure(results: Results) -> bytes:
    """Reliability diagram: accuracy vs mean stated confidence per bucket, one line per model."""
    fig, ax = plt.subplots(figsize=(4.2, 3.6))
    ax.plot([0, 1], [0, 1], ls="--", c="grey", lw=1, label="perfect calibration")
    for i, (name, res) in enumerate(results.items()):
        rel = res["curves"]["reliability"]
        pts = [(c, a) for c, a, n in zip(rel["mean_confidence"], rel["accuracy"], rel["count"]) if n]
        if pts:
            xs, ys = zip(*pts)
            ece = res.get("ece")
            ax.plot(xs, ys, marker="o", c=COLOURS[i % len(COLOURS)],
                    label=f"{name} (ECE {ece:.3f})" if ece is not None else name)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence p[predicted bin]", ylabel="accuracy",
           title="Reliability (10 equal-width buckets)")
    _legend(ax)
    return _png(fig)


def risk_coverage_figure(results: Results, score: str = "max_prob") -> bytes:
    """Selective risk vs coverage for one confidence score, one line per model."""
    fig, ax = plt.subplots(figsize=(4.2, 3.6))
    for i, (name, res) in enumerate(results.items()):
        rc = res["curves"]["risk_coverage"].get(score)
        if rc and rc["coverage"]:
            aurc = res.get("aurc")
            ax.step([0.0] + rc["coverage"], [rc["risk"][0]] + rc["risk"], where="post", c=COLOURS[i % len(COLOURS)],
                    label=f"{name} (AURC {aurc:.3f})" if aurc is not None else name)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="coverage", ylabel="risk = 1 - accuracy",
           title=f"Risk-coverage ({score})")
    _legend(ax)
    return _png(fig)


def recovered_figure(results: Results) -> bytes:
    """Mean-over-tasks recovered speedup vs budget; the random-order expectation dashed."""
    fig, ax = plt.subplots(figsize=(4.2, 3.6))
    random_drawn = False
    for i, (name, res) in enumerate(results.items()):
        rec = res["curves"]["recovered"]
        ax.plot(rec["percents"], rec["model_mean"], c=COLOURS[i % len(COLOURS)],
                label=f"{name} ({res.get('recovered_mean', 0):.3f})")
        if not random_drawn:  # the random expectation depends only on the pools: draw once
            ax.plot(rec["percents"], rec["random_mean"], ls="--", c="grey", label="random order (expected)")
            random_drawn = True
    ax.axhline(1.0, c="black", lw=0.8, label="perfect ranking (1.0)")
    ax.axhline(0.8, c="grey", lw=0.6, ls=":", label="within 20%")
    ax.set(xlabel="measurement budget (% of pool)", ylabel="speedup recovered", ylim=(0, 1.05),
           title="Speedup recovered vs budget")
    _legend(ax)
    return _png(fig)
