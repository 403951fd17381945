"""One self-contained HTML page per evaluation: metric tables and figures (base64 PNGs).

`write_report` also writes the PNGs beside index.html, so they can be logged as artifacts.
"""

from __future__ import annotations

import base64
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

from pipelines.evaluation import figures
from pipelines.evaluation.forecaster_table import run_fields

log = logging.getLogger(__name__)

HEADLINE = (
    ("n", "forecasts"), ("parse_rate", "parse rate"), ("brier", "Brier"), ("crps", "CRPS"),
    ("nll", "NLL"), ("accuracy", "accuracy"), ("off_by_one", "off-by-one"), ("ece", "ECE"),
    ("aurc", "AURC"), ("selective_risk_at_50", "risk@50%"), ("recovered_mean", "recovered (1-50%)"),
    ("recovered_at_10", "recovered@10%"), ("within_20", "within 20%"),
    ("recovered_random_mean", "random order"),
)
DISCOVERY = (("n", "pairs"), ("base_rate", "base rate"), ("precision", "precision"),
             ("recall", "recall"), ("f1", "F1"), ("pr_auc", "PR-AUC"))

_TEMPLATE = jinja2.Template(
    """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{ title }}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th:first-child,td:first-child{text-align:left}
.ci{color:#777;font-size:11px}
img{max-width:100%;margin:0.5em}
</style></head><body>
<h1>{{ title }}</h1>
{% if pages %}<nav>Splits: {% for label, href in pages %}{% if href %}<a href="{{ href }}">{{ label }}</a>{% else %}<b>{{ label }}</b>{% endif %}{% if not loop.last %} | {% endif %}{% endfor %}</nav>{% endif %}
{% if empty %}<ul>{% for split, why in empty.items() %}<li>{{ split }}: empty ({{ why }})</li>{% endfor %}</ul>{% endif %}
<p class="ci">This report: {{ path }}{% if made_by %}; made by Dagster run <a href="{{ made_by[1] }}">{{ made_by[0] }}</a>{% endif %}</p>
<h2>Headline metrics</h2>
<table><tr><th>model</th>{% for _, label in headline %}<th>{{ label }}</th>{% endfor %}{% if runs %}<th>MLflow run</th><th>Dagster run</th>{% endif %}</tr>
{% for name, res in results.items() %}<tr><td>{{ name }}</td>
{% for key, _ in headline %}<td>{{ fmt(res.get(key)) }}{% if res.get("intervals") and res["intervals"].get(key) %}<br><span class="ci">[{{ fmt(res["intervals"][key][0]) }}, {{ fmt(res["intervals"][key][1]) }}]</span>{% endif %}</td>{% endfor %}{% if runs %}{% set r = runs.get(name) %}<td>{% if r and r.run_id %}<a href="{{ r.mlflow_url }}">{{ r.run_id }}</a>{% else %}–{% endif %}</td><td>{% if r and r.dagster_run_id %}<a href="{{ r.dagster_url }}">{{ r.dagster_run_id[:8] }}</a>{% else %}–{% endif %}</td>{% endif %}</tr>
{% endfor %}</table>
<p class="ci">Brackets: {{ level }} bootstrap intervals over pairs.{% for note in notes %} {{ note }}{% endfor %}</p>
<h2>Figures</h2>
{% for alt, data in images %}<img alt="{{ alt }}" src="data:image/png;base64,{{ data }}">{% endfor %}
{% for name, res in results.items() %}
<h2>{{ name }}: per task</h2>
<table><tr><th>task</th>{% for _, label in headline %}<th>{{ label }}</th>{% endfor %}</tr>
{% for task, row in res.get("per_task", {}).items() %}<tr><td>{{ task }}</td>{% for key, _ in headline %}<td>{{ fmt(row.get(key)) }}</td>{% endfor %}</tr>
{% endfor %}</table>
{% if res.get("discovery") %}<h3>Discovery moments (parent &rarr; child)</h3>
<table><tr><th>task</th>{% for _, label in discovery %}<th>{{ label }}</th>{% endfor %}</tr>
<tr><td><b>all</b></td>{% for key, _ in discovery %}<td>{{ fmt(res["discovery"].get(key)) }}</td>{% endfor %}</tr>
{% for task, row in res["discovery"].get("per_task", {}).items() %}<tr><td>{{ task }}</td>{% for key, _ in discovery %}<td>{{ fmt(row.get(key)) }}</td>{% endfor %}</tr>
{% endfor %}</table>{% endif %}
{% endfor %}
<h2>Conventions</h2><ul>{% for c in conventions %}<li>{{ c }}</li>{% endfor %}</ul>
</body></html>
""",
    autoescape=True,
)


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


ORACLE = "baseline:oracle"


