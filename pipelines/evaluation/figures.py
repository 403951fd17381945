"""Evaluation figures as PNG bytes (matplotlib, Agg backend: no display needed).

Each function takes {model name: evaluate_forecasts result} and draws every model on one
set of axes, from the result's "curves" block, so a report never recomputes metrics.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless hosts, Dagster workers
import matplotlib.pyplot as plt

Results = Mapping[str, Mapping[str, Any]]


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def reliability_figure(results: Results) -> bytes:
    """Reliability diagram: accuracy vs mean stated confidence per bucket, one line per model."""
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], ls="--", c="grey", lw=1, label="perfect calibration")
    for name, res in results.items():
        rel = res["curves"]["reliability"]
        pts = [(c, a) for c, a, n in zip(rel["mean_confidence"], rel["accuracy"], rel["count"]) if n]
        if pts:
            xs, ys = zip(*pts)
            ece = res.get("ece")
            ax.plot(xs, ys, marker="o", label=f"{name} (ECE {ece:.3f})" if ece is not None else name)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence p[predicted bin]", ylabel="accuracy",
           title="Reliability (10 equal-width buckets)")
    ax.legend(fontsize=8, loc="upper left")
    return _png(fig)


def risk_coverage_figure(results: Results, score: str = "max_prob") -> bytes:
    """Selective risk vs coverage for one confidence score, one line per model."""
    fig, ax = plt.subplots(figsize=(5, 4))
    for name, res in results.items():
        rc = res["curves"]["risk_coverage"].get(score)
        if rc and rc["coverage"]:
            aurc = res.get("aurc")
            ax.step([0.0] + rc["coverage"], [rc["risk"][0]] + rc["risk"], where="post",
                    label=f"{name} (AURC {aurc:.3f})" if aurc is not None else name)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="coverage", ylabel="risk = 1 - accuracy",
           title=f"Risk-coverage ({score})")
    # Beside the axes: matplotlib's "best" spot is searched against every vertex of every step
    # curve (about 1 s a figure of a dozen models on thousands of pairs), and any spot inside
    # hides some model's curve.
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return _png(fig)


def recovered_figure(results: Results) -> bytes:
    """Mean-over-tasks recovered speedup vs budget; the random-order expectation dashed."""
    fig, ax = plt.subplots(figsize=(6, 4))
    random_drawn = False
    for name, res in results.items():
        rec = res["curves"]["recovered"]
        ax.plot(rec["percents"], rec["model_mean"], label=f"{name} ({res.get('recovered_mean', 0):.3f})")
        if not random_drawn:  # the random expectation depends only on the pools: draw once
            ax.plot(rec["percents"], rec["random_mean"], ls="--", c="grey", label="random order (expected)")
            random_drawn = True
    ax.axhline(1.0, c="black", lw=0.8, label="perfect ranking (1.0)")
    ax.axhline(0.8, c="grey", lw=0.6, ls=":", label="within 20%")
    ax.set(xlabel="measurement budget (% of pool)", ylabel="speedup recovered", ylim=(0, 1.05),
           title="Speedup recovered vs budget")
    ax.legend(fontsize=8, loc="lower right")
    return _png(fig)