def _outside(results_by_model: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """"model: label" of every headline value the page shows outside its own bracket."""
    out = []
    for name, res in results_by_model.items():
        for key, label in HEADLINE:
            v, ci = res.get(key), (res.get("intervals") or {}).get(key)
            if isinstance(v, (int, float)) and ci and None not in ci[:2] and not math.isnan(v) \
                    and not ci[0] - 5e-5 <= v <= ci[1] + 5e-5:  # the page rounds to 4 decimals
                out.append(f"{name}: {label}")
    return out


def footnotes(results_by_model: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The notes under the headline table, from the numbers in it (never a constant).

    >>> footnotes({"baseline:oracle": {"recovered_mean": 0.982, "brier": 0.0}})
    ['Oracle (knows the true bin) recovered = 0.982: below 1 where kernels of one bin tie, ranked in random order within the bin.']
    >>> footnotes({"baseline:oracle|held_out_task": {"recovered_mean": 1.0}})
    ['Oracle (knows the true bin) recovered = 1.000.']
    >>> footnotes({"a": {"n": 788}, "b": {"n": 750}})[0]
    'Rows score different pair sets (forecasts: 750 for b; 788 for a): each forecaster is scored on the pairs it forecast, so compare rows of equal n (promotion compares versions on the pairs all of them forecast).'
    """
    notes = []
    oracle = next((r for name, r in results_by_model.items() if name.split("|")[0] == ORACLE), {})
    rec = oracle.get("recovered_mean")
    if isinstance(rec, (int, float)) and not math.isnan(rec):
        why = ": below 1 where kernels of one bin tie, ranked in random order within the bin" if rec < 1 - 5e-4 else ""
        notes.append(f"Oracle (knows the true bin) recovered = {rec:.3f}{why}.")
    by_n: dict[int, list[str]] = {}
    for name, res in results_by_model.items():
        if isinstance(res.get("n"), int):
            by_n.setdefault(res["n"], []).append(name)
    if len(by_n) > 1:
        groups = "; ".join(f"{n} for {', '.join(names)}" for n, names in sorted(by_n.items()))
        notes.append(f"Rows score different pair sets (forecasts: {groups}): each forecaster is scored on the pairs "
                     "it forecast, so compare rows of equal n (promotion compares versions on the pairs all of them "
                     "forecast).")
    outside = _outside(results_by_model)
    if outside:
        notes.append(f"Outside their bracket: {', '.join(outside)}. A percentile bootstrap interval of a metric "
                     "averaged over ranking pools need not contain the full-sample value when pools are small.")
    return notes


def write_report(
    results_by_model: Mapping[str, Mapping[str, Any]], out_dir: str | Path, title: str = "kernelcast evaluation",
    *, pages: list[tuple[str, str]] | None = None, runs: Mapping[str, Any] | None = None,
    empty: Mapping[str, str] | None = None, made_by: tuple[str, str] | None = None,
) -> Path:
    """Write index.html (and the figure PNGs) for several forecasters' results.

    Args:
        results_by_model: {model name: `evaluate_forecasts` result}.
        out_dir: created if missing.
        title: page title.
        pages: (label, relative href) of every page of the report, this one with href "".
        runs: model name -> its run links (`forecaster_table.run_fields`: MLflow run and URL, the
            Dagster run that made it and its URL).
        empty: split -> why it has no page.
        made_by: (Dagster run id, its URL) of the run that wrote the report.
    Returns:
        Path of index.html.
    """
    if not results_by_model:
        raise ValueError("write_report needs at least one model's results")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pngs = {
        "reliability.png": figures.reliability_figure(results_by_model),
        "risk_coverage.png": figures.risk_coverage_figure(results_by_model),
        "recovered.png": figures.recovered_figure(results_by_model),
    }
    for name, data in pngs.items():
        (out / name).write_bytes(data)
    first = next(iter(results_by_model.values()))
    level = first.get("interval_level")
    html = _TEMPLATE.render(
        title=title,
        results=results_by_model,
        headline=HEADLINE,
        discovery=DISCOVERY,
        fmt=_fmt,
        level=f"{level:.0%}" if isinstance(level, (int, float)) else "",
        images=[(n.removesuffix(".png"), base64.b64encode(d).decode("ascii")) for n, d in pngs.items()],
        conventions=first.get("conventions", []),
        notes=footnotes(results_by_model),
        pages=pages or [],
        runs={name: run_fields(v) for name, v in (runs or {}).items()},
        made_by=made_by,
        empty=dict(empty or {}),
        path=str((out / "index.html").resolve()),
    )
    path = out / "index.html"
    path.write_text(html, encoding="utf-8")
    log.info("evaluation report written to %s", path)
    return path
